"""Several safe-llamas on one H200 (issue 35), replayed against what bare llama-server did there
(tests/fixtures/nvidia-h200-cuda/layouts/together-n{2,3}.json: the largest -c at which 2 or 3 servers with the
same arguments stay up together) and against NVML's per-process figure through the fake libnvidia-ml (this
machine has no NVIDIA GPU): shares and launches that start together plan at most what started together, and
within 3-4% of it; a launch beside running ones counts their reservations once. The run of
benchmarks/bench_share_gpu.py, once recorded (share-gpu.json), is replayed plan for plan."""

from __future__ import annotations

import json
import os
from dataclasses import replace
from pathlib import Path

import pytest

from safe_llama.device.probe_free import read_nvml
from safe_llama.device.reservations import PLANNED, Launch, Visible, device_key, others, visible_of
from safe_llama.paths import packaged_configs
from safe_llama.plan.policy import Policy, load_policy
from safe_llama.plan.target import Target
from tests import FIXTURES
from tests.fakes.fake_cuda_llama import build_nvml
from tests.plan.test_shared_gpu_replay import _h200, _plan
from tests.tiny_gguf import write_tiny_gguf

LAYOUTS = FIXTURES / "nvidia-h200-cuda" / "layouts"
RUN = FIXTURES / "nvidia-h200-cuda" / "share" / "share-gpu.json"  # benchmarks/bench_share_gpu.py there
IDLE_FREE = 150_109_880_320  # NVML's free figure of the idle H200 (shared-gpu/nvml-idle.json)
UUID = "GPU-12c88ba7-4229-5615-d2f3-4c8f50f61e5b"
ARGS = ["-c", "2000000", "-ngl", "99"]


