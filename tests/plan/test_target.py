"""plan.target: the target in three parts (probed facts, the policy's values, lessons), the budget they make
together, the KV split rule, what a failed start teaches."""

from __future__ import annotations

import pytest

from safe_llama.device.limits import Sourced
from safe_llama.paths import packaged_configs
from safe_llama.plan.lessons import Lessons
from safe_llama.plan.policy import Policy, load_policy
from safe_llama.plan.target import (
    Probed,
    RemoteDevice,
    Target,
    TargetPolicy,
    atoi,
    kv_splits,
    target_policy,
)

GIB = 1 << 30
MIB = 1 << 20


@pytest.fixture(scope="module")
def policy() -> Policy:
    return load_policy(packaged_configs() / "planner.toml")


def _h200(free: int, listed: bool = False) -> Probed:
    return Probed(
        backend="cuda",
        host_budget=Sourced(64 * GIB, "declared", "t"),
        on_gpu=True,
        device="CUDA0",
        device_memory=Sourced(140 * GIB, "probed", "NVML"),
        device_free=Sourced(free, "probed", "free (NVML)"),
        device_free_listed=listed,
    )


def test_the_three_parts_go_together_and_come_apart(policy: Policy) -> None:
    probed = _h200(60 * GIB)
    lessons = Lessons(kv_cap=GIB, compute_extra=5, margin_scale=-1.0, device_cap=10 * GIB)
    target = Target.of(probed, target_policy(policy, probed), lessons)
    assert target.probed == probed
    assert target.lessons == lessons
    assert (target.backend, target.kv_cap, target.kv_f16_copies) == ("cuda", GIB, True)


def test_target_policy_copies_the_policy_for_this_device(policy: Policy) -> None:
    cuda = target_policy(policy, _h200(60 * GIB))
    assert cuda.kv_f16_copies and cuda.compute_costs == policy.compute
    assert cuda.device_runtime == policy.device_runtime["cuda"]
    assert cuda.cpu_repack_types == policy.cpu_repack_types
    listed = target_policy(policy, _h200(60 * GIB, listed=True))
    assert listed.device_runtime == policy.device_runtime["cuda"] - policy.device_context["cuda"]
    cpu = target_policy(policy, Probed(backend="cpu", host_budget=Sourced(GIB, "declared", "t")))
    assert not cpu.kv_f16_copies


def test_device_budget_is_free_less_runtime_then_the_lesson() -> None:
    probed = _h200(60 * GIB)
    runtime = TargetPolicy(device_runtime=640 * MIB)
    plain = Target.of(probed, runtime, Lessons())
    assert plain.device_budget is not None
    assert plain.device_budget.value == 60 * GIB - 640 * MIB and plain.device_budget.source == "probed"
    taught = Target.of(probed, runtime, Lessons(device_cap=10 * GIB))
    assert taught.device_budget is not None
    assert (taught.device_budget.value, taught.device_budget.source) == (10 * GIB, "learned")


def test_a_declared_memory_ignores_free_memory() -> None:
    probed = Probed(
        backend="cuda",
        host_budget=Sourced(GIB, "declared", "t"),
        on_gpu=True,
        device_memory=Sourced(100 * GIB, "declared", "--device-memory"),
        device_free=Sourced(GIB, "probed", "NVML"),
    )
    target = Target.of(probed, TargetPolicy(device_runtime=640 * MIB), Lessons())
    assert target.device_budget is not None and target.device_budget.value == 100 * GIB


@pytest.mark.parametrize(
    ("backend", "version", "forced", "splits"),
    [
        pytest.param("openvino", "0.4.1-dev", None, False, id="openvino-old"),
        pytest.param("openvino", "0.6.0-dev", None, True, id="openvino-fixed"),
        pytest.param("openvino", None, None, False, id="openvino-unknown"),
        pytest.param("vulkan", None, None, True, id="vulkan"),
        pytest.param("cuda", None, None, False, id="cuda"),
        pytest.param("vulkan", None, False, False, id="forced-single"),
    ],
)
def test_kv_splits_reads_the_probed_facts(
    policy: Policy, backend: str, version: str | None, forced: bool | None, splits: bool
) -> None:
    probed = Probed(backend=backend, host_budget=Sourced(GIB, "declared", "t"), binary_version=version, kv_split=forced)
    assert kv_splits(probed, policy) is splits


def test_a_learned_max_alloc_only_lowers() -> None:
    probed = Probed(backend="vulkan", host_budget=Sourced(GIB, "declared", "t"), max_alloc=Sourced(GIB, "probed", "x"))
    lower = Target.of(probed, TargetPolicy(), Lessons(learned_max_alloc=512 * MIB))
    assert lower.max_alloc is not None and (lower.max_alloc.value, lower.max_alloc.source) == (512 * MIB, "learned")
    assert lower.lessons == Lessons(learned_max_alloc=512 * MIB)
    assert Target.of(probed, TargetPolicy(), Lessons(learned_max_alloc=2 * GIB)).max_alloc == probed.max_alloc
    assert Target.of(probed, TargetPolicy(), Lessons()).max_alloc == probed.max_alloc


def test_worker_caps_lower_only_the_named_worker() -> None:
    workers = (
        RemoteDevice("RPC0", "10.0.0.1:50052", GIB, Sourced(GIB, "probed", "reports")),
        RemoteDevice("RPC1", "10.0.0.2:50052", GIB, Sourced(GIB, "probed", "reports")),
    )
    probed = Probed(backend="cpu", host_budget=Sourced(GIB, "declared", "t"), remote=workers)
    capped = Target.of(probed, TargetPolicy(), Lessons(worker_caps=(("10.0.0.2:50052", 300 * MIB),)))
    assert capped.remote[0] == workers[0]
    assert (capped.remote[1].memory.value, capped.remote[1].memory.source) == (300 * MIB, "learned")


@pytest.mark.parametrize(
    ("text", "value"),
    [("1", 1), ("  -3x", -3), ("+7", 7), ("yes", 0), ("", 0), ("\t42", 42)],
)
def test_atoi_reads_like_c(text: str, value: int) -> None:
    assert atoi(text) == value
