"""Reading the counters that rise when memory runs out, from files already located (probe_host's
oom_counter_sources finds them: this process's cgroup and its parents, /proc/vmstat), and /proc/meminfo's
two figures.

Owns that reading only; must stay light (os alone): the early start reads them before it forks.
"""

from __future__ import annotations

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
