"""Where memory lives for each flag that moves it (per place), and the user's OpenVINO environment."""

from __future__ import annotations

from dataclasses import replace

import pytest

from safe_llama.backends.openvino import STATEFUL_ENV
from safe_llama.cmdline.llama_args import parse
from safe_llama.cmdline.memory_flags import EXPERT_REGEX, Draft, DraftOptions, Layout, LlamaSettings, Override
from safe_llama.cmdline.request import to_request
from safe_llama.device.limits import Sourced
from safe_llama.model.facts import ModelFacts
from safe_llama.model.gguf_header import GGUFHeader, TensorInfo
from safe_llama.model.header_facts import model_facts
from safe_llama.model.kv import KvRequest, plan_kv
from safe_llama.paths import packaged_configs
from safe_llama.plan.memory import memory_by_place
from safe_llama.plan.planner import plan
from safe_llama.plan.policy import Policy, load_policy
from safe_llama.plan.target import Target

GIB = 1 << 30
MIB = 1 << 20


@pytest.fixture(scope="module")
def policy() -> Policy:
    return load_policy(packaged_configs() / "planner.toml")


def moe_facts(n_layer: int = 4) -> ModelFacts:
    """A MoE-shaped model: per layer 10 MiB of attention, 30 MiB of experts; 5 MiB embeddings and output."""
    tensors = []
    for il in range(n_layer):
        tensors.append(_tensor(f"blk.{il}.attn_q.weight", 10 * MIB))
        tensors.append(_tensor(f"blk.{il}.ffn_up_exps.weight", 30 * MIB))
    tensors += [_tensor("token_embd.weight", 5 * MIB), _tensor("output.weight", 5 * MIB)]
    meta = {"general.architecture": "llama", "llama.block_count": n_layer, "llama.context_length": 4096,
            "llama.embedding_length": 256, "llama.attention.head_count": 4, "llama.attention.head_count_kv": 4,
            "llama.feed_forward_length": 512}  # fmt: skip
    return model_facts(GGUFHeader(path="/m.gguf", metadata=meta, tensors=tuple(tensors)))  # type: ignore[arg-type]


