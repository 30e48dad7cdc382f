"""plan.steps: each ladder step alone, as a function of the state (None where it does not apply), and the walk
that stops once the plan fits."""

from __future__ import annotations

from dataclasses import replace

import pytest

from safe_llama.backends.openvino import STATEFUL_ENV
from safe_llama.cmdline.memory_flags import LlamaSettings, argv_changes
from safe_llama.device.limits import Sourced
from safe_llama.model.facts import ModelFacts
from safe_llama.model.gguf_header import GGUFHeader
from safe_llama.model.header_facts import model_facts
from safe_llama.model.kv import KvRequest, plan_kv
from safe_llama.paths import packaged_configs
from safe_llama.plan.policy import STEPS, Policy, load_policy
from safe_llama.plan.steps import LADDER, Inputs, State, Step, go_stateful, walk, worst
from safe_llama.plan.target import Target
from tests.tiny_gguf import LLAMA_3B

GIB = 1 << 30


@pytest.fixture(scope="module")
def policy() -> Policy:
    return load_policy(packaged_configs() / "planner.toml")


@pytest.fixture(scope="module")
def facts() -> ModelFacts:
    md: dict[str, object] = {"general.architecture": "llama"}
    md.update({k if k.startswith(("general.", "tokenizer.")) else f"llama.{k}": v for k, v in LLAMA_3B.items()})
    return model_facts(GGUFHeader(path="/models/x.gguf", metadata=md))  # type: ignore[arg-type]


def _igpu() -> Target:
    return Target(
        backend="openvino",
        device="OPENVINO0",
        on_gpu=True,
        integrated=True,
        max_alloc=Sourced(4_294_959_104, "profile", "intel-uhd-770"),
        device_memory=Sourced(16 * GIB, "profile", "intel-uhd-770"),
        host_budget=Sourced(32 * GIB, "declared", "test"),
        binary_version="0.4.1-dev",
    )


def _inputs(facts: ModelFacts, target: Target, policy: Policy, tool: str = "completion") -> Inputs:
    request = KvRequest(tool=tool, n_ctx=65536)
    return Inputs(facts, request, target, policy, policy.ctx_floor, plan_kv(facts, request).context.n_ctx)


def _start(inputs: Inputs) -> State:
    return State(LlamaSettings(kv=inputs.request))


def test_every_ladder_name_has_its_step() -> None:
    assert set(LADDER) == set(STEPS)


def test_stateful_moves_the_kv_to_host_ram(facts: ModelFacts, policy: Policy) -> None:
    inputs = _inputs(facts, _igpu(), policy)
    state = _start(inputs)
    after = LADDER["stateful"](inputs, state, worst(inputs.allocations(state.settings)))
    assert after is not None and after.settings.stateful
    assert after.env == {STATEFUL_ENV: "1"} and [s.name for s in after.taken] == ["stateful"]
    assert "n_parallel" not in after.decided  # one sequence already
    assert inputs.fits(after.settings)
    assert LADDER["stateful"](inputs, after, worst(inputs.allocations(after.settings))) is None  # once only


def test_stateful_from_the_users_environment_sets_one_slot_and_no_variable(facts: ModelFacts, policy: Policy) -> None:
    inputs = _inputs(facts, _igpu(), policy, tool="server")
    after = go_stateful(inputs, _start(inputs), f"your {STATEFUL_ENV}=1: KV in host RAM", {})
    assert argv_changes(after.settings, after.decided) == {"--parallel": "1"} and after.env == {}
    assert after.settings.kv.n_parallel == 1 and after.settings.kv.kv_unified is None
    assert after.taken == (Step("stateful", f"your {STATEFUL_ENV}=1: KV in host RAM, one slot (-np 1) as it requires"),)


def test_ctx_takes_the_largest_that_fits_and_keeps_its_reason(facts: ModelFacts, policy: Policy) -> None:
    inputs = _inputs(facts, _igpu(), policy)
    state = _start(inputs)
    after = LADDER["ctx"](inputs, state, worst(inputs.allocations(state.settings)))
    assert after is not None and argv_changes(after.settings, after.decided) == {"--ctx-size": "37376"}
    assert (
        after.ctx_reason.endswith(": -c ")
        and after.taken[0].reason == f"{after.ctx_reason}37376, the largest that fits"
    )


def test_kv_q8_on_openvino_is_skipped_with_a_note(facts: ModelFacts, policy: Policy) -> None:
    inputs = _inputs(facts, _igpu(), policy)
    state = _start(inputs)
    after = LADDER["kv-q8"](inputs, state, worst(inputs.allocations(state.settings)))
    assert after is not None and after.taken == () and after.settings == state.settings
    assert after.notes == ("q8_0 KV skipped: never verified on OpenVINO (set quantized_kv.openvino_q8 to allow)",)


def test_kv_q4_sets_the_type_and_flash_attention(facts: ModelFacts, policy: Policy) -> None:
    inputs = _inputs(facts, _igpu(), policy)
    state = _start(inputs)
    after = LADDER["kv-q4"](inputs, state, worst(inputs.allocations(state.settings)))
    assert after is not None
    assert argv_changes(after.settings, after.decided) == {
        "--cache-type-k": "q4_0",
        "--cache-type-v": "q4_0",
        "--flash-attn": "on",
    }
    assert (after.settings.kv.type_k, after.settings.kv.flash_attn) == ("q4_0", "on")
    assert LADDER["kv-q8"](inputs, after, worst(inputs.allocations(after.settings))) is None  # already smaller


