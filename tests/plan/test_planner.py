"""The planner on the scenarios that matter: the seed's OpenVINO iGPU, fixed builds, SWA, MLA, recurrent,
quantized-cache rules, nothing fitting."""

from __future__ import annotations

from pathlib import Path

import pytest

from safe_llama.device.limits import Sourced
from safe_llama.errors import ExitStatus, SafeLlamaError
from safe_llama.model.facts import ModelFacts
from safe_llama.model.gguf_header import GGUFHeader
from safe_llama.model.header_facts import model_facts
from safe_llama.model.kv import KvRequest, buffers, plan_kv
from safe_llama.paths import packaged_configs
from safe_llama.plan.planner import plan
from safe_llama.plan.policy import Policy, load_policy
from safe_llama.plan.target import Target, kv_splits
from tests.tiny_gguf import LLAMA_3B

GIB = 1 << 30
UHD770_MAX_ALLOC = 4_294_959_104


@pytest.fixture(scope="module")
def policy() -> Policy:
    return load_policy(packaged_configs() / "planner.toml")


def _facts(arch: str, **meta: object) -> ModelFacts:
    md: dict[str, object] = {"general.architecture": arch}
    md.update({k if k.startswith(("general.", "tokenizer.")) else f"{arch}.{k}": v for k, v in meta.items()})
    return model_facts(GGUFHeader(path="/models/x.gguf", metadata=md))  # type: ignore[arg-type]


def uhd770(version: str) -> Target:
    return Target(
        backend="openvino",
        device="OPENVINO0",
        on_gpu=True,
        integrated=True,
        max_alloc=Sourced(UHD770_MAX_ALLOC, "profile", "intel-uhd-770"),
        device_memory=Sourced(16 * GIB, "profile", "intel-uhd-770"),
        host_budget=Sourced(32 * GIB, "declared", "test"),
        binary_version=version,
    )


def test_seed_old_build_goes_stateful(policy: Policy) -> None:
    facts = _facts("llama", **LLAMA_3B)
    p = plan(facts, KvRequest(tool="completion", n_ctx=65536), uhd770("0.4.1-dev"), policy)
    assert [s.name for s in p.steps] == ["stateful"]
    assert p.env_changes == {"GGML_OPENVINO_STATEFUL_EXECUTION": "1"}
    assert "--ctx-size" not in p.argv_changes
    assert p.steps[0].reason == (
        "KV cache (one allocation) 7.00 GiB at -c 65536 is above the GPU's 4.00 GiB limit per allocation "
        "(profile, less a 4.00 MiB margin): keeping the KV in host RAM (GGML_OPENVINO_STATEFUL_EXECUTION=1)"
    )
    assert p.kv.total_bytes == 7_516_192_768
    assert p.fits


def test_seed_old_build_ctx_only_gives_37376(policy: Policy) -> None:
    facts = _facts("llama", **LLAMA_3B)
    p = plan(facts, KvRequest(tool="completion", n_ctx=65536), uhd770("0.4.1-dev"), policy, ladder=["ctx"])
    assert p.argv_changes["--ctx-size"] == "37376"
    assert p.kv.total_bytes == 37376 * 114688 <= UHD770_MAX_ALLOC
    assert p.ctx_by_type["f16"] == 37376


def test_seed_server_stateful_needs_one_slot(policy: Policy) -> None:
    facts = _facts("llama", **LLAMA_3B)
    p = plan(facts, KvRequest(tool="server", n_ctx=65536), uhd770("0.4.1-dev"), policy)
    assert p.argv_changes["--parallel"] == "1"
    assert p.kv.context.n_seq_max == 1


def test_seed_fixed_build_fits_as_asked(policy: Policy) -> None:
    facts = _facts("llama", **LLAMA_3B)
    target = uhd770("0.6.0-dev")
    assert kv_splits(target, policy)
    p = plan(facts, KvRequest(tool="completion", n_ctx=65536), target, policy)
    assert p.steps == () and p.argv_changes == {} and p.env_changes == {}
    kv_allocs = [a.bytes for a in p.allocations if a.name.startswith("KV")]
    assert kv_allocs == [4_160_749_568, 3_355_443_200]


