"""device.host_budget: the host's limits (free RAM, the cgroup's headroom, RLIMIT_AS), each with its own
accounting and source, the smallest as the budget, or the budget the user declared. Plain HostMemory in."""

from __future__ import annotations

import pytest

from safe_llama.device.host_budget import HostBudget, host_budget
from safe_llama.device.limits import DeclaredLimits
from safe_llama.device.probe_host import CgroupMemory, HostMemory

GIB = 1 << 30


def host(
    *,
    total: int = 32 * GIB,
    available: int = 20 * GIB,
    cgroup: CgroupMemory | None = None,
    rlimit: int | None = None,
) -> HostMemory:
    return HostMemory(total_bytes=total, available_bytes=available, cgroup=cgroup, cgroup_note="test", rlimit_as=rlimit)


def cgroup(limit: int | None, used: int, inactive: int | None = None) -> CgroupMemory:
    return CgroupMemory(
        version=2,
        limit_dir="/sys/fs/cgroup/x" if limit else None,
        max_bytes=limit,
        current_bytes=used,
        inactive_file_bytes=inactive,
        current_dir="/sys/fs/cgroup/x",
    )


@pytest.mark.parametrize(
    ("memory", "declared", "budget", "source", "detail"),
    [
        pytest.param(host(), DeclaredLimits(), 20 * GIB, "probed", "MemAvailable", id="available"),
        pytest.param(
            host(cgroup=cgroup(8 * GIB, 3 * GIB)),
            DeclaredLimits(),
            5 * GIB,
            "probed",
            "cgroup v2",
            id="cgroup-headroom",
        ),
        pytest.param(
            host(cgroup=cgroup(8 * GIB, 3 * GIB, inactive=GIB)),
            DeclaredLimits(),
            6 * GIB,
            "probed",
            "reclaimable",
            id="page-cache-is-reclaimable",
        ),
        pytest.param(
            host(cgroup=cgroup(None, 3 * GIB)),
            DeclaredLimits(),
            20 * GIB,
            "probed",
            "MemAvailable",
            id="cgroup-unlimited",
        ),
        pytest.param(host(rlimit=3 * GIB), DeclaredLimits(), 3 * GIB, "probed", "RLIMIT_AS", id="rlimit"),
        pytest.param(
            host(rlimit=3 * GIB),
            DeclaredLimits(host_memory_bytes=64 * GIB),
            64 * GIB,
            "declared",
            "--host-memory",
            id="declared",
        ),
    ],
)
def test_host_budget(memory: HostMemory, declared: DeclaredLimits, budget: int, source: str, detail: str) -> None:
    result: HostBudget = host_budget(memory, declared)
    assert result.budget_bytes.value == budget
    assert result.budget_bytes.source == source
    assert detail in result.budget_bytes.detail
    assert result.total.value == memory.total_bytes


def test_every_applicable_limit_is_kept_with_its_kind() -> None:
    result = host_budget(host(cgroup=cgroup(8 * GIB, 3 * GIB), rlimit=40 * GIB))
    assert [(limit.kind, limit.budget.value) for limit in result.limits] == [
        ("ram", 20 * GIB),
        ("cgroup", 5 * GIB),
        ("address space", 40 * GIB),
    ]
    assert result.budget_bytes == result.limits[1].budget  # the smallest
    assert result.rlimit_as is not None and result.rlimit_as.value == 40 * GIB


def test_a_larger_rlimit_leaves_free_ram_the_budget() -> None:
    result = host_budget(host(rlimit=64 * GIB))
    assert result.budget_bytes.value == 20 * GIB and "MemAvailable" in result.budget_bytes.detail


def test_probed_figures_name_their_files() -> None:
    memory = HostMemory(
        total_bytes=32 * GIB, available_bytes=20 * GIB, cgroup=cgroup(8 * GIB, 3 * GIB), cgroup_note="from /proc",
        rlimit_as=None, ram_source="psutil",
    )  # fmt: skip
    result = host_budget(memory)
    assert result.total.detail == "psutil: physical RAM (MemTotal)"
    assert result.available.detail == "psutil: MemAvailable"
    assert result.cgroup_max is not None and result.cgroup_max.detail == "cgroup v2 memory.max in /sys/fs/cgroup/x"
    assert result.cgroup_current is not None and result.cgroup_current.value == 3 * GIB
    assert result.cgroup_current.detail == "cgroup v2 memory.current in /sys/fs/cgroup/x"
    assert result.note == "from /proc" and result.rlimit_as is None


def test_cgroup_v1_names_its_own_files() -> None:
    v1 = CgroupMemory(version=1, limit_dir="/c", max_bytes=8 * GIB, current_bytes=GIB, inactive_file_bytes=None,
                      current_dir="/c")  # fmt: skip
    result = host_budget(host(cgroup=v1))
    assert result.cgroup_max is not None and "memory.limit_in_bytes" in result.cgroup_max.detail
    assert result.cgroup_current is not None and "memory.usage_in_bytes" in result.cgroup_current.detail
    assert "cgroup v1 headroom: memory.limit_in_bytes" in result.budget_bytes.detail
    assert result.budget_bytes.value == 7 * GIB


def test_memory_high_below_max_is_the_ceiling() -> None:
    high = CgroupMemory(version=2, limit_dir="/c", max_bytes=8 * GIB, current_bytes=GIB, inactive_file_bytes=0,
                        current_dir="/c", high_bytes=4 * GIB)  # fmt: skip
    result = host_budget(host(cgroup=high))
    assert result.budget_bytes.value == 3 * GIB and "memory.high" in result.budget_bytes.detail


def test_only_memory_high_is_a_limit_too() -> None:
    high = CgroupMemory(version=2, limit_dir=None, max_bytes=None, current_bytes=GIB, inactive_file_bytes=0,
                        current_dir="/c", high_bytes=4 * GIB)  # fmt: skip
    result = host_budget(host(cgroup=high))
    assert result.cgroup_max is None
    assert [limit.kind for limit in result.limits] == ["ram", "cgroup"] and result.budget_bytes.value == 3 * GIB


def test_headroom_is_never_negative() -> None:
    result = host_budget(host(cgroup=cgroup(2 * GIB, 3 * GIB)))
    assert result.budget_bytes.value == 0


def test_reclaimable_page_cache_counts_only_up_to_the_usage() -> None:
    result = host_budget(host(cgroup=cgroup(8 * GIB, GIB, inactive=4 * GIB)))
    assert result.budget_bytes.value == 8 * GIB  # not 11 GiB: the cache is part of the usage


def test_unknown_usage_counts_as_none() -> None:
    result = host_budget(host(cgroup=CgroupMemory(2, "/c", 8 * GIB, None, None, "/c")))
    assert result.budget_bytes.value == 8 * GIB and result.cgroup_current is None


def test_a_declared_budget_is_the_only_limit() -> None:
    declared = DeclaredLimits(host_memory_bytes=GIB, origins=(("host_memory", "SAFE_LLAMA_HOST_MEMORY"),))
    result = host_budget(host(cgroup=cgroup(8 * GIB, 3 * GIB), rlimit=3 * GIB), declared)
    assert [(limit.kind, limit.budget.value) for limit in result.limits] == [("ram", GIB)]
    assert (result.budget_bytes.source, result.budget_bytes.detail) == ("declared", "SAFE_LLAMA_HOST_MEMORY")
    assert result.rlimit_as is not None  # the probed figures are still reported
