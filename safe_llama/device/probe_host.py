"""Host memory and the limits this process really runs under: RAM (/proc/meminfo, else psutil), cgroup memory,
RLIMIT_AS; and whether a child's SIGKILL was the OOM killer's, on evidence that names it (OomWatch).

Owns the only psutil import and the reading of /proc/self/cgroup and the cgroup filesystem (both roots
are parameters, so tests pass a temporary tree). Must not decide a budget: target_device combines these.
"""

from __future__ import annotations

import resource
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from safe_llama.device.oom_counters import (
    KMSG,
    group_members,
    kernel_kill_line,
    kernel_log_readable,
    parse_meminfo,
    read_counters,
)

# cgroup v1 says "no limit" with PAGE_COUNTER_MAX pages (9223372036854771712 on 4 KiB pages).
_V1_UNLIMITED = 1 << 62


@dataclass(frozen=True)
class CgroupMemory:
    """This process's cgroup memory: the tightest limit on the way up, what is used, what is reclaimable."""

    version: int  # 1 or 2
    limit_dir: str | None  # the cgroup directory whose limit is the tightest (None: no limit anywhere)
    max_bytes: int | None  # memory.max / memory.limit_in_bytes; None = unlimited
    current_bytes: int | None  # memory.current / memory.usage_in_bytes of this process's cgroup
    inactive_file_bytes: int | None  # reclaimable page cache the kernel drops before an OOM kill
    current_dir: str
    high_bytes: int | None = None  # v2 memory.high (the tightest on the way up): reclaim and throttling above it
    high_dir: str | None = None
    swap_bytes: int | None = None  # swap the cgroup may use beyond max_bytes (v2 memory.swap.max, v1 memsw - limit)


@dataclass(frozen=True)
class HostMemory:
    """The host's memory: total and available RAM, the cgroup's and the address-space limit."""

    total_bytes: int
    available_bytes: int
    cgroup: CgroupMemory | None
    cgroup_note: str  # where the cgroup numbers came from, or why there are none
    rlimit_as: int | None  # None = unlimited
    ram_source: str = "/proc/meminfo"  # where total and available came from: /proc/meminfo, or psutil


def _read(path: Path) -> str | None:
    try:
        return path.read_text().strip()
    except OSError:
        return None


def _int(text: str | None) -> int | None:
    return int(text) if text is not None and text.isdigit() else None


def _stat_field(path: Path, names: tuple[str, ...]) -> int | None:
    text = _read(path)
    if text is None:
        return None
    fields = dict(line.split(" ", 1) for line in text.splitlines() if " " in line)
    for name in names:
        if name in fields and fields[name].isdigit():
            return int(fields[name])
    return None


def _own_dir(base: Path, cgroup_path: str) -> Path:
    """This process's cgroup directory under a mount. With a cgroup namespace the path is "/" and the
    mount root is our cgroup; without one the host path may not exist inside a container, and the mount
    root is then the closest view of our own cgroup."""
    leaf = base / cgroup_path.lstrip("/")
    return leaf if leaf.is_dir() else base


def _tightest(base: Path, leaf: Path, limit_file: str, unlimited: int | None) -> tuple[int | None, Path | None]:
    """The smallest limit on the way from leaf up to the mount root: a parent's limit binds its children."""
    best: tuple[int | None, Path | None] = (None, None)
    directory = leaf
    while True:
        value = _read(directory / limit_file)
        number = _int(value)
        if number is not None and (unlimited is None or number < unlimited) and (best[0] is None or number < best[0]):
            best = (number, directory)
        if directory == base or base not in directory.parents:
            return best
        directory = directory.parent


def own_anon_bytes(status: Path = Path("/proc/self/status")) -> int | None:
    """This process's anonymous memory (RssAnon): what its cgroup is charged for it and an exec gives back."""
    try:
        for line in status.read_text().splitlines():
            if line.startswith("RssAnon:"):
                words = line.split()
                if len(words) == 3 and words[1].isdigit() and words[2] == "kB":
                    return int(words[1]) * 1024
    except OSError:
        return None
    return None


