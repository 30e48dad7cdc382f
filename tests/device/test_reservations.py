"""device/reservations.py: what other launches reserved and the figures do not show yet, each counted once;
shares of a budget; the words for both. Plain values."""

from __future__ import annotations

import pytest

from safe_llama.device.host_budget import HostLimit
from safe_llama.device.limits import Sourced
from safe_llama.device.reservations import (
    ARRIVING,
    PLANNED,
    READY,
    Launch,
    Visible,
    device_key,
    host_limits_with,
    others,
    shared_device,
    unseen_device,
    unseen_host,
    visible_of,
)

GIB = 1 << 30
MIB = 1 << 20
UUID = "GPU-12c88ba7-4229-5615-d2f3-4c8f50f61e5b"
GROUP = "/sys/fs/cgroup/memory/pair"


def _launch(pid: int, device: int = 0, host: int = 0, *, key: str = UUID, cgroup: str = GROUP,
            state: str = PLANNED, label: str = "profile chat") -> Launch:  # fmt: skip
    return Launch(pid, 1000 + pid, "server", label, state, key, "CUDA0", device, host, cgroup)


@pytest.mark.parametrize(
    ("reserved", "seen", "unseen"),
    [
        pytest.param(62 * GIB, None, 62 * GIB, id="no-per-process-figure-counts-whole"),
        pytest.param(62 * GIB, 0, 62 * GIB, id="not-allocated-yet"),
        pytest.param(62 * GIB, 20 * GIB, 42 * GIB, id="loading"),
        pytest.param(62 * GIB, 62 * GIB, 0, id="all-visible-in-free"),
        pytest.param(62 * GIB, 63 * GIB, 0, id="more-than-planned-never-negative"),
    ],
)
def test_a_reservation_counts_what_the_figure_does_not_show(reserved: int, seen: int | None, unseen: int) -> None:
    launch = _launch(1, reserved, reserved)
    assert unseen_device(launch, Visible(seen, None)) == unseen
    assert unseen_host(launch, Visible(None, seen)) == unseen


def test_without_a_figure_a_ready_launch_is_all_allocated_and_a_planned_one_none() -> None:
    nothing = Visible(None, None)
    assert unseen_device(_launch(1, 8 * GIB, GIB, state=READY), nothing) == 0
    assert unseen_host(_launch(1, 8 * GIB, GIB, state=READY), nothing) == 0
    assert unseen_device(_launch(1, 8 * GIB, GIB, state=PLANNED), nothing) == 8 * GIB
    assert unseen_device(_launch(1, 8 * GIB, GIB, state=READY), Visible(2 * GIB, None)) == 6 * GIB  # a figure wins


def test_others_counts_each_launch_once_where_it_is() -> None:
    here = _launch(10, 62 * GIB, 300 * MIB)
    other_gpu = _launch(11, 40 * GIB, 100 * MIB, key="GPU-other", cgroup="/sys/fs/cgroup/memory/else")
    arriving = _launch(12, key="", state=ARRIVING)
    visible = {10: Visible(20 * GIB, 100 * MIB), 11: Visible(0, 0)}
    seen = others([here, other_gpu, arriving], visible, device=UUID, cgroup=GROUP)
    assert seen.device is not None and seen.device.value == 42 * GIB  # the other GPU's is not ours
    assert "safe-llama server pid 10 (profile chat)" in seen.device.detail
    assert seen.host_cgroup == 200 * MIB  # only the launches in this group share its headroom
    assert seen.host_ram == 300 * MIB  # RAM is everyone's
    assert seen.arriving == 1 and seen.implied_share() == 0.5


def test_nothing_unseen_gives_no_device_figure_and_no_implied_share() -> None:
    seen = others([_launch(10, 8 * GIB)], {10: Visible(8 * GIB, 0)}, device=UUID, cgroup=GROUP)
    assert seen.device is None and seen.implied_share() is None


def test_held_lines_name_the_device_the_bytes_and_who() -> None:
    seen = others([_launch(1234, int(62.1 * GIB), 0)], {}, device=UUID, cgroup=GROUP)
    assert seen.held_lines() == ("CUDA0: 62.10 GiB held by safe-llama server pid 1234 (profile chat)",)


def test_visible_of_counts_the_children() -> None:
    seen = visible_of({10: (20, 21)}, {10: 30 * MIB, 20: 100 * MIB, 21: 5 * MIB}, {20: 8 * GIB, 99: GIB})
    assert seen == {10: Visible(8 * GIB, 105 * MIB)}  # the launcher's own was charged before its plan
    assert visible_of({10: ()}, {}, None) == {10: Visible(None, None)}  # no child seen: no figure


@pytest.mark.parametrize(
    ("args", "key"),
    [
        pytest.param(("cuda", "CUDA0", UUID, "0000:00:06.0"), UUID, id="uuid-first"),
        pytest.param(("vulkan", "Vulkan0", None, "0000:03:00.0"), "pci 0000:03:00.0", id="pci"),
        pytest.param(("sycl", "SYCL0", None, None), "sycl SYCL0", id="name"),
        pytest.param(("cpu", None, None, None), "", id="host-only"),
    ],
)
def test_device_key(args: tuple[str, str | None, str | None, str | None], key: str) -> None:
    assert device_key(*args) == key


def test_host_limits_less_the_unseen_and_within_the_share() -> None:
    limits = (
        HostLimit("ram", Sourced(100 * GIB, "probed", "MemAvailable")),
        HostLimit("cgroup", Sourced(480 * MIB, "probed", "cgroup v1 headroom")),
    )
    seen = others([_launch(10, 0, 200 * MIB)], {10: Visible(None, 50 * MIB)}, device=UUID, cgroup=GROUP)
    lowered = host_limits_with(limits, seen, None, {"cgroup": 512 * MIB, "ram": 128 * GIB}, "--share")
    assert [limit.budget.value for limit in lowered] == [100 * GIB - 150 * MIB, 330 * MIB]
    assert "less 150.00 MiB other safe-llama launches reserved" in lowered[1].budget.detail
    shared = host_limits_with(limits, seen, 0.5, {"cgroup": 512 * MIB, "ram": 128 * GIB}, "--share")
    assert shared[1].budget == Sourced(256 * MIB, "declared", "share 0.5 of 512.00 MiB (cgroup, --share)")
    assert shared[0].budget.value == 64 * GIB  # the share of the RAM's total binds below what is available
    held = host_limits_with(limits, seen, 0.5, {"cgroup": 512 * MIB}, "--share", own=13 * MIB)
    assert held[1].budget.value == 243 * MIB and held[1].budget.detail.endswith("less 13.00 MiB this launcher holds")
    declared = (HostLimit("ram", Sourced(4 * GIB, "declared", "--host-memory")),)
    assert host_limits_with(declared, seen, None, {}, "--share") == declared  # the user's word


def test_a_device_share_keeps_the_runtime_inside_it() -> None:
    shared = shared_device(140 * GIB, 0.5, 640 * MIB, "2 launches started together")
    assert shared.value == 70 * GIB - 640 * MIB
    assert shared.detail == "share 0.5 of 140.00 GiB (2 launches started together) less 640.00 MiB for its runtime"
