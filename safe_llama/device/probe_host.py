"""Host memory and the limits this process really runs under: RAM (/proc/meminfo, else psutil), cgroup memory,
RLIMIT_AS.

Owns the only psutil import and the reading of /proc/self/cgroup and the cgroup filesystem (both roots
are parameters, so tests pass a temporary tree). Must not decide a budget: target_device combines these.
"""

from __future__ import annotations

import resource
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from safe_llama.device.oom_counters import parse_meminfo, read_counters

# cgroup v1 says "no limit" with PAGE_COUNTER_MAX pages (9223372036854771712 on 4 KiB pages).
_V1_UNLIMITED = 1 << 62


@dataclass(frozen=True)
class CgroupMemory:
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


def oom_counter_sources(
    *,
    proc_cgroup: Path = Path("/proc/self/cgroup"),
    cgroup_root: Path = Path("/sys/fs/cgroup"),
    vmstat: Path = Path("/proc/vmstat"),
) -> list[tuple[str, str | None]]:
    """Where the counters that rise when memory runs out are, as (file, field) for oom_counters.read_counters:
    this process's cgroup and each parent (a parent's limit binds its children) and the whole machine.

    cgroup v2 memory.events oom_kill; v1 memory.oom_control oom_kill and memory.failcnt (the limit was hit);
    /proc/vmstat oom_kill (the kernel's OOM killer, no cgroup involved). The group's own first: the evidence
    named is the first counter that rose, and the machine-wide one rises for any group's kill.
    """
    sources: list[tuple[str, str | None]] = []
    text = _read(proc_cgroup) or ""
    entries = [line.split(":", 2) for line in text.splitlines() if line.count(":") >= 2]
    places: list[tuple[Path, str, tuple[tuple[str, str | None], ...]]] = []
    v2_path = next((path for hid, controllers, path in entries if hid == "0" and controllers == ""), None)
    if v2_path is not None:
        for base in (cgroup_root, cgroup_root / "unified"):
            if (base / "cgroup.controllers").is_file():
                places.append((base, v2_path, (("memory.events", "oom_kill"),)))
    v1_path = next((path for _, controllers, path in entries if "memory" in controllers.split(",")), None)
    if v1_path is not None:
        places.append((cgroup_root / "memory", v1_path, (("memory.oom_control", "oom_kill"), ("memory.failcnt", None))))
    for base, path, files in places:
        directory = _own_dir(base, path)
        while True:
            sources.extend((str(directory / name), field) for name, field in files)
            if directory == base or base not in directory.parents:
                break
            directory = directory.parent
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


def oom_evidence(before: Mapping[str, int], after: Mapping[str, int]) -> str | None:
    """Which counter rose between two oom_counters() readings, as words; None: no sign of memory running out."""
    for name, value in after.items():
        old = before.get(name)
        if old is not None and value > old:
            return f"{name} rose from {old} to {value}"
    return None
