"""llama.cpp's layer split over several devices (RPC workers first), and the balanced split the plan sets."""

from __future__ import annotations

import itertools
import random
from dataclasses import replace

import pytest

from safe_llama.cmdline.memory_flags import Layout
from safe_llama.device.limits import Sourced
from safe_llama.errors import ExitStatus, SafeLlamaError
from safe_llama.model.facts import ModelFacts
from safe_llama.model.header_facts import load_model_facts
from safe_llama.model.kv import KvRequest
from safe_llama.paths import packaged_configs
from safe_llama.plan.memory import memory_by_place
from safe_llama.plan.planner import plan
from safe_llama.plan.policy import load_policy
from safe_llama.plan.split import balanced_split, device_names, free_split, layer_places
from safe_llama.plan.target import RemoteDevice, Target

MIB = 1 << 20


def _target(**kw: object) -> Target:
    remote = tuple(
        RemoteDevice(f"RPC{i}", f"127.0.0.1:{5000 + i}", 24000 * MIB, Sourced(mib * MIB, "declared", "test"))
        for i, mib in enumerate((400, 200))
    )
    base = Target(backend="cpu", host_budget=Sourced(64 << 30, "declared", "test"), remote=remote)
    return replace(base, **kw)  # type: ignore[arg-type]


def test_layer_places_are_llama_cpps() -> None:
    """Checked against the real llama-server over two ggml-rpc-servers (6-layer model, -ngl 99): without -ts
    (equal free memory) 112.02 MiB = layers 0-3 on the first, 56.65 MiB = layers 4-5 and the output on the
    second; at -ts 3,1, 168.02 MiB = all six layers on the first and 0.64 MiB = the output on the second."""
    even = layer_places(6, 7, ["RPC0", "RPC1"], [24105.0, 24105.0])
    assert even == ["RPC0"] * 4 + ["RPC1"] * 3
    assert layer_places(6, 7, ["RPC0", "RPC1"], [3.0, 1.0]) == ["RPC0"] * 6 + ["RPC1"]
    # whole-layer counts as -ts land exactly: 5 slots, 4 slots, 4 slots
    assert layer_places(12, 13, ["A", "B", "C"], [5.0, 4.0, 4.0]) == ["A"] * 5 + ["B"] * 4 + ["C"] * 4
    # -ngl 1 offloads the output layer only, -ngl 3 the output and the last two layers
    assert layer_places(6, 1, ["RPC0"], []) == ["host"] * 6 + ["RPC0"]
    assert layer_places(6, 3, ["RPC0"], []) == ["host"] * 4 + ["RPC0"] * 3


def test_device_names_put_rpc_workers_first() -> None:
    assert device_names(_target()) == ["RPC0", "RPC1"]
    cuda = _target(on_gpu=True, device="CUDA0", backend="cuda")
    assert device_names(cuda) == ["RPC0", "RPC1", "CUDA0"]
    assert device_names(cuda, split_mode="none", main_gpu=2) == ["CUDA0"]
    assert device_names(cuda, given=("CUDA0",)) == ["CUDA0"]
    assert device_names(_target(remote=())) == []


def test_free_split_is_what_the_workers_report() -> None:
    target = _target()
    assert free_split(target, ["RPC0", "RPC1"]) == (24000.0 * MIB, 24000.0 * MIB)
    assert free_split(replace(target, on_gpu=True, device="CUDA0"), ["RPC0", "RPC1", "CUDA0"]) == ()


def _slack(slots: list[int], room: list[int], counts: tuple[int, ...]) -> float:
    at, worst = 0, 1.0
    for space, n in zip(room, counts, strict=True):
        load = sum(slots[at : at + n])
        at += n
        worst = min(worst, (space - load) / space)
    return worst


