"""plan.memory: the allocations in bytes and names only (which buffer, where, how many bytes, against what
limit and margin), the per-plan weights cache."""

from __future__ import annotations

import pytest

from safe_llama.cmdline.memory_flags import Layout, LlamaSettings
from safe_llama.device.limits import Sourced
from safe_llama.model.facts import ModelFacts
from safe_llama.model.gguf_header import GGUFHeader
from safe_llama.model.header_facts import model_facts
from safe_llama.model.kv import KvRequest, plan_kv
from safe_llama.paths import packaged_configs
from safe_llama.plan.compute import attention_on_host, host_compute_estimate
from safe_llama.plan.memory import allocations, attention_limit, memory_by_place
from safe_llama.plan.policy import Policy, load_policy
from safe_llama.plan.split import WeightsCache, layer_places
from safe_llama.plan.target import Target
from tests.tiny_gguf import LLAMA_3B

GIB = 1 << 30
MIB = 1 << 20
MAX_ALLOC = 4_294_959_104


@pytest.fixture(scope="module")
def policy() -> Policy:
    return load_policy(packaged_configs() / "planner.toml")


@pytest.fixture(scope="module")
def facts() -> ModelFacts:
    md: dict[str, object] = {"general.architecture": "llama"}
    md.update({k if k.startswith(("general.", "tokenizer.")) else f"llama.{k}": v for k, v in LLAMA_3B.items()})
    return model_facts(GGUFHeader(path="/models/x.gguf", metadata=md))  # type: ignore[arg-type]


def _igpu(version: str) -> Target:
    return Target(
        backend="openvino",
        device="OPENVINO0",
        on_gpu=True,
        integrated=True,
        max_alloc=Sourced(MAX_ALLOC, "profile", "intel-uhd-770"),
        device_memory=Sourced(16 * GIB, "profile", "intel-uhd-770"),
        host_budget=Sourced(32 * GIB, "declared", "test"),
        binary_version=version,
    )


def _settings(n_ctx: int = 65536) -> LlamaSettings:
    return LlamaSettings(kv=KvRequest(tool="completion", n_ctx=n_ctx))


def test_one_allocation_build_checks_the_whole_kv_against_max_alloc(facts: ModelFacts, policy: Policy) -> None:
    kv, host = allocations(facts, _settings(), _igpu("0.4.1-dev"), policy)
    assert (kv.buffer, kv.place, kv.cache, kv.one_allocation) == ("kv buffer", "OPENVINO0", "full", True)
    assert kv.bytes == plan_kv(facts, _settings().kv).total_bytes == 7 * GIB
    assert kv.source is not None and kv.source.value == MAX_ALLOC
    assert kv.margin_bytes == 4 * MIB and kv.limit == MAX_ALLOC - 4 * MIB
    assert not kv.fits
    assert (host.buffer, host.host_kind, host.fits) == ("host total", "ram", True)


def test_split_build_checks_each_piece(facts: ModelFacts, policy: Policy) -> None:
    pieces = [a for a in allocations(facts, _settings(), _igpu("0.6.0-dev"), policy) if a.buffer == "kv buffer"]
    assert [(a.piece, a.pieces, a.one_allocation) for a in pieces] == [(1, 2, False), (2, 2, False)]
    assert [a.bytes for a in pieces] == [4_160_749_568, 3_355_443_200]
    assert sum(a.bytes for a in pieces) == 7 * GIB


def test_host_total_counts_its_parts_against_the_budget_less_the_margin(facts: ModelFacts, policy: Policy) -> None:
    target = Target(backend="cpu", host_budget=Sourced(16 * GIB, "declared", "--host-memory"))
    (host,) = allocations(facts, _settings(), target, policy)
    assert host.counted == ("process", "kv", "compute")  # no tensors in these facts: no weights
    assert host.margin_fraction == 0.02 and host.limit == int(16 * GIB * 0.98)
    places = memory_by_place(facts, _settings(), target)["host"]
    kv_and_compute = places["kv"] + places["compute"]
    overhead = policy.process_overhead["default"] + policy.process_per_vocab_token * facts.vocab_size
    assert host.bytes == kv_and_compute + overhead + policy.process_per_cell * 65536


def test_address_space_margin_below_zero_is_kept_in_bytes(facts: ModelFacts, policy: Policy) -> None:
    budget = Sourced(64 * GIB, "probed", "RLIMIT_AS")
    target = Target(backend="cpu", host_budget=budget, address_space_budget=True, margin_scale=-1.0)
    (space,) = allocations(facts, _settings(), target, policy)
    assert space.host_kind == "address space"
    assert space.margin_bytes == -policy.address_space_margin
    assert space.limit == 64 * GIB + policy.address_space_margin