def read_cgroup_memory(
    *, proc_cgroup: Path = Path("/proc/self/cgroup"), cgroup_root: Path = Path("/sys/fs/cgroup")
) -> tuple[CgroupMemory | None, str]:
    """The cgroup memory limit and usage of this process (v2, else v1's memory controller), with a note."""
    text = _read(proc_cgroup)
    if text is None:
        return None, f"no {proc_cgroup}: not Linux, or /proc is not mounted"
    entries = [line.split(":", 2) for line in text.splitlines() if line.count(":") >= 2]
    v2_path = next((path for hid, controllers, path in entries if hid == "0" and controllers == ""), None)
    if v2_path is not None:
        for base in (cgroup_root, cgroup_root / "unified"):
            if not (base / "cgroup.controllers").is_file():
                continue
            leaf = _own_dir(base, v2_path)
            if not (leaf / "memory.max").is_file() and not (leaf / "memory.current").is_file():
                continue  # the memory controller is not enabled here (a v1/v2 hybrid)
            limit, where = _tightest(base, leaf, "memory.max", None)
            high, high_where = _tightest(base, leaf, "memory.high", None)
            swap, _ = _tightest(base, leaf, "memory.swap.max", None)
            return (
                CgroupMemory(
                    version=2,
                    limit_dir=None if where is None else str(where),
                    max_bytes=limit,
                    current_bytes=_int(_read(leaf / "memory.current")),
                    inactive_file_bytes=_stat_field(leaf / "memory.stat", ("inactive_file",)),
                    current_dir=str(leaf),
                    high_bytes=high,
                    high_dir=None if high_where is None else str(high_where),
                    swap_bytes=swap,
                ),
                f"cgroup v2 at {leaf}",
            )
    v1_path = next((path for _, controllers, path in entries if "memory" in controllers.split(",")), None)
    base = cgroup_root / "memory"
    if v1_path is not None and (base / "memory.limit_in_bytes").is_file():
        leaf = _own_dir(base, v1_path)
        limit, where = _tightest(base, leaf, "memory.limit_in_bytes", _V1_UNLIMITED)
        memsw, _ = _tightest(base, leaf, "memory.memsw.limit_in_bytes", _V1_UNLIMITED)
        return (
            CgroupMemory(
                version=1,
                limit_dir=None if where is None else str(where),
                max_bytes=limit,
                current_bytes=_int(_read(leaf / "memory.usage_in_bytes")),
                inactive_file_bytes=_stat_field(leaf / "memory.stat", ("total_inactive_file", "inactive_file")),
                current_dir=str(leaf),
                swap_bytes=None if memsw is None or limit is None else max(memsw - limit, 0),
            ),
            f"cgroup v1 memory controller at {leaf}",
        )
    return None, f"no cgroup memory controller found under {cgroup_root}"


def cgroup_headroom(cgroup: CgroupMemory) -> tuple[int, str, int] | None:
    """What the cgroup lets its processes add now: its tightest ceiling (the limit, or memory.high below it) less
    what is charged, page cache the kernel may reclaim counted as free (the working set, as kubelet counts it);
    with the ceiling's file and the reclaimable bytes. None: no ceiling."""
    ceilings = []
    if cgroup.max_bytes is not None:
        ceilings.append((cgroup.max_bytes, "memory.max" if cgroup.version == 2 else "memory.limit_in_bytes"))
    if cgroup.high_bytes is not None:  # above memory.high the kernel reclaims and throttles hard
        ceilings.append((cgroup.high_bytes, "memory.high"))
    if not ceilings:
        return None
    ceiling, file = min(ceilings)
    used = cgroup.current_bytes or 0
    reclaimable = min(cgroup.inactive_file_bytes or 0, used)
    return max(ceiling - (used - reclaimable), 0), file, reclaimable


