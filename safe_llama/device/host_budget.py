"""The host side of a plan's limits: free RAM, a cgroup's memory limit (what it charges and cannot reclaim),
RLIMIT_AS, and the user's declared host memory, each kept with its own accounting and its source.

Owns that budget from probed values (probe_host reads them); must not probe nor plan."""

from __future__ import annotations

from dataclasses import dataclass

from safe_llama.device.limits import NOTHING_DECLARED, DeclaredLimits, Sourced
from safe_llama.device.probe_host import HostMemory, cgroup_headroom
from safe_llama.units import human

HOST_LIMIT_KINDS = ("ram", "cgroup", "address space")


@dataclass(frozen=True)
class HostLimit:
    """One limit on the host side, and what it counts: "ram" (free RAM: what must stay resident),
    "cgroup" (what the kernel charges and cannot reclaim: anonymous and locked memory, not the page cache of
    mapped weights), "address space" (RLIMIT_AS: every mapping, the whole model file and untouched reserves)."""

    kind: str  # one of HOST_LIMIT_KINDS
    budget: Sourced[int]


@dataclass(frozen=True)
class HostBudget:
    """What the host may give a launch: each limit that applies and the smallest of them."""

    total: Sourced[int]
    available: Sourced[int]
    cgroup_max: Sourced[int] | None  # None = no cgroup limit
    cgroup_current: Sourced[int] | None
    rlimit_as: Sourced[int] | None  # None = unlimited
    budget_bytes: Sourced[int]  # the smallest applicable figure; detail names it
    note: str
    limits: tuple[HostLimit, ...] = ()  # every limit that applies, each checked with its own accounting
    cgroup_dir: str | None = None  # the cgroup folder whose limit applies (launches in it share its headroom)


def host_budget(host: HostMemory, declared: DeclaredLimits = NOTHING_DECLARED) -> HostBudget:
    """The memory a launched llama.cpp may use: available RAM, the cgroup's headroom and RLIMIT_AS, each a
    limit of its own kind (they count different things), the smallest shown as the budget; or the budget
    the user declared. Page cache the cgroup may reclaim counts as free, as the kernel drops it before an
    OOM kill (the working set, as kubelet counts it). Swap is not counted: a KV cache paged out to swap is
    read back for every token."""
    total = Sourced(host.total_bytes, "probed", f"{host.ram_source}: physical RAM (MemTotal)")
    available = Sourced(host.available_bytes, "probed", f"{host.ram_source}: MemAvailable")
    cgroup = host.cgroup
    cg_max = cg_cur = None
    limits = [HostLimit("ram", available)]
    if cgroup is not None:
        label = f"cgroup v{cgroup.version}"
        if cgroup.max_bytes is not None:
            file = "memory.max" if cgroup.version == 2 else "memory.limit_in_bytes"
            cg_max = Sourced(cgroup.max_bytes, "probed", f"{label} {file} in {cgroup.limit_dir}")
        if cgroup.current_bytes is not None:
            file = "memory.current" if cgroup.version == 2 else "memory.usage_in_bytes"
            cg_cur = Sourced(cgroup.current_bytes, "probed", f"{label} {file} in {cgroup.current_dir}")
        headroom = cgroup_headroom(cgroup)
        if headroom is not None:
            room, file, reclaimable = headroom
            limits.append(
                HostLimit(
                    "cgroup",
                    Sourced(
                        room,
                        "probed",
                        f"{label} headroom: {file} - (usage - {human(reclaimable)} reclaimable page cache)",
                    ),
                )
            )
    rlimit = None
    if host.rlimit_as is not None:
        rlimit = Sourced(host.rlimit_as, "probed", "RLIMIT_AS (ulimit -v) of the whole llama.cpp process")
        limits.append(HostLimit("address space", rlimit))
    if declared.host_memory_bytes is not None:
        budget = Sourced(declared.host_memory_bytes, "declared", declared.origin("host_memory", "--host-memory"))
        limits = [HostLimit("ram", budget)]
    else:
        budget = min((limit.budget for limit in limits), key=lambda s: s.value)
    return HostBudget(
        total=total,
        available=available,
        cgroup_max=cg_max,
        cgroup_current=cg_cur,
        rlimit_as=rlimit,
        budget_bytes=budget,
        note=host.cgroup_note,
        limits=tuple(limits),
        cgroup_dir=cgroup.limit_dir if cgroup is not None else None,
    )
