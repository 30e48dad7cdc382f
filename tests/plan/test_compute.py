"""plan.compute: the compute-buffer estimate as its formula says, term by term (activations of one ubatch,
the logits, the attention mask, the f16 and host copies of a quantized K/V, MoE experts' activations), the
larger of the two graphs llama.cpp reserves, the host's share beside a GPU, the attention a device's largest
tensor leaves to the host, and each CPU device's graph in a layer split."""

from __future__ import annotations

from pathlib import Path

import pytest

from safe_llama.device.limits import Sourced
from safe_llama.model.facts import ModelFacts
from safe_llama.model.header_facts import load_model_facts
from safe_llama.model.kv import KvPlan, KvRequest, plan_kv, row_bytes
from safe_llama.plan.compute import (
    HostAttention,
    attention_on_host,
    compute_estimate,
    device_compute,
    expert_ff_width,
    host_compute_estimate,
    input_mask_bytes,
    logits_bytes,
    packaged_compute_costs,
    split_compute,
)
from safe_llama.plan.policy import ComputeCosts
from safe_llama.plan.target import Target
from tests.tiny_gguf import write_tiny_gguf

HOST = Sourced(8 << 30, "declared", "test")
# a: bytes per token per n_embd, b: per n_ff, c: per element of the attention rows (chosen, not the packaged)
COSTS = ComputeCosts(
    activation_bytes_per_embd=32,
    activation_bytes_per_ff=16,
    graph_inputs_bytes=1000,
    host_inputs_bytes_per_embd=2,
    host_inputs_bytes_per_embd_without_flash=3,
    activation_bytes_per_attention=4,
    split_bytes_per_token=100,
    split_bytes_per_embd=3,
    split_bytes_per_ff=5,
    split_first_bytes_per_embd=7,
)


@pytest.fixture(scope="module")
def dense(tmp_path_factory: pytest.TempPathFactory) -> ModelFacts:
    """n_embd 64, n_ff 96, 4 heads of 16, 2 KV heads: K and V rows of 32 per cell."""
    path = write_tiny_gguf(tmp_path_factory.mktemp("dense") / "dense.gguf", n_ff=96)
    return load_model_facts(path)


@pytest.fixture(scope="module")
def moe(tmp_path_factory: pytest.TempPathFactory) -> ModelFacts:
    """As `dense` with 4 experts of n_ff 96 in each layer."""
    path = write_tiny_gguf(tmp_path_factory.mktemp("moe") / "moe.gguf", n_ff=96, n_expert=4)
    return load_model_facts(path)


def _kv(facts: ModelFacts, **req: object) -> tuple[KvPlan, KvRequest]:
    request = KvRequest(**{"tool": "completion", "n_ctx": 1024, "flash_attn": "on", **req})  # type: ignore[arg-type]
    return plan_kv(facts, request), request


def test_the_estimate_is_activations_mask_and_logits(dense: ModelFacts) -> None:
    assert (dense.embedding_length, dense.feed_forward_length) == (64, 96)
    kv, req = _kv(dense, n_ubatch=256)
    per_token = 32 * 64 + 16 * 96
    mask = 1024 * 256 * 2  # f16 with flash attention
    logits = dense.vocab_size * 4 * 256  # llama-completion: n_outputs = n_ubatch
    assert compute_estimate(dense, kv, req, costs=COSTS) == 256 * per_token + mask + logits + 1000  # + the inputs


def test_it_grows_with_the_ubatch_and_the_context_as_the_formula_says(dense: ModelFacts) -> None:
    small, req = _kv(dense, n_ubatch=256)
    base = compute_estimate(dense, small, req, costs=COSTS)
    wider, req_wide = _kv(dense, n_ubatch=512)
    per_token = 32 * 64 + 16 * 96 + 1024 * 2 + dense.vocab_size * 4
    assert compute_estimate(dense, wider, req_wide, costs=COSTS) - base == 256 * per_token
    longer, req_long = _kv(dense, n_ubatch=256, n_ctx=4096)
    assert compute_estimate(dense, longer, req_long, costs=COSTS) - base == (4096 - 1024) * 256 * 2