def _tensor(name: str, size: int) -> TensorInfo:
    return TensorInfo(name=name, shape=(size // 4,), ggml_type=0, offset=0, n_bytes=size)


def cuda(**kw: object) -> Target:
    base = Target(
        backend="cuda", device="CUDA0", on_gpu=True, max_alloc=None,
        device_memory=Sourced(24 * GIB, "declared", "test"), host_budget=Sourced(64 * GIB, "declared", "test"),
    )  # fmt: skip
    return replace(base, **kw)  # type: ignore[arg-type]


def place(layout: Layout, ngl: int | None = None, target: Target | None = None) -> dict[str, dict[str, int]]:
    facts = moe_facts()
    settings = LlamaSettings(kv=KvRequest(tool="server", n_ctx=4096, n_parallel=1), n_gpu_layers=ngl, layout=layout)
    return memory_by_place(facts, settings, target or cuda())


def test_all_on_the_gpu_by_default() -> None:
    mem = place(Layout())
    assert mem["CUDA0"]["weights"] == 4 * 40 * MIB + 5 * MIB  # layers and output; token_embd stays on the CPU
    assert mem["host"]["weights"] == 5 * MIB
    assert mem["CUDA0"]["kv"] > 0 and "kv" not in mem["host"]


def test_no_kv_offload_keeps_the_kv_in_host_ram() -> None:
    on, off = place(Layout()), place(Layout(kv_offload=False))
    assert off["host"]["kv"] == on["CUDA0"]["kv"] and "kv" not in off["CUDA0"]


def test_cpu_moe_and_n_cpu_moe_move_expert_weights_to_the_host() -> None:
    cmoe = place(Layout(overrides=(Override(EXPERT_REGEX, "CPU"),)))
    assert cmoe["host"]["weights"] == 5 * MIB + 4 * 30 * MIB
    ncmoe = place(Layout(overrides=tuple(Override(rf"blk\.{il}{EXPERT_REGEX}", "CPU") for il in range(3))))
    assert ncmoe["host"]["weights"] == 5 * MIB + 3 * 30 * MIB
    assert ncmoe["CUDA0"]["weights"] == 4 * 10 * MIB + 30 * MIB + 5 * MIB


def test_override_tensor_to_another_device() -> None:
    mem = place(Layout(overrides=(Override(r"blk\.3\.", "CUDA1"),)), target=cuda())
    assert mem["CUDA1"]["weights"] == 40 * MIB


def test_ngl_keeps_the_first_layers_and_their_kv_on_the_host() -> None:
    # llama.cpp offloads the output layer first (`offloading output layer to GPU`), then the last layers
    one = place(Layout(), ngl=1)
    assert one["CUDA0"]["weights"] == 5 * MIB and "kv" not in one["CUDA0"]
    mem = place(Layout(), ngl=2)
    assert mem["CUDA0"]["weights"] == 40 * MIB + 5 * MIB  # the last layer and the output
    assert mem["host"]["kv"] == 3 * mem["CUDA0"]["kv"]


def test_tensor_split_over_two_devices() -> None:
    # llama.cpp splits the n_layer + 1 slots (the output layer last): at -ts 3,1 slot i goes to the first
    # device whose cumulative share is above i / 5, so 4 layers land on CUDA0 and the output alone on CUDA1
    # (as the real llama-server put all 6 layers of a 6-layer model on one RPC worker at -ts 3,1)
    mem = place(Layout(devices=("CUDA0", "CUDA1"), tensor_split=(3.0, 1.0)))
    assert mem["CUDA0"]["weights"] == 4 * 40 * MIB
    assert mem["CUDA1"]["weights"] == 5 * MIB and "kv" not in mem["CUDA1"]
    even = place(Layout(devices=("CUDA0", "CUDA1")))
    assert even["CUDA0"]["weights"] == 3 * 40 * MIB  # slots 0-2 of 5 below the 0.5 share
    assert even["CUDA1"]["weights"] == 40 * MIB + 5 * MIB
    assert even["CUDA0"]["kv"] == 3 * even["CUDA1"]["kv"]
    none = place(Layout(devices=("CUDA0", "CUDA1"), split_mode="none", main_gpu=1))
    assert set(none) == {"CUDA1", "host"}


def test_draft_mmproj_and_prompt_cache() -> None:
    draft = Draft(facts=moe_facts(2), options=DraftOptions(n_gpu_layers=0, type_k="q8_0", type_v="q8_0"))
    mem = place(Layout(draft=draft, mmproj_bytes=7 * MIB, mmproj_offload=False, cache_ram_mib=1))
    assert mem["host"]["draft_weights"] == 2 * 40 * MIB + 10 * MIB
    assert mem["host"]["draft_kv"] > 0 and "draft_kv" not in mem["CUDA0"]
    assert mem["host"]["mmproj"] == 7 * MIB
    assert mem["host"]["prompt_cache"] == MIB
    # server_prompt_cache's token limit (n_ctx) rises to what its byte limit holds: the bytes bound it
    assert place(Layout(cache_ram_mib=8192))["host"]["prompt_cache"] == 8192 * MIB
    unbounded = place(Layout(cache_ram_mib=-1))
    kv = plan_kv(moe_facts(), KvRequest(tool="server", n_ctx=4096, n_parallel=1)).total_bytes
    assert unbounded["host"]["prompt_cache"] == kv  # -1: no byte limit, one context's worth of tokens


def test_cpu_target_puts_everything_on_the_host() -> None:
    mem = place(Layout(), target=cuda(backend="cpu", device=None, on_gpu=False, device_memory=None))
    assert set(mem) == {"host"}
    assert mem["host"]["weights"] == moe_facts().total_weight_bytes


def test_device_totals_follow_the_flags(policy: Policy) -> None:
    """-cmoe makes a model fit a small GPU that it does not fit without it."""
    facts = moe_facts()
    small = cuda(device_memory=Sourced(100 * MIB, "declared", "test"))
    req = KvRequest(tool="server", n_ctx=4096, n_parallel=1)
    with pytest.raises(Exception, match="nothing fits"):
        plan(facts, req, small, policy, ladder=["ctx"])
    fitted = plan(facts, req, small, policy, ladder=["ctx"], layout=Layout(overrides=(Override(EXPERT_REGEX, "CPU"),)))
    assert fitted.fits


def ov_target() -> Target:
    return Target(
        backend="openvino", device="OPENVINO0", on_gpu=True, integrated=True,
        max_alloc=Sourced(1 * GIB, "declared", "test"), device_memory=Sourced(16 * GIB, "declared", "test"),
        host_budget=Sourced(32 * GIB, "declared", "test"), binary_version="0.4.1-dev",
        neo_filter={"NEOReadDebugKeys": "1", "FilterBdfPath": "0000:00:02.0"},
    )  # fmt: skip


def big_kv_facts() -> ModelFacts:
    meta = {"general.architecture": "llama", "llama.block_count": 28, "llama.context_length": 131072,
            "llama.embedding_length": 3072, "llama.attention.head_count": 24, "llama.attention.head_count_kv": 8,
            "llama.feed_forward_length": 8192}  # fmt: skip
    return model_facts(GGUFHeader(path="/m.gguf", metadata=meta))  # type: ignore[arg-type]


def test_user_stateful_1_is_the_starting_point(policy: Policy) -> None:
    p = plan(big_kv_facts(), KvRequest(tool="server", n_ctx=65536), ov_target(), policy, user_env={STATEFUL_ENV: "1"})
    assert p.settings.stateful and STATEFUL_ENV not in p.env_changes
    assert p.steps[1].name == "stateful" and f"your {STATEFUL_ENV}=1" in p.steps[1].reason


def test_user_stateful_0_takes_the_step_off_the_ladder(policy: Policy) -> None:
    p = plan(big_kv_facts(), KvRequest(tool="completion", n_ctx=65536), ov_target(), policy,
             user_env={STATEFUL_ENV: "0"})  # fmt: skip
    assert not p.settings.stateful and STATEFUL_ENV not in p.env_changes
    assert "stateful" not in [s.name for s in p.steps] and "ctx" in [s.name for s in p.steps]
    without = plan(big_kv_facts(), KvRequest(tool="completion", n_ctx=65536), ov_target(), policy)
    assert without.env_changes[STATEFUL_ENV] == "1"  # what the user's =0 prevented


def test_user_neo_filter_is_never_overwritten(policy: Policy) -> None:
    p = plan(big_kv_facts(), KvRequest(tool="completion", n_ctx=4096), ov_target(), policy,
             user_env={"FilterBdfPath": "0000:03:00.0"})  # fmt: skip
    assert "FilterBdfPath" not in p.env_changes and p.env_changes["NEOReadDebugKeys"] == "1"
    assert any("FilterBdfPath=0000:03:00.0 kept" in n for n in p.notes)


def test_kept_weights_follow_every_change_of_the_same_model() -> None:
    """The weights' places are kept between the ladder's calls for one model: a change of rule, layers or
    devices must still move them."""
    facts = moe_facts()
    kv = KvRequest(tool="server", n_ctx=4096, n_parallel=1)
    layouts = [Layout(), Layout(overrides=(Override(EXPERT_REGEX, "CPU"),)), Layout(), Layout(kv_offload=False)]
    seen = [memory_by_place(facts, LlamaSettings(kv=kv, layout=layout), cuda()) for layout in layouts]
    assert seen[0] == seen[2] and seen[1]["host"]["weights"] == 5 * MIB + 4 * 30 * MIB
    assert seen[0]["CUDA0"]["weights"] == 4 * 40 * MIB + 5 * MIB
    fewer = memory_by_place(facts, LlamaSettings(kv=kv, n_gpu_layers=2, layout=Layout()), cuda())
    assert fewer["CUDA0"]["weights"] == 40 * MIB + 5 * MIB
    assert memory_by_place(facts, LlamaSettings(kv=kv, layout=Layout()), cuda()) == seen[0]


def tied_facts(embd: int) -> ModelFacts:
    """gemma-3's shape: a tied embedding (no output.weight) beside small layers."""
    tensors = [_tensor(f"blk.{il}.attn_q.weight", 4 * MIB) for il in range(4)] + [_tensor("token_embd.weight", embd)]
    meta = {"general.architecture": "llama", "llama.block_count": 4, "llama.context_length": 4096,
            "llama.embedding_length": 256, "llama.attention.head_count": 4, "llama.attention.head_count_kv": 4,
            "llama.feed_forward_length": 512}  # fmt: skip
    return model_facts(GGUFHeader(path="/m.gguf", metadata=meta, tensors=tuple(tensors)))  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("embd", "device_weights"),
    [
        pytest.param(170 * MIB, 16 * MIB, id="over-the-range-counted-once-on-the-host"),
        pytest.param(100 * MIB, 116 * MIB, id="within-the-range-copied-to-the-device"),
    ],
)
def test_vulkan_tied_embedding_over_the_storage_range(embd: int, device_weights: int) -> None:
    """llama.cpp keeps a weight the Vulkan device's operations cannot take (above maxStorageBufferRange) on the
    host: gemma-3's 170 MiB tied token_embd on lavapipe's 128 MiB range lives in the mapping once."""
    vulkan = cuda(backend="vulkan", device="Vulkan0", max_tensor=Sourced(128 * MIB, "probed", "range"))
    settings = LlamaSettings(kv=KvRequest(tool="server", n_ctx=4096, n_parallel=1))
    mem = memory_by_place(tied_facts(embd), settings, vulkan)
    assert mem["Vulkan0"]["weights"] == device_weights
    assert mem["host"]["weights"] == embd


def test_no_repack_drops_the_host_weights_repacked_copy() -> None:
    """-nr (--no-repack): llama.cpp loads the host's weights without its extra buffer types, so no CPU_REPACK
    copy of the q4_0 matrices; the plan counts none."""
    facts = moe_facts()
    q4 = replace(facts, tensor_types=("q4_0",) * len(facts.tensors))
    host = Target(
        backend="cpu", host_budget=Sourced(64 * GIB, "declared", "test"), cpu_repack_types=frozenset({"q4_0"})
    )
    kv = KvRequest(tool="completion", n_ctx=4096)
    for argv, repacked in ([], 4 * 40 * MIB + 5 * MIB), (["-nr"], 0):
        layout = to_request(parse("completion", argv, {})).layout
        mem = memory_by_place(q4, LlamaSettings(kv=kv, layout=layout), host)
        assert mem["host"].get("repacked", 0) == repacked, argv