def test_unknown_version_is_treated_as_unfixed(policy: Policy) -> None:
    target = Target(backend="openvino", host_budget=Sourced(GIB, "declared", "test"), on_gpu=True)
    assert not kv_splits(target, policy)


def test_neo_filter_passes_through(policy: Policy) -> None:
    facts = _facts("llama", **LLAMA_3B)
    target = Target(
        **{
            **uhd770("0.6.0-dev").__dict__,
            "neo_filter": {"NEOReadDebugKeys": "1", "FilterBdfPath": "0000:00:02.0"},
        }
    )
    p = plan(facts, KvRequest(tool="completion", n_ctx=4096), target, policy)
    assert p.env_changes == {"NEOReadDebugKeys": "1", "FilterBdfPath": "0000:00:02.0"}
    assert p.steps[0].name == "neo-filter"


def test_openvino_q8_is_off_unless_allowed(policy: Policy) -> None:
    facts = _facts("llama", **LLAMA_3B)
    p = plan(
        facts,
        KvRequest(tool="completion", n_ctx=65536),
        uhd770("0.4.1-dev"),
        policy,
        ladder=["kv-q8", "kv-q4"],
    )
    assert [s.name for s in p.steps] == ["kv-q4"]
    assert any("never verified on OpenVINO" in n for n in p.notes)
    assert p.argv_changes["--cache-type-k"] == "q4_0" and p.argv_changes["--flash-attn"] == "on"


def test_quantized_k_needs_head_dim_multiple_of_32(policy: Policy) -> None:
    facts = _facts(
        "llama", block_count=2, embedding_length=64, context_length=1 << 20,
        **{"attention.head_count": 4, "attention.head_count_kv": 4},
    )  # fmt: skip
    assert facts.key_length[0] == 16
    target = Target(backend="cpu", host_budget=Sourced(600 << 20, "declared", "test"))
    with pytest.raises(SafeLlamaError) as err:
        plan(facts, KvRequest(tool="completion", n_ctx=1 << 20), target, policy, ladder=["kv-q8"])
    assert err.value.status == ExitStatus.NOTHING_FITS


def test_cpu_budget_reduces_context_exactly(policy: Policy) -> None:
    facts = _facts("llama", **LLAMA_3B)
    target = Target(backend="cpu", host_budget=Sourced(8 * GIB, "probed", "cgroup memory.max"))
    p = plan(facts, KvRequest(tool="server", n_ctx=131072), target, policy)
    chosen = int(p.argv_changes["--ctx-size"])
    assert chosen % 256 == 0 and 4096 <= chosen < 131072
    assert p.fits
    over = plan_kv(facts, KvRequest(tool="server", n_ctx=chosen + 256))
    assert over.total_bytes > p.kv.total_bytes
    assert p.argv_changes["--fit"] == "off"


def test_nothing_fits_at_the_floor(policy: Policy) -> None:
    facts = _facts("llama", **LLAMA_3B)
    target = Target(backend="cpu", host_budget=Sourced(150 << 20, "probed", "RLIMIT_AS"))
    with pytest.raises(SafeLlamaError) as err:
        plan(facts, KvRequest(tool="completion", n_ctx=65536), target, policy)
    assert err.value.status == ExitStatus.NOTHING_FITS
    assert "nothing fits" in str(err.value) and "\n" not in str(err.value)


def test_swa_model_bundled_gemma(policy: Policy, bundled_model: Path) -> None:
    from safe_llama.model.header_facts import load_model_facts

    facts = load_model_facts(bundled_model)
    target = Target(backend="openvino", on_gpu=True, integrated=True, max_alloc=Sourced(64 << 20, "declared", "test"),
                    host_budget=Sourced(8 * GIB, "declared", "test"), binary_version="0.4.1-dev")  # fmt: skip
    p = plan(facts, KvRequest(tool="completion", n_ctx=32768), target, policy, ladder=["ctx"])
    # full-attention cache: 3 layers x 256 x 2 x 2 B per cell; the SWA cache stays 1024 cells
    chosen = int(p.argv_changes["--ctx-size"])
    full = p.kv.caches[0]
    assert full.total_bytes <= (64 << 20) - policy.max_alloc_margin["openvino"]
    assert buffers(full.tensor_bytes, None)[0] == full.total_bytes
    per_cell = 3 * 256 * 2 * 2
    assert chosen == ((64 << 20) - policy.max_alloc_margin["openvino"]) // per_cell // 256 * 256 == 20480
    assert [c.cells for c in p.kv.caches] == [20480, 1024]