def test_without_flash_attention_the_mask_is_f32_scores_per_head(dense: ModelFacts) -> None:
    on, req_on = _kv(dense, n_ubatch=256)
    off, req_off = _kv(dense, n_ubatch=256, flash_attn="off")
    assert off.flash_attn is False
    difference = compute_estimate(dense, off, req_off, costs=COSTS) - compute_estimate(dense, on, req_on, costs=COSTS)
    # the f32 mask and the f32 scores of 4 heads, not the f16 mask; the heads' outputs made contiguous (4 x 16)
    assert difference == 1024 * 256 * (4 * (4 + 1) - 2) + 256 * 4 * 4 * 16


def test_a_server_holds_one_output_per_slot(dense: ModelFacts) -> None:
    kv, req = _kv(dense, tool="server", n_parallel=4, n_ctx=4096)
    assert kv.context.n_seq_max == 4
    assert logits_bytes(dense, kv, req) == dense.vocab_size * 4 * 4
    assert logits_bytes(dense, kv, None) == dense.vocab_size * 4 * 4  # no request: counted as a server
    completion, req_c = _kv(dense)
    assert logits_bytes(dense, completion, req_c) == dense.vocab_size * 4 * 512


def test_wide_attention_sets_the_activations(tmp_path: Path) -> None:
    """8 heads of 64 on an embedding of 32: Q, K, V and output rows of 512 + 128 + 128 + 512 per token."""
    facts = load_model_facts(write_tiny_gguf(tmp_path / "wide.gguf", n_embd=32, n_head=8, head_dim=64))
    kv, req = _kv(facts, n_ubatch=128)
    rest = compute_estimate(facts, kv, req, costs=ComputeCosts(0, 0, 0, 0, 0))
    assert compute_estimate(facts, kv, req, costs=COSTS) - rest == 128 * (4 * (512 + 128 + 128 + 512) + 32 * 32) + 1000
    narrow = ComputeCosts(32, 16, 0, 0, 0)  # no attention cost: the embd/ff part alone
    assert compute_estimate(facts, kv, req, costs=narrow) - rest == 128 * (32 * 32 + 16 * 64)


def test_moe_experts_on_the_device_count_every_expert(dense: ModelFacts, moe: ModelFacts) -> None:
    assert expert_ff_width(dense) == 0
    assert expert_ff_width(moe) == 4 * 96
    kv, req = _kv(moe, n_ubatch=256)
    on_host = compute_estimate(moe, kv, req, costs=COSTS)
    on_device = compute_estimate(moe, kv, req, costs=COSTS, expert_ff=expert_ff_width(moe))
    assert on_device - on_host == 256 * 16 * (4 * 96 - 96)


def test_quantized_kv_under_flash_attention_gets_f16_copies(dense: ModelFacts) -> None:
    plain, req_plain = _kv(dense, n_ubatch=256)
    base = compute_estimate(dense, plain, req_plain, costs=COSTS, kv_f16_copies=True)
    both, req_both = _kv(dense, n_ubatch=256, type_k="q8_0", type_v="q8_0")
    k_only, req_k = _kv(dense, n_ubatch=256, type_k="q8_0")
    assert compute_estimate(dense, both, req_both, costs=COSTS) == base  # a backend that reads them directly
    assert compute_estimate(dense, both, req_both, costs=COSTS, kv_f16_copies=True) - base == 1024 * (2 * 32 + 2 * 32)
    assert compute_estimate(dense, k_only, req_k, costs=COSTS, kv_f16_copies=True) - base == 1024 * 2 * 32
    no_request = compute_estimate(dense, both, None, costs=COSTS)
    assert compute_estimate(dense, both, None, costs=COSTS, kv_f16_copies=True) == no_request  # no copies