def test_a_kv_cap_comes_first_with_the_whole_kv(facts: ModelFacts, policy: Policy) -> None:
    target = Target(backend="cpu", host_budget=Sourced(16 * GIB, "declared", "t"), kv_cap=GIB)
    first = allocations(facts, _settings(), target, policy)[0]
    assert (first.buffer, first.place, first.limit, first.bytes) == ("kv cap", "", GIB, 7 * GIB)


def test_the_one_device_is_sole_and_counts_what_it_holds(facts: ModelFacts, policy: Policy) -> None:
    target = Target(
        backend="cuda",
        device="CUDA0",
        on_gpu=True,
        device_memory=Sourced(8 * GIB, "declared", "--device-memory"),
        host_budget=Sourced(16 * GIB, "declared", "--host-memory"),
    )
    device = next(a for a in allocations(facts, _settings(), target, policy) if a.buffer == "device total")
    assert (device.place, device.sole, device.counted) == ("CUDA0", True, ("kv", "compute"))
    held = memory_by_place(facts, _settings(), target)["CUDA0"]
    assert device.bytes == sum(held.values()) and device.limit == int(8 * GIB * 0.98)


def test_weights_cache_keeps_one_placement_per_model_and_key(facts: ModelFacts) -> None:
    cache = WeightsCache()
    places = layer_places(28, 29, ["CUDA0"], ())
    first = cache.placed(facts, (), ["CUDA0"], places, 29, frozenset())
    assert cache.placed(facts, (), ["CUDA0"], places, 29, frozenset()) is first
    fewer = layer_places(28, 10, ["CUDA0"], ())
    assert cache.placed(facts, (), ["CUDA0"], fewer, 10, frozenset()) is not first


def test_the_cache_changes_no_figure(facts: ModelFacts, policy: Policy) -> None:
    target = _igpu("0.6.0-dev")
    settings = LlamaSettings(kv=KvRequest(tool="server", n_ctx=32768), n_gpu_layers=12, layout=Layout())
    cache = WeightsCache()
    assert allocations(facts, settings, target, policy, cache) == allocations(facts, settings, target, policy)
    assert allocations(facts, settings, target, policy, cache) == allocations(facts, settings, target, policy)


def _vulkan(integrated: bool = False) -> Target:
    """A Vulkan GPU whose operations take no tensor above 4 GiB - 1 (an NVIDIA driver's maxStorageBufferRange)."""
    return Target(
        backend="vulkan", device="Vulkan0", on_gpu=True, integrated=integrated,
        max_tensor=Sourced(4_294_967_295, "probed", "Vulkan maxStorageBufferRange"),
        device_memory=Sourced(140 * GIB, "probed", "test"), host_budget=Sourced(120 * GIB, "declared", "test"),
    )  # fmt: skip


@pytest.mark.parametrize(
    ("flags", "limit"),
    [
        pytest.param({}, 4_294_967_295, id="layers-and-kv-on-the-device"),
        pytest.param({"n_gpu_layers": 0}, None, id="ngl-0"),
        pytest.param({"layout": Layout(kv_offload=False)}, None, id="nkvo"),
        pytest.param({"stateful": True}, None, id="stateful"),
    ],
)
def test_the_attention_limit_applies_where_the_device_runs_the_attention(
    facts: ModelFacts, flags: dict[str, object], limit: int | None
) -> None:
    settings = LlamaSettings(kv=KvRequest(tool="server", n_ctx=131072, flash_attn="off"), **flags)  # type: ignore[arg-type]
    assert attention_limit(facts, settings, _vulkan()) == limit
    cuda = Target(backend="cuda", device="CUDA0", on_gpu=True, host_budget=Sourced(GIB, "declared", "test"))
    assert attention_limit(facts, settings, cuda) is None  # no largest tensor known: CUDA has none
    assert attention_limit(facts, settings, Target(backend="cpu", host_budget=Sourced(GIB, "declared", "t"))) is None


@pytest.mark.parametrize("type_k", ["f16", "q8_0"])
@pytest.mark.parametrize("integrated", [False, True])
def test_scores_over_the_limit_are_the_hosts_compute_not_the_devices(
    facts: ModelFacts, type_k: str, integrated: bool
) -> None:
    """-fa off at 131,072 cells of llama-3B (24 heads): 6 GiB of scores, over the 4 GiB range. The host holds
    them once (a quantized K's KQ, already the CPU's, is not added again), beside an integrated GPU too."""
    settings = LlamaSettings(kv=KvRequest(tool="server", n_ctx=131072, flash_attn="off", type_k=type_k))
    kv = plan_kv(facts, settings.kv)
    on_host = attention_on_host(facts, kv, 4_294_967_295)
    assert on_host is not None and on_host.scores and on_host.tensor_bytes == 131072 * 512 * 24 * 4
    places = memory_by_place(facts, settings, _vulkan(integrated))
    assert places["host"]["compute"] == host_compute_estimate(facts, kv, max_tensor=4_294_967_295)
    assert places["host"]["compute"] > on_host.host_bytes > places["Vulkan0"]["compute"] * 50
