"""Reading the counters that rise when memory runs out, from files already located (probe_host's
oom_counter_sources finds them: this process's memory cgroup, /proc/vmstat), the members of a cgroup, the
kernel's "Killed process PID" line in /dev/kmsg, and /proc/meminfo's two figures.

Owns that reading only; must stay light (os alone): the early start reads the counters before it forks.
"""

from __future__ import annotations

import os

TYPE_CHECKING = False  # typing.TYPE_CHECKING without importing typing (mypy reads the name)
if TYPE_CHECKING:  # collections.abc costs an import on the early path
    from collections.abc import Sequence


def read_counters(sources: Sequence[tuple[str, str | None]]) -> dict[str, int]:
    """(file, field) -> the counter named "file field" ("file" for a file holding one number); a file or
    field that cannot be read is left out."""
    counters: dict[str, int] = {}
    for path, field in sources:
        try:
            with open(path, encoding="ascii", errors="replace") as f:
                text = f.read().strip()
        except OSError:
            continue
        if field is None:
            if text.isdigit():
                counters[path] = int(text)
            continue
        for line in text.splitlines():
            name, _, value = line.partition(" ")
            if name == field and value.isdigit():
                counters[f"{path} {field}"] = int(value)
                break
    return counters


def parse_meminfo(text: str) -> tuple[int, int] | None:
    """(MemTotal, MemAvailable) in bytes from /proc/meminfo's text; None when either is missing (not Linux,
    or a kernel before 3.14). Here, beside the counters, so the early start reads them without pathlib."""
    fields: dict[str, int] = {}
    for line in text.splitlines():
        name, _, rest = line.partition(":")
        if name in ("MemTotal", "MemAvailable"):
            value = rest.split()
            if len(value) == 2 and value[1] == "kB" and value[0].isdigit():
                fields[name] = int(value[0]) * 1024
    if "MemTotal" in fields and "MemAvailable" in fields:
        return fields["MemTotal"], fields["MemAvailable"]
    return None


KMSG = "/dev/kmsg"
_KMSG_CAP = 16 << 20  # the kernel's ring buffer is far smaller (log_buf_len): a bound, not a size


def kernel_kill_line(pid: int, since: float, kmsg: str = KMSG) -> str | None:
    """The kernel's own "Killed process PID (name)" line for pid, logged at or after `since` (the monotonic
    clock, which the kernel's log timestamps follow), read from /dev/kmsg; None when there is none or the log
    cannot be read (kernel.dmesg_restrict for a normal user). Only the kernel's facility counts: a line a
    program writes to /dev/kmsg is logged as LOG_USER and can never pass for it."""
    try:
        fd = os.open(kmsg, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError:
        return None
    wanted = f"Killed process {pid} ("
    found: str | None = None
    read = 0
    try:
        while read < _KMSG_CAP:
            try:
                record = os.read(fd, 8192)  # one record a read
            except BlockingIOError:
                break
            except BrokenPipeError:  # EPIPE: the ring buffer moved past this record; the next read goes on
                read += 1
                continue
            except OSError:
                break
            if not record:
                break
            read += len(record)
            head, _, text = record.decode("utf-8", "replace").partition(";")
            fields = head.split(",")
            if len(fields) < 3 or not fields[0].isdigit() or not fields[2].isdigit():
                continue
            if int(fields[0]) >> 3 != 0 or int(fields[2]) / 1e6 < since:  # not the kernel's, or too old
                continue
            line = text.split("\n", 1)[0]
            if wanted in line:
                found = line.split(" total-vm:", 1)[0]
    finally:
        os.close(fd)
    return found


def group_members(directory: str) -> set[int] | None:
    """The processes in a cgroup and in every group below it (cgroup.procs); None when one cannot be read."""
    members: set[int] = set()
    for folder, _subfolders, _files in os.walk(directory):
        try:
            with open(os.path.join(folder, "cgroup.procs"), encoding="ascii") as f:
                members.update(int(word) for word in f.read().split())
        except (OSError, ValueError):
            return None
    return members


def kernel_log_readable(kmsg: str = KMSG) -> bool:
    """Whether this process may read the kernel's log (kernel.dmesg_restrict keeps it from a normal user)."""
    try:
        os.close(os.open(kmsg, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC))
    except OSError:
        return False
    return True