def test_kv_on_host_also_copies_the_layer_in_its_cache_types(dense: ModelFacts) -> None:
    kv, req = _kv(dense, n_ubatch=256, type_k="q8_0", type_v="q8_0")
    on_device = compute_estimate(dense, kv, req, costs=COSTS, kv_f16_copies=True)
    on_host = compute_estimate(dense, kv, req, costs=COSTS, kv_f16_copies=True, kv_on_host=True)
    # one layer's K and V in their types, and the layer's input (n_embd 64 f32 per token of the ubatch)
    assert on_host - on_device == 1024 * 2 * row_bytes("q8_0", 32) + 256 * 4 * 64 == 1024 * 2 * 34 + 65536
    assert compute_estimate(dense, kv, req, costs=COSTS, kv_on_host=True) == compute_estimate(
        dense, kv, req, costs=COSTS
    )  # a backend without f16 copies copies nothing either


def test_the_packaged_costs_are_the_default(dense: ModelFacts) -> None:
    kv, req = _kv(dense)
    packaged = packaged_compute_costs()
    assert packaged.activation_bytes_per_embd == 8 and packaged.host_inputs_bytes_per_embd == 16
    assert compute_estimate(dense, kv, req) == compute_estimate(dense, kv, req, costs=packaged)


def test_the_hosts_part_beside_a_gpu(dense: ModelFacts) -> None:
    flash, _ = _kv(dense, n_ubatch=256)
    no_flash, _ = _kv(dense, n_ubatch=256, flash_attn="off")
    assert input_mask_bytes(flash) == 1024 * 256 * 2
    assert input_mask_bytes(no_flash) == 1024 * 256 * 4  # one f32 mask, not per head
    assert host_compute_estimate(dense, flash, COSTS) == 1024 * 256 * 2 + 256 * 64 * 2 + 1000
    assert host_compute_estimate(dense, no_flash, COSTS) == 1024 * 256 * 4 + 256 * 64 * 3 + 1000


def test_split_compute_per_cpu_device(dense: ModelFacts) -> None:
    kv, req = _kv(dense, n_ubatch=256)
    assert split_compute(dense, kv, req, COSTS) == 256 * (100 + 3 * 64 + 5 * 96) + 1024 * 256 * 2


def test_device_compute_in_a_cpu_layer_split(dense: ModelFacts) -> None:
    kv, req = _kv(dense, n_ubatch=256)
    target = Target(host_budget=HOST, backend="cpu", compute_costs=COSTS, compute_extra=10)
    placed = ["host", "RPC0", "RPC1", "RPC1"]  # each layer's place, the output layer last
    own = split_compute(dense, kv, req, COSTS) + 10
    first = 7 * 64 * 256
    assert device_compute(dense, kv, req, target, placed, 1) == {
        "RPC0": own + first,
        "RPC1": own + logits_bytes(dense, kv, req),
    }


def test_device_compute_on_gpus_is_the_whole_graph_on_each(dense: ModelFacts) -> None:
    kv, req = _kv(dense)
    gpu = Target(host_budget=HOST, backend="cuda", on_gpu=True, compute_costs=COSTS)
    assert device_compute(dense, kv, req, gpu, ["CUDA0", "CUDA1", "CUDA1"], 123) == {"CUDA0": 123, "CUDA1": 123}
    no_split_costs = Target(host_budget=HOST, backend="cpu", compute_costs=ComputeCosts(32, 16, 0, 0, 0))
    assert device_compute(dense, kv, req, no_split_costs, ["RPC0", "RPC0"], 5) == {"RPC0": 5}