def test_mla_and_recurrent(policy: Policy) -> None:
    mla = _facts(
        "deepseek2", block_count=4, embedding_length=256, context_length=4096,
        **{"attention.head_count": 4, "attention.head_count_kv": 1, "attention.key_length": 576,
           "attention.value_length": 512, "attention.key_length_mla": 192, "attention.value_length_mla": 128,
           "attention.kv_lora_rank": 512, "rope.dimension_count": 64},
    )  # fmt: skip
    target = Target(backend="cpu", host_budget=Sourced(64 * GIB, "declared", "test"))
    p = plan(mla, KvRequest(tool="completion", n_ctx=4096), target, policy)
    assert p.kv.caches[0].v_bytes == 0
    mamba = _facts(
        "mamba", block_count=4, embedding_length=256, context_length=4096,
        **{"ssm.conv_kernel": 4, "ssm.inner_size": 512, "ssm.state_size": 16, "ssm.time_step_rank": 16},
    )  # fmt: skip
    p = plan(mamba, KvRequest(tool="server", n_ctx=4096, n_parallel=2), target, policy)
    assert [c.kind for c in p.kv.caches] == ["recurrent"]
    assert p.kv.caches[0].cells == 2


def test_host_budget_from_a_cgroup_file(tmp_path: Path, policy: Policy) -> None:
    """systemd's MemoryMax= as the cgroup's memory.max bounds the plan (a tree in tmp_path, real parsing)."""
    from dataclasses import replace

    from safe_llama.device.host_budget import host_budget
    from safe_llama.device.probe_host import probe_host
    from safe_llama.device.target_device import TargetDevice
    from tests.device.test_probe_host import write

    root = tmp_path / "fs"
    write(root / "cgroup.controllers", "memory\n")
    write(root / "system.slice" / "llama.service" / "memory.max", f"{3 * GIB}\n")
    write(root / "system.slice" / "llama.service" / "memory.current", f"{GIB}\n")
    write(root / "system.slice" / "llama.service" / "memory.stat", "anon 1\nfile 0\ninactive_file 0\n")
    write(tmp_path / "cgroup", "0::/system.slice/llama.service\n")
    host = probe_host(proc_cgroup=tmp_path / "cgroup", cgroup_root=root)
    host = replace(host, rlimit_as=None, available_bytes=64 * GIB, total_bytes=64 * GIB)
    budget = host_budget(host)
    assert budget.budget_bytes.value == 2 * GIB  # memory.max less memory.current
    assert "cgroup v2" in budget.budget_bytes.detail
    cpu = TargetDevice(
        llama_name=None, backend="cpu", backend_device=None, description="host CPU", requested_by="default",
        opencl=None, pci=None, pci_bdf=None, limits_alloc=False, max_alloc_bytes=None, memory_bytes=None,
        memory_free_bytes=None, integrated=None, on_host=True, shares_host_memory=True,
    )  # fmt: skip
    from safe_llama.plan.target import target_from

    target = target_from(cpu, budget, binary_version="0.6.0-dev")
    assert not target.address_space_budget
    facts = _facts("llama", **LLAMA_3B)
    p = plan(facts, KvRequest(tool="server", n_ctx=65536, n_parallel=1), target, policy)
    chosen = int(p.argv_changes["--ctx-size"])
    assert 4096 <= chosen < 65536
    # at full use: what a request filling 65536 cells adds (14.5 MiB) included; a server's supervision is handed
    # off once ready: the supervisor's growth (4 MiB) not counted, what the hand-off gives back (7.5 MiB) taken off
    assert "cgroup charge (process, KV, compute) 7.18 GiB at -c 65536" in p.steps[0].reason
    assert "above its 1.96 GiB usable (2.00 GiB probed: cgroup v2 headroom" in p.steps[0].reason
    assert p.allocations[-1].limit == int(2 * GIB * (1 - policy.memory_margin_fraction["default"]))