def test_balanced_split_leaves_every_device_the_best_equal_share() -> None:
    """Against every split there is: the one chosen keeps the largest equal share free on every device, or,
    when none fits, is over by the least equal share."""
    rng = random.Random(7)
    for _ in range(300):
        slots = [rng.randint(1, 50) for _ in range(rng.randint(2, 12))]
        room = [rng.randint(20, 300) for _ in range(rng.randint(2, 3))]
        got = balanced_split(slots, room)
        splits = [c for c in itertools.product(range(len(slots) + 1), repeat=len(room)) if sum(c) == len(slots)]
        best = max(_slack(slots, room, c) for c in splits)
        assert got is not None and sum(got) == len(slots)
        assert _slack(slots, room, got) == pytest.approx(best, abs=0.02)
        assert (_slack(slots, room, got) >= 0) == (best >= 0)
    assert balanced_split([10, 10], [0, -5]) is None


@pytest.fixture(scope="module")
def spread_facts(tmp_path_factory: pytest.TempPathFactory) -> ModelFacts:
    """12 layers of 28 MiB (as the RPC tests' model), 2 KiB of f16 KV per layer per cell."""
    from tests.tiny_gguf import write_tiny_gguf

    path = write_tiny_gguf(
        tmp_path_factory.mktemp("split") / "spread.gguf", n_layer=12, n_head=8, n_head_kv=8, head_dim=64,
        n_ff=4096, n_ctx_train=65536, sparse=True,
    )  # fmt: skip
    return load_model_facts(path)


def _workers(*mib: int) -> Target:
    policy = load_policy(packaged_configs() / "planner.toml")
    remote = tuple(
        RemoteDevice(f"RPC{i}", f"10.0.0.{i + 2}:50052", 24000 * MIB, Sourced(m * MIB, "declared", "test"))
        for i, m in enumerate(mib)
    )
    return Target(
        backend="cpu", host_budget=Sourced(64 << 30, "declared", "test"), remote=remote,
        worker_overhead=policy.rpc_worker_overhead, pipeline_copies=policy.pipeline_copies,
    )  # fmt: skip


def test_the_plan_sets_a_split_that_fits_every_worker(spread_facts: ModelFacts) -> None:
    facts, policy = spread_facts, load_policy(packaged_configs() / "planner.toml")
    target = _workers(500, 400, 170)
    decided = plan(facts, KvRequest(tool="server", n_ctx=12288), target, policy)
    split = decided.argv_changes["--tensor-split"]
    assert isinstance(split, str) and [int(x) for x in split.split(",")] == [6, 5, 2]
    assert decided.steps[0].name == "split" and "10.0.0.4:50052 (170.00 MiB declared)" in decided.steps[0].reason
    assert "--ctx-size" not in decided.argv_changes  # 12288 fits as asked once split so
    places = memory_by_place(facts, decided.settings, target)
    for r in target.remote:
        assert sum(places[r.name].values()) <= r.memory.value
    # llama.cpp's own split (by the 24000 MiB each reports free) puts 3 layers and the output on the smallest
    even = memory_by_place(facts, replace(decided.settings, layout=Layout()), target)
    assert sum(even["RPC2"].values()) > 170 * MIB


def test_the_users_split_is_kept_and_checked_per_worker(spread_facts: ModelFacts) -> None:
    facts, policy = spread_facts, load_policy(packaged_configs() / "planner.toml")
    target = _workers(500, 400, 170)
    layout = Layout(tensor_split=(1.0, 1.0, 1.0))
    decided = plan(facts, KvRequest(tool="server", n_ctx=16384), target, policy, layout=layout)
    assert "--tensor-split" not in decided.argv_changes
    ctx = decided.steps[0]
    assert ctx.name == "ctx" and ctx.reason.startswith("RPC2 (10.0.0.4:50052)")


def test_nothing_fits_names_the_worker(spread_facts: ModelFacts) -> None:
    facts, policy = spread_facts, load_policy(packaged_configs() / "planner.toml")
    with pytest.raises(SafeLlamaError) as err:
        plan(facts, KvRequest(tool="server", n_ctx=4096), _workers(150, 150), policy)
    assert err.value.status == ExitStatus.NOTHING_FITS and "(10.0.0." in err.value.message