def test_the_one_token_per_sequence_graph_counts_where_it_is_larger(dense: ModelFacts) -> None:
    """sched_reserve's second graph has n_seq_max tokens: larger than the ubatch's only where -np exceeds -ub."""
    kv, req = _kv(dense, tool="server", n_parallel=64, kv_unified=True, n_ubatch=32, n_ctx=4096)
    assert (kv.context.n_ubatch, kv.context.n_seq_max) == (32, 64)
    per_token = 32 * 64 + 16 * 96 + 4096 * 2  # activations and the f16 mask's row
    logits = dense.vocab_size * 4 * 64
    assert compute_estimate(dense, kv, req, costs=COSTS) == 64 * per_token + logits + 1000
    assert host_compute_estimate(dense, kv, COSTS) == 4096 * 64 * 2 + 64 * 64 * 2 + 1000


def test_attention_over_the_largest_tensor_runs_on_the_host(dense: ModelFacts) -> None:
    """Without flash attention the scores (n_kv x n_ubatch x 4 heads f32) decide; with it the f16 mask."""
    off, _ = _kv(dense, n_ubatch=256, flash_attn="off")
    scores = 1024 * 256 * 4 * 4
    layer_k = layer_v = 1024 * 32 * 2  # one layer's f16 K and V, 2 KV heads of 16
    assert attention_on_host(dense, off, scores) is None  # a tensor at the limit is taken
    assert attention_on_host(dense, off, None) is None  # no limit: CUDA, the CPU
    assert attention_on_host(dense, off, scores - 1) == HostAttention(True, scores, scores + layer_k + layer_v)
    on, _ = _kv(dense, n_ubatch=256)
    mask = 1024 * 256 * 2
    assert attention_on_host(dense, on, mask) is None
    assert attention_on_host(dense, on, mask - 1) == HostAttention(False, mask, layer_k + layer_v)
    q8, _ = _kv(dense, n_ubatch=256, type_k="q8_0", type_v="q8_0")
    on_host = attention_on_host(dense, q8, mask - 1)
    assert on_host is not None and on_host.host_bytes == 2 * 1024 * row_bytes("q8_0", 32)  # copied as they are


def test_the_device_drops_what_the_host_runs_and_the_host_takes_it(dense: ModelFacts) -> None:
    off, req = _kv(dense, tool="server", n_parallel=4, kv_unified=True, n_ubatch=256, flash_attn="off")
    scores = 1024 * 256 * 4 * 4
    kept = compute_estimate(dense, off, req, costs=COSTS, max_tensor=scores)
    assert kept == compute_estimate(dense, off, req, costs=COSTS)
    dropped = compute_estimate(dense, off, req, costs=COSTS, max_tensor=scores - 1)
    # no scores nor mask (4 heads + 1, f32), and a second row of the heads' outputs: the copy back from the host
    assert kept - dropped == 1024 * 256 * 4 * 5 - 256 * 4 * 4 * 16
    host = host_compute_estimate(dense, off, COSTS, max_tensor=scores - 1)
    assert host - host_compute_estimate(dense, off, COSTS) == scores + 2 * 1024 * 32 * 2
    # the one-token-per-slot graph (4 tokens: 64 KiB of scores) stays on the device
    assert attention_on_host(dense, off, scores - 1, n_tokens=4) is None


def test_the_one_token_graph_is_the_device_s_larger_when_the_ubatch_s_attention_left(dense: ModelFacts) -> None:
    """As on the H200 (Vulkan, -fa off at 515,840 cells, -np 4): the ubatch's scores on the host, the one-token
    graph's on the device, the larger there."""
    off, req = _kv(dense, tool="server", n_parallel=64, kv_unified=True, n_ubatch=128, n_ctx=65536, flash_attn="off")
    one_token = compute_estimate(dense, off, req, costs=COSTS, max_tensor=65536 * 64 * 4 * 4)
    ubatch_scores = 65536 * 128 * 4 * 4
    on_host = HostAttention(True, ubatch_scores, ubatch_scores + 2 * 65536 * 32 * 2)
    assert attention_on_host(dense, off, 65536 * 64 * 4 * 4) == on_host
    per_token = 32 * 64 + 16 * 96 + 4 * 4 * 16
    assert one_token == 64 * per_token + 65536 * 64 * 4 * 5 + dense.vocab_size * 4 * 64 + 1000