def test_plan_command_exits_67_when_nothing_fits(clean_env: dict[str, str]) -> None:
    import subprocess
    import sys

    done = subprocess.run(
        [sys.executable, "-m", "safe_llama", "plan", "--host-memory", "10M", "server", "-c", "4096"],
        env=clean_env, capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    assert done.returncode == 67
    assert done.stderr.startswith("safe-llama: nothing fits") and done.stderr.count("\n") == 1


def test_context_given_back_after_a_later_step(policy: Policy) -> None:
    """ctx first, then q8_0: the floor alone does not fit in f16, so q8_0 is taken and the context is
    raised again to the largest that fits with it; the reason says the final number."""
    facts = _facts("llama", **LLAMA_3B)
    kv_f16_at_floor = 4096 * 114688
    budget = policy.process_overhead["default"] + kv_f16_at_floor  # f16 at the floor is just over the budget
    target = Target(backend="cpu", host_budget=Sourced(budget, "declared", "test"))
    p = plan(facts, KvRequest(tool="completion", n_ctx=65536), target, policy, ladder=["ctx", "kv-q8"])
    assert [s.name for s in p.steps][:2] == ["ctx", "kv-q8"]
    chosen = int(p.argv_changes["--ctx-size"])
    assert chosen > 4096 and p.kv.caches[0].type_k == "q8_0"
    assert p.steps[0].reason.endswith(f": -c {chosen}, the largest that fits with the steps after it")


def test_a_learned_compute_size_and_the_margin_band_reach_the_host_total(policy: Policy) -> None:
    """The retry's hooks: bytes the compute estimate missed are counted at every size; margin_scale -1
    plans to the top of the margin band (the budget plus the margin), 1 keeps the policy's margin."""
    facts = _facts("llama", **LLAMA_3B)
    budget = Sourced(8 * GIB, "probed", "RLIMIT_AS (ulimit -v)")
    request = KvRequest(tool="server", n_ctx=131072)
    kept = plan(facts, request, Target(backend="cpu", host_budget=budget), policy)
    extra = plan(facts, request, Target(backend="cpu", host_budget=budget, compute_extra=GIB), policy)
    band = plan(facts, request, Target(backend="cpu", host_budget=budget, margin_scale=-1.0), policy)
    host = next(a for a in extra.allocations if a.name.startswith("host total"))
    fraction = policy.memory_margin_fraction["default"]
    assert host.limit == int(8 * GIB * (1 - fraction)) and host.bytes <= host.limit
    band_host = next(a for a in band.allocations if a.name.startswith("host total"))
    assert band_host.limit == int(8 * GIB * (1 + fraction)) and "plus 2%" in band_host.limit_name
    assert extra.kv.total_bytes < kept.kv.total_bytes < band.kv.total_bytes
    per_cell = plan_kv(facts, KvRequest(tool="server", n_ctx=256)).total_bytes / 256
    assert (kept.kv.total_bytes - extra.kv.total_bytes) / per_cell == pytest.approx(GIB / per_cell, rel=0.3)


# ------------------------------------------------------------------------------------ Vulkan's per-tensor range

MIB = 1 << 20
# the H200 model of tests/fixtures/nvidia-h200-cuda: 8 layers of 16 KV heads x 256, 2,000,000 trained cells
BIG = {
    "block_count": 8, "embedding_length": 4096, "context_length": 2_000_000, "feed_forward_length": 64,
    "attention.head_count": 16, "attention.head_count_kv": 16, "attention.key_length": 256,
    "attention.value_length": 256,
}  # fmt: skip


def vulkan(max_tensor: int | None, max_alloc: int, detail: str = "Vulkan maxStorageBufferRange") -> Target:
    return Target(
        backend="vulkan",
        device="Vulkan0",
        on_gpu=True,
        max_alloc=Sourced(max_alloc, "probed", "Vulkan maxMemoryAllocationSize"),
        max_tensor=Sourced(max_tensor, "probed", detail) if max_tensor is not None else None,
        alloc_block=GIB,
        device_memory=Sourced(143771 * MIB, "probed", "test"),
        host_budget=Sourced(125 * GIB, "declared", "test"),
    )


def test_vulkan_context_is_bound_by_one_layers_k_tensor(policy: Policy) -> None:
    """lavapipe's 128 MiB maxStorageBufferRange: 30,840 cells of q8_0 K (4,352 bytes per cell and layer), 30,720
    on the 256-cell grid."""
    facts = _facts("llama", **BIG)
    p = plan(facts, KvRequest(tool="server", n_ctx=2_000_000), vulkan(128 * MIB, 2 * GIB), policy)
    assert (p.settings.kv.type_k, p.settings.kv.n_ctx) == ("q8_0", 30_720)
    assert [s.name for s in p.steps][:2] == ["kv-q8", "ctx"]
    assert "one layer's K cache" in p.steps[1].reason and "maxStorageBufferRange" in p.steps[1].reason
    k_tensor = max(p.kv.caches[0].tensor_bytes)
    assert k_tensor <= 128 * MIB < k_tensor + 256 * 4352  # the next step on the grid is over the range


def test_vulkan_h200_one_k_tensor_is_one_allocation(policy: Policy) -> None:
    """NVIDIA's maxMemoryAllocationSize (0xffe00000) is just under its 4 GiB - 1 range: a K tensor over the
    1 GiB block is a buffer of its own, so the driver's limit (less the policy's margin) binds first, within
    2% of the range's 986,880 cells; far below the GPU's memory."""
    facts = _facts("llama", **BIG)
    p = plan(facts, KvRequest(tool="server", n_ctx=2_000_000), vulkan(4 * GIB - 1, 0xFFE00000), policy)
    assert p.settings.kv.type_k == "q8_0"
    assert 0.98 * 986_880 <= (p.settings.kv.n_ctx or 0) <= 986_880
    assert p.kv.total_bytes < 0.6 * 143771 * MIB


def test_vulkan_without_a_tensor_limit_plans_against_the_allocation(policy: Policy) -> None:
    facts = _facts("llama", **BIG)
    p = plan(facts, KvRequest(tool="server", n_ctx=2_000_000), vulkan(None, 2 * GIB), policy)
    assert (p.settings.kv.n_ctx or 0) > 30_720


@pytest.mark.parametrize(
    ("request_", "note"),
    [
        pytest.param(
            KvRequest(tool="server", n_ctx=2_000_000, flash_attn="off"),
            "attention on the CPU: one layer's KQ scores (15.74 GiB at -ub 512) are above Vulkan0's 4.00 GiB limit"
            " per tensor (probed: Vulkan maxStorageBufferRange), so llama.cpp runs the attention there; the host's"
            " compute buffer holds them and copies of the layer's K and V (23.61 GiB more)",
            id="fa-off",
        ),
        pytest.param(
            KvRequest(tool="server", n_ctx=2_000_000, n_ubatch=4096, n_batch=4096),
            "attention on the CPU: the attention mask (7.41 GiB at -ub 4096) is above Vulkan0's 4.00 GiB limit per"
            " tensor (probed: Vulkan maxStorageBufferRange), so llama.cpp runs the attention there; the host's"
            " compute buffer holds copies of one layer's K and V (7.87 GiB more)",
            id="ub4096",
        ),
        pytest.param(KvRequest(tool="server", n_ctx=2_000_000), None, id="default"),
    ],
)
def test_vulkan_h200_says_where_the_attention_runs(policy: Policy, request_: KvRequest, note: str | None) -> None:
    """Issue 36's H200 shapes on Vulkan (the first spawns of tests/fixtures/nvidia-h200-vulkan/layouts): an
    attention tensor over the 4 GiB range puts that attention on the CPU, which the plan and the launch say."""
    facts = _facts("llama", **BIG)
    p = plan(facts, request_, vulkan(4 * GIB - 1, 0xFFE00000), policy)
    notes = [n for n in p.notes if n.startswith("attention on the CPU")]
    assert notes == ([note] if note else []), (p.settings.kv, p.notes)
    assert p.said == tuple(notes)  # the launch says it too, after the steps' reasons