@pytest.fixture(scope="module")
def big(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_tiny_gguf(tmp_path_factory.mktemp("share") / "big.gguf", n_layer=8, n_head=16, n_head_kv=16,
                           head_dim=256, n_ff=64, n_ctx_train=2_000_000, sparse=True)  # fmt: skip


@pytest.fixture(scope="module")
def policy() -> Policy:
    return load_policy(packaged_configs() / "planner.toml")


def _largest(n: int) -> int:
    return int(json.loads((LAYOUTS / f"together-n{n}.json").read_text())["largest"])


def _ctx_and_bytes(big: Path, target: Target, policy: Policy) -> tuple[int, int]:
    """The plan's context and what it reserves on CUDA0 (its device total with the runtime's part)."""
    _, decided = _plan(big, ARGS, target, policy)
    device = sum(a.bytes for a in decided.allocations if a.buffer == "device total")
    return int(decided.settings.kv.n_ctx or 0), device + target.device_runtime


@pytest.mark.parametrize(("share", "n", "least"), [(0.5, 2, 0.97), (0.33, 3, 0.96)])
def test_a_share_plans_what_that_many_bare_servers_fit_together(
    big: Path, policy: Policy, share: float, n: int, least: float
) -> None:
    # 0.33 of the card is 1% under a third: at 0.968 of three bare servers' largest (--share 0.333 gives 0.978)
    target = replace(_h200(IDLE_FREE, policy), share=share, share_why="--share")
    ctx, _ = _ctx_and_bytes(big, target, policy)
    assert least * _largest(n) <= ctx <= _largest(n)


def test_two_that_start_together_split_and_the_second_fits_beside_the_first(big: Path, policy: Policy) -> None:
    """Two launches at the same moment: the first sees the second arriving and plans half (an implied share of
    0.5); the second plans with the first's reservation (not yet allocated: counted whole)."""
    idle = _h200(IDLE_FREE, policy)
    arriving = others([Launch(2, 1, "server", "model big.gguf", "arriving", "", "", 0, 0, "")], {}, device=UUID,
                      cgroup="")  # fmt: skip
    assert arriving.implied_share() == 0.5
    first_ctx, first_bytes = _ctx_and_bytes(big, replace(idle, share=0.5, share_why="2 launches"), policy)
    entry = Launch(1, 1, "server", "model big.gguf", PLANNED, UUID, "CUDA0", first_bytes, 0, "")
    seen = others([entry], {1: Visible(0, 0)}, device=UUID, cgroup="")
    second_ctx, second_bytes = _ctx_and_bytes(big, replace(idle, device_reserved=seen.device), policy)
    both = _largest(2)
    assert 0.97 * both <= first_ctx <= both and 0.97 * both <= second_ctx <= both
    assert first_bytes + second_bytes <= IDLE_FREE  # together within what was free


def test_a_launch_beside_running_ones_counts_their_reservations_once(
    big: Path, policy: Policy, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The fake NVML reports the two running servers' use per process and a free figure that already lacks it:
    their whole reservations are visible, so nothing more is taken off; without a per-process figure the same
    reservations would count twice (the safe side)."""
    idle = _h200(IDLE_FREE, policy)
    two, each = _ctx_and_bytes(big, replace(idle, share=0.33, share_why="--share"), policy)
    running = [Launch(pid, 1, "server", f"profile m{pid}", PLANNED, UUID, "CUDA0", each, 0, "") for pid in (11, 12)]
    library = build_nvml(tmp_path / "nvml")
    free_mib = (IDLE_FREE - 2 * each) / (1 << 20)
    (tmp_path / "free").write_text(f"{free_mib}\n")
    (tmp_path / "processes").write_text(f"111 {each}\n121 {each}\n4242 1048576\n")
    monkeypatch.setenv("FAKE_FREE_FILE", str(tmp_path / "free"))
    monkeypatch.setenv("FAKE_PROCESSES_FILE", str(tmp_path / "processes"))
    (reading,) = read_nvml(str(library)).readings
    assert reading.processes == ((111, each), (121, each), (4242, 1048576))
    key = device_key("cuda", "CUDA0", reading.uuid, reading.pci_bdf)
    assert key == UUID
    seen = others(running, visible_of({11: (111,), 12: (121,)}, {}, dict(reading.processes or ())), device=key,
                  cgroup="")  # fmt: skip
    assert seen.device is None  # all visible already
    assert seen.held_lines()[0] == f"CUDA0: {each / (1 << 30):.2f} GiB held by safe-llama server pid 11 (profile m11)"
    beside = replace(idle, device_free=replace(idle.device_free, value=reading.free_bytes))  # type: ignore[type-var]
    third, _ = _ctx_and_bytes(big, beside, policy)
    # three bare servers fit at n3 cells each: beside two at `two`, the cells they leave
    room = 3 * _largest(3) - 2 * two
    assert 0.97 * room <= third <= room
    blind = others(running, visible_of({11: (111,), 12: (121,)}, {}, None), device=key, cgroup="")
    assert blind.device is not None and blind.device.value == 2 * each  # no per-process figure: counted again
    monkeypatch.delenv("FAKE_PROCESSES_FILE")
    assert read_nvml(str(library)).readings[0].processes is None


@pytest.mark.skipif(not RUN.is_file(), reason="the H200 run of benchmarks/bench_share_gpu.py is not recorded yet")
def test_the_recorded_h200_run() -> None:
    rows = {str(r.get("case")): r for r in json.loads(RUN.read_text()) if isinstance(r, dict)}
    pair = rows["pair-no-share"]
    assert all(x["ready"] and x["first_spawn"] for x in pair["launches"])
    second = pair["launches"][pair["second"]]
    assert second["n_ctx"] >= 0.97 * pair["largest_beside_first"]
    for case, n in (("share-0.5", 2), ("share-0.33", 3)):
        launches = rows[case]["launches"]
        assert len(launches) == n and all(x["ready"] and x["first_spawn"] for x in launches)
        assert min(x["n_ctx"] for x in launches) >= (0.97 if n == 2 else 0.96) * _largest(n)
    third = rows["third-beside-two"]
    assert third["third"]["ready"] and third["third"]["first_spawn"]
    notes = third["plan"]["notes"]
    # each of the two running launches is listed on the GPU and on the host
    for place in ("CUDA0: ", "host: "):
        assert sum(note.startswith(place) and " held by safe-llama server pid " in note for note in notes) == 2
    assert os.path.basename(str(third["plan"]["model"]["path"])) == "big.gguf"