@pytest.mark.parametrize("name", ["stateful", "weights", "ngl"])
def test_gpu_steps_do_not_apply_on_the_cpu(facts: ModelFacts, policy: Policy, name: str) -> None:
    inputs = _inputs(facts, Target(backend="cpu", host_budget=Sourced(GIB, "declared", "t")), policy)
    state = _start(inputs)
    assert LADDER[name](inputs, state, worst(inputs.allocations(state.settings))) is None


def test_walk_stops_once_it_fits(facts: ModelFacts, policy: Policy) -> None:
    inputs = _inputs(facts, _igpu(), policy)
    after = walk(inputs, _start(inputs), ("stateful", "ctx", "kv-q4"))
    assert [s.name for s in after.taken] == ["stateful"]
    roomy = _inputs(facts, Target(backend="cpu", host_budget=Sourced(64 * GIB, "declared", "t")), policy)
    assert walk(roomy, _start(roomy), ("ctx", "kv-q4")) == _start(roomy)


def test_took_keeps_a_changed_options_first_place() -> None:
    state = State(LlamaSettings(kv=KvRequest(tool="server"), n_gpu_layers=20), decided=("n_gpu_layers", "fit"))
    settings = LlamaSettings(kv=KvRequest(tool="server", n_ctx=4096, fit=False), n_gpu_layers=10)
    after = state.took(Step("ngl", "why"), settings, ("n_ctx", "n_gpu_layers"))
    assert list(argv_changes(after.settings, after.decided).items()) == [
        ("--gpu-layers", "10"), ("--fit", "off"), ("--ctx-size", "4096"),
    ]  # fmt: skip
    assert after.taken == (Step("ngl", "why"),) and state.taken == ()


def _asked(facts: ModelFacts, policy: Policy, **asked: str) -> tuple[Inputs, State]:
    request = KvRequest(tool="server", n_ctx=65536, **asked)  # type: ignore[arg-type]
    inputs = Inputs(facts, request, _igpu(), policy, policy.ctx_floor, plan_kv(facts, request).context.n_ctx)
    return inputs, State(LlamaSettings(kv=request))


def test_a_users_fa_off_is_kept_and_only_k_is_quantized(facts: ModelFacts, policy: Policy) -> None:
    inputs, state = _asked(facts, policy, flash_attn="off")
    after = LADDER["kv-q4"](inputs, state, worst(inputs.allocations(state.settings)))
    assert after is not None
    kv = after.settings.kv
    assert (kv.type_k, kv.type_v, kv.flash_attn) == ("q4_0", "f16", "off") and "type_k" in after.decided
    assert "V stays f16: your -fa off is kept" in after.taken[-1].reason
    overridden, state = _asked(facts, replace(policy, keep_user_kv=False), flash_attn="off")
    moved = LADDER["kv-q4"](overridden, state, worst(overridden.allocations(state.settings)))
    assert moved is not None and moved.settings.kv.flash_attn == "on" and moved.settings.kv.type_v == "q4_0"


def test_a_users_cache_types_are_kept(facts: ModelFacts, policy: Policy) -> None:
    inputs, state = _asked(facts, policy, type_k="q8_0", type_v="q8_0")
    after = LADDER["kv-q4"](inputs, state, worst(inputs.allocations(state.settings)))
    assert after is not None and after.settings.kv.type_k == "q8_0"
    assert "q4_0 KV skipped: your -ctk q8_0 -ctv q8_0 kept" in after.notes[-1]


def test_an_explicit_f16_cache_is_kept_too(facts: ModelFacts, policy: Policy) -> None:
    """-ctk f16 -ctv f16 on the command line (user_kv_types, from prepare's parse) is a choice, not a default."""
    request = KvRequest(tool="server", n_ctx=65536)
    inputs = Inputs(facts, request, _igpu(), policy, policy.ctx_floor, 65536, user_kv_types=True)
    state = State(LlamaSettings(kv=request))
    after = LADDER["kv-q4"](inputs, state, worst(inputs.allocations(state.settings)))
    assert after is not None and after.settings.kv.type_k == "f16"
    assert "your -ctk f16 -ctv f16 kept" in after.notes[-1]


def test_vulkan_keeps_a_users_fa_off_without_quantizing_k(facts: ModelFacts, policy: Policy) -> None:
    """Vulkan would run a quantized K's attention on the CPU without flash attention: no K-only step there."""
    request = KvRequest(tool="server", n_ctx=65536, flash_attn="off")
    vulkan = Target(backend="vulkan", device="Vulkan0", on_gpu=True, device_memory=Sourced(8 * GIB, "declared", "t"),
                    host_budget=Sourced(32 * GIB, "declared", "test"))  # fmt: skip
    inputs = Inputs(facts, request, vulkan, policy, policy.ctx_floor, 65536)
    state = State(LlamaSettings(kv=request))
    after = LADDER["kv-q8"](inputs, state, worst(inputs.allocations(state.settings)))
    assert after is not None and (after.settings.kv.type_k, after.settings.kv.flash_attn) == ("f16", "off")
    assert "vulkan runs a quantized K's attention on the CPU" in after.notes[-1]