def read_rlimit_as() -> int | None:
    """RLIMIT_AS (`ulimit -v`, systemd LimitAS=) of this process, which a child inherits; None = unlimited."""
    soft, _hard = resource.getrlimit(resource.RLIMIT_AS)
    return None if soft == resource.RLIM_INFINITY else soft


def read_meminfo(meminfo: Path = Path("/proc/meminfo")) -> tuple[int, int] | None:
    """(MemTotal, MemAvailable) in bytes, the two numbers psutil.virtual_memory() reports on Linux, read
    directly: importing psutil costs more than the rest of a cached plan. None: not Linux, or a kernel
    before 3.14 (no MemAvailable), where psutil estimates it."""
    return parse_meminfo(_read(meminfo) or "")


def probe_host(
    *,
    proc_cgroup: Path = Path("/proc/self/cgroup"),
    cgroup_root: Path = Path("/sys/fs/cgroup"),
    meminfo: Path = Path("/proc/meminfo"),
) -> HostMemory:
    memory = read_meminfo(meminfo)
    source = "/proc/meminfo"
    if memory is None:
        import psutil

        virtual = psutil.virtual_memory()
        memory = int(virtual.total), int(virtual.available)
        source = "psutil"
    cgroup, note = read_cgroup_memory(proc_cgroup=proc_cgroup, cgroup_root=cgroup_root)
    return HostMemory(
        total_bytes=memory[0],
        available_bytes=memory[1],
        cgroup=cgroup,
        cgroup_note=note,
        rlimit_as=read_rlimit_as(),
        ram_source=source,
    )


def memory_group(
    *, proc_cgroup: Path = Path("/proc/self/cgroup"), cgroup_root: Path = Path("/sys/fs/cgroup")
) -> tuple[Path, str] | None:
    """This process's memory cgroup and its file that counts the OOM kills of the group's own processes:
    cgroup v2 memory.events (oom_kill), else v1's memory.oom_control (oom_kill, since Linux 4.13). The kernel
    counts a kill in the victim's group whichever limit (the group's, a parent's, the machine's) ran out, so
    the group's counter is the one that can name a child; a parent's rises for its other groups' kills too.
    None: no memory controller."""
    text = _read(proc_cgroup) or ""
    entries = [line.split(":", 2) for line in text.splitlines() if line.count(":") >= 2]
    v2_path = next((path for hid, controllers, path in entries if hid == "0" and controllers == ""), None)
    if v2_path is not None:
        for base in (cgroup_root, cgroup_root / "unified"):
            if (base / "cgroup.controllers").is_file() and (_own_dir(base, v2_path) / "memory.events").is_file():
                return _own_dir(base, v2_path), "memory.events"
    v1_path = next((path for _, controllers, path in entries if "memory" in controllers.split(",")), None)
    if v1_path is not None and (cgroup_root / "memory" / "memory.oom_control").is_file():
        return _own_dir(cgroup_root / "memory", v1_path), "memory.oom_control"
    return None


def oom_counter_sources(
    *,
    proc_cgroup: Path = Path("/proc/self/cgroup"),
    cgroup_root: Path = Path("/sys/fs/cgroup"),
    vmstat: Path = Path("/proc/vmstat"),
) -> list[tuple[str, str | None]]:
    """Where the counters that rise when memory runs out are, as (file, field) for oom_counters.read_counters:
    this process's memory cgroup's oom_kill (memory_group), and /proc/vmstat oom_kill last. Only the group's
    can be evidence (OomWatch); the machine's rises for any process's kill and is only named beside it."""
    sources: list[tuple[str, str | None]] = []
    group = memory_group(proc_cgroup=proc_cgroup, cgroup_root=cgroup_root)
    if group is not None:
        sources.append((str(group[0] / group[1]), "oom_kill"))
    sources.append((str(vmstat), "oom_kill"))
    return sources


def oom_counters(
    *,
    proc_cgroup: Path = Path("/proc/self/cgroup"),
    cgroup_root: Path = Path("/sys/fs/cgroup"),
    vmstat: Path = Path("/proc/vmstat"),
) -> dict[str, int]:
    """The counters that rise when memory runs out (oom_counter_sources), read now. Names are "file field"."""
    return read_counters(oom_counter_sources(proc_cgroup=proc_cgroup, cgroup_root=cgroup_root, vmstat=vmstat))


@dataclass(frozen=True)
class OomWatch:
    """What tells, once a child died of SIGKILL, whether the OOM killer killed it (evidence that names the
    child), read when it started: its pid, the monotonic clock just before its start, the counters then, and
    the name of its memory cgroup's counter when that group held this process and the child alone (the
    launch's own group, as a systemd unit's is: a shared group's counter names none of its members)."""

    pid: int
    since: float
    counters: Mapping[str, int]
    group: str | None = None  # the group's folder, while it is the launch's own
    group_counter: str | None = None  # its counter's name in `counters`

    def evidence(self, after: Mapping[str, int], *, still_own: bool, kernel_line: str | None) -> str | None:
        """The evidence that the OOM killer killed the child, in words; None: nothing names it. still_own: the
        group holds this process alone now; kernel_line: the kernel's "Killed process PID" line for its pid."""
        name = self.group_counter
        if name is not None and still_own:
            old, new = self.counters.get(name), after.get(name)
            if old is not None and new is not None and new > old:
                return f"{name} rose from {old} to {new}"
        if kernel_line is not None:
            return f"the kernel logged: {kernel_line}"
        return None

    def no_evidence(self, after: Mapping[str, int], *, still_own: bool, kernel_log: bool) -> str:
        """Why a SIGKILL is not taken for the OOM killer's, in words: what was looked at, and a host-wide
        counter that rose (a kill somewhere, which names no process)."""
        group = "no cgroup of its own"
        if self.group_counter is not None:
            group = "its cgroup's oom_kill did not rise" if still_own else "its cgroup was shared by then"
        kernel = f"no 'Killed process {self.pid}' in the kernel's log" if kernel_log else "the kernel's log unreadable"
        words = f"no evidence of OOM: {group}, {kernel}"
        for name, new in after.items():
            old = self.counters.get(name)
            if name != self.group_counter and old is not None and new > old:
                words += f"; {name} rose from {old} to {new}, a kill anywhere on the host"
                break
        return words


def watch_oom(
    pid: int,
    since: float,
    counters: Mapping[str, int],
    *,
    members: set[int],
    proc_cgroup: Path = Path("/proc/self/cgroup"),
    cgroup_root: Path = Path("/sys/fs/cgroup"),
) -> OomWatch:
    """The OomWatch of child pid, started at `since` with these counters; members: the processes the
    launch's own group may hold (this process and the child)."""
    group = memory_group(proc_cgroup=proc_cgroup, cgroup_root=cgroup_root)
    if group is None:
        return OomWatch(pid, since, counters)
    folder, events = group
    found = group_members(str(folder))
    if found is None or not found <= members:
        return OomWatch(pid, since, counters)
    return OomWatch(pid, since, counters, str(folder), f"{folder / events} oom_kill")


def judge_kill(
    watch: OomWatch, after: Mapping[str, int], *, alone: set[int], kmsg: str = KMSG
) -> tuple[str | None, str]:
    """(evidence that the OOM killer killed the child, or None; the words when there is none), read now that it
    died of SIGKILL: the group's counter where the group still holds only `alone` (this process), the kernel's
    "Killed process PID" line for its pid (/dev/kmsg, where readable)."""
    members = group_members(watch.group) if watch.group is not None else None
    still_own = members is not None and members <= alone
    kernel_line = kernel_kill_line(watch.pid, watch.since - _CLOCK_SLACK, kmsg)
    found = watch.evidence(after, still_own=still_own, kernel_line=kernel_line)
    if found is not None:
        return found, ""
    return None, watch.no_evidence(after, still_own=still_own, kernel_log=kernel_log_readable(kmsg))


# The kernel's log timestamps and CLOCK_MONOTONIC part by a little (sched_clock against timekeeping).
_CLOCK_SLACK = 1.0
