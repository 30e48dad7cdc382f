"""The compute buffers llama.cpp reserves for its worst-case graphs (src/llama-context.cpp sched_reserve):
activations of one ubatch, the logits, the attention mask, CUDA's f16 copies of a quantized K/V, the inputs
staged on the host beside a GPU, and the attention a device cannot run, on the host; calibrated by [compute] in
configs/planner.toml.

Owns that estimate; must not place it (plan.memory does) nor read anything but the packaged policy."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from functools import cache

from safe_llama.model.facts import ModelFacts
from safe_llama.model.kv import STATE_KINDS, Cache, KvPlan, KvRequest, row_bytes
from safe_llama.paths import packaged_configs
from safe_llama.plan.policy import ComputeCosts, Policy, load_policy
from safe_llama.plan.target import Target


def compute_estimate(
    facts: ModelFacts,
    kv: KvPlan,
    req: KvRequest | None = None,
    *,
    kv_f16_copies: bool = False,
    kv_on_host: bool = False,
    costs: ComputeCosts | None = None,
    expert_ff: int = 0,
    max_tensor: int | None = None,
) -> int:
    """An upper estimate of the compute buffers llama.cpp reserves for its worst-case graphs (the
    `sched_reserve: <device> compute buffer size` lines). src/llama-context.cpp sched_reserve reserves the
    prompt's graph (n_ubatch tokens) and one token per sequence's (n_seq_max), and each device's buffer keeps
    the larger of the two (ggml-alloc's gallocr never shrinks one); per graph of n_tokens tokens:

    - activations of one ubatch: n_tokens x (a n_embd + b n_ff) bytes, a and b from [compute] in
      configs/planner.toml (`costs`; None: the packaged file's); where attention is wider than that (its Q, K,
      V and output rows, c bytes per element of each), n_tokens x (c attention width + a n_embd);
    - the logits of the outputs one ubatch may hold, n_vocab x n_outputs x 4 bytes: llama-cli and
      llama-completion leave n_outputs_max at 0 (= n_batch), so n_outputs = n_tokens; llama-server sets it to
      one per slot (tools/server/server-context.cpp server_output_limits). The bundled model's 262,144-token
      vocabulary makes this 512 MiB for llama-completion and 4 MiB for llama-server at -np 4;
    - the attention mask, n_kv x n_tokens: f16 with flash attention (measured: 1,003 bytes per cell at
      -ub 512 on the CPU build), f32 scores per head without it (an upper bound); none for a cache whose
      attention runs on the host (`max_tensor`, see attention_on_host);
    - with `kv_f16_copies` and a quantized K or V under flash attention: f16 copies of one layer's K and V
      for the whole context (measured on an H200 with CUDA: 2 x 2 x 4096 bytes per cell for 16 KV heads
      of 256, beside the 2 x 512-byte mask row);
    - with `kv_f16_copies` and `kv_on_host` (the KV in host memory, -ngl 0 or -nkvo, while the device runs
      the attention: llama.cpp's op offload): one layer's K and V copied to the device in their cache types
      as well (measured on the H200 at -ngl 0: 45,688.25 MiB at 1,832,448 cells of q8_0, 26,144 bytes per
      cell = 2 x 4,352 copied + 2 x 8,192 f16 + 1,024 mask + the fixed part);
    - with MoE experts on the device (`expert_ff`: n_expert x the experts' n_ff, see expert_ff_width): the
      experts' activations for every expert, as n_ff in the activations above (measured on an H200 with
      CUDA: 16 experts of n_ff 2048, n_embd 2048, -ub 512, -c 8192: a 296.01 MiB compute buffer where the
      dense terms give 56 MiB; 16 x 2048 x 512 x 16 bytes more bounds it). With every expert on the host
      (-cmoe) the device's buffer had no such part (27,665.28 against 27,661.03 MiB dense, issue 13).

    The one-token graph is the larger only where -np is above -ub, or where the prompt's attention runs on the
    host: on the H200 with Vulkan, -fa off at 515,840 cells and -np 4, its scores (4 tokens x 16 heads,
    125.94 MiB) and mask made the 134.18 MiB logged, where the prompt's graph needs about 65 MiB there.
    """
    costs = costs or packaged_compute_costs()
    return max(
        _graph_bytes(facts, kv, req, n_tokens, kv_f16_copies, kv_on_host, costs, expert_ff, max_tensor)
        for n_tokens in _graph_tokens(kv)
    )


def _graph_tokens(kv: KvPlan) -> tuple[int, int]:
    """The tokens of the two graphs sched_reserve reserves: one ubatch, and one token per sequence."""
    return kv.context.n_ubatch, max(kv.context.n_seq_max, 1)


def _graph_bytes(
    facts: ModelFacts,
    kv: KvPlan,
    req: KvRequest | None,
    n_tokens: int,
    kv_f16_copies: bool,
    kv_on_host: bool,
    costs: ComputeCosts,
    expert_ff: int,
    max_tensor: int | None,
) -> int:
    """One graph's compute buffer on the device that runs it (see compute_estimate)."""
    ctx = kv.context
    n_embd = facts.embedding_length
    n_ff = max(facts.feed_forward_length, expert_ff)
    n_kv = _n_kv(kv)
    per_token = costs.activation_bytes_per_embd * n_embd + costs.activation_bytes_per_ff * n_ff
    # attention wider than the embedding (many or large heads): its Q, K, V and output rows are what is live
    attention = max(
        (
            h * k + layer.n_embd_k_gqa + layer.n_embd_v_gqa + h * v
            for h, k, v, layer in zip(
                facts.head_count, facts.key_length, facts.value_length, facts.layers, strict=False
            )
        ),
        default=0,
    )
    per_token = max(
        per_token, costs.activation_bytes_per_attention * attention + costs.activation_bytes_per_embd * n_embd
    )
    mask = _attention_bytes(facts, kv, n_tokens, max_tensor)
    logits = _logits(facts, kv, req, n_tokens)
    copies = 0
    width_k = max((layer.n_embd_k_gqa for layer in facts.layers if layer.has_kv), default=0)
    width_v = max((layer.n_embd_v_gqa for layer in facts.layers if layer.has_kv), default=0)
    # the copies cover one layer's K and V in every stream (its view spans them all): -np 16 -no-kvu converts
    # 16 streams of n_ctx_seq cells, the whole cache's length (H200: 4,152.28 MiB at -np 16 and 262,144 cells)
    cells = n_kv * ctx.n_stream
    if kv_f16_copies and kv.flash_attn and req is not None:
        per_cell = (2 * width_k if req.type_k != "f16" else 0) + (2 * width_v if req.type_v != "f16" else 0)
        copies = cells * per_cell
    if kv_f16_copies and kv_on_host and req is not None:
        # ... and each layer's input goes over as well (H200 -ngl 0: 8 MiB at -ub 512, n_embd 4096)
        copies += cells * (row_bytes(req.type_k, width_k) + row_bytes(req.type_v, width_v)) + n_tokens * 4 * n_embd
    # without flash attention the heads' outputs are permuted and made contiguous (build_attn_mha's ggml_cont):
    # one f32 row more per token (H200: 56 MiB against 48 at -ub 512, 16 heads of 256); where the attention runs
    # on the host, the device also holds the copy of those outputs the scheduler makes (lavapipe, 16 heads of
    # 64, -ub 512 / 4096: 16.01 / 128.08 MiB, 8 rows of n_embd where 7 were planned)
    heads_out = max((h * v for h, v in zip(facts.head_count, facts.value_length, strict=False)), default=0)
    merged = 0 if kv.flash_attn else 4 * heads_out * (2 if _falling(facts, kv, n_tokens, max_tensor) else 1)
    # the graph's small inputs (positions, output ids, the KV rows written; 0.02 - 0.28 MiB on the H200)
    return n_tokens * (per_token + merged) + mask + logits + copies + costs.graph_inputs_bytes


def _n_kv(kv: KvPlan) -> int:
    """The cells one attention reads at most: the largest KV cache (not recurrent state nor DSV4's states)."""
    return max((c.cells for c in _attention_caches(kv)), default=kv.context.n_ctx_seq)


def _attention_caches(kv: KvPlan) -> list[Cache]:
    return [c for c in kv.caches if c.kind not in ("recurrent", *STATE_KINDS)]


def _attention_bytes(facts: ModelFacts, kv: KvPlan, n_tokens: int, max_tensor: int | None = None) -> int:
    """The attention mask, n_kv x n_tokens: f16 with flash attention; without it the f32 mask and the f32
    scores of every head (KQ, soft_max'ed in place). n_kv is one stream's cells: each stream's mask holds its
    share of the ubatch (llama-graph.cpp build_attn_inp_kq_mask: n_tokens / n_stream rows per stream). A cache
    whose attention runs on the host (max_tensor, see attention_on_host) has neither on the device."""
    per_cell = 2 if kv.flash_attn else 4 * (max(facts.head_count, default=1) + 1)
    on_host = _falling(facts, kv, n_tokens, max_tensor)
    staying = [c.cells for c in _attention_caches(kv) if c not in on_host]
    if on_host and not staying:
        return 0
    return max(staying, default=kv.context.n_ctx_seq) * n_tokens * per_cell


@dataclass(frozen=True)
class HostAttention:
    """Attention a device cannot run, as ggml's scheduler runs it on the CPU instead.

    ggml-vulkan.cpp ggml_backend_vk_device_supports_op refuses an operation whose result or any input is larger
    than maxStorageBufferRange (without VK_EXT_shader_64bit_indexing, which the pinned build's headers lack).
    Without flash attention that is the KQ scores, n_kv x n_tokens x n_head f32 (llama-graph.cpp
    build_attn_mha: ggml_mul_mat(k, q), then soft_max in place and ggml_mul_mat(v, kq), each taking them); with
    it the f16 mask, n_kv x n_tokens (ggml_flash_attn_ext's input). ggml-backend.cpp ggml_backend_sched_split_graph
    then gives those operations to the CPU and copies their inputs from device buffers into the CPU's compute
    buffer (ggml_dup_tensor_layout: the K and V views of one layer, every stream; Q): gallocr frees a layer's
    copies and scores after its last use, so the host holds one layer's at a time. The mask is a graph input
    and is on the host already; the device no longer holds its copy of it, nor the scores.

    Measured on an H200 with Vulkan (4 GiB - 1 range): -fa off at 515,840 cells of f16, 16 heads of 256: host
    25,235.51 MiB = the usual inputs 1,056.5 + scores 16,120 + K and V 2 x 4,030; -ub 4096 with q8_0 and flash
    attention at 970,752 cells (mask 7,584 MiB): 15,898.41 = 7,841 + 2 x 4,029. The Q copy and the heads'
    output (one f32 row of n_head x head_dim per token each) take the room of the inputs copied to the device
    before them (n_embd f32 rows per token: the embeddings, the V rows' indices)."""

    scores: bool  # the KQ scores are over the limit (without flash attention); False: the mask (with it)
    tensor_bytes: int  # that tensor, in the graph of one ubatch
    host_bytes: int  # what the host's compute buffer holds for it: the scores and one layer's K and V


def attention_on_host(
    facts: ModelFacts, kv: KvPlan, max_tensor: int | None, n_tokens: int | None = None
) -> HostAttention | None:
    """The attention of the graph of n_tokens (None: one ubatch) that a device whose operations take no tensor
    above max_tensor leaves to the host (see HostAttention); None where every cache's stays on the device."""
    n_tokens = kv.context.n_ubatch if n_tokens is None else n_tokens
    falling = _falling(facts, kv, n_tokens, max_tensor)
    if not falling:
        return None

    def held(c: Cache) -> int:
        k_tensors = c.tensor_bytes[0::2] if c.v_bytes else c.tensor_bytes
        v_tensors = c.tensor_bytes[1::2] if c.v_bytes else ()
        scores = 0 if kv.flash_attn else _largest_attention_tensor(facts, kv, c.cells, n_tokens)
        return scores + max(k_tensors, default=0) + max(v_tensors, default=0)

    # the layers run one after another: the host holds the largest layer's at a time
    widest = max(falling, key=held)
    return HostAttention(not kv.flash_attn, _largest_attention_tensor(facts, kv, widest.cells, n_tokens), held(widest))


def _falling(facts: ModelFacts, kv: KvPlan, n_tokens: int, max_tensor: int | None) -> list[Cache]:
    if max_tensor is None:
        return []
    return [c for c in _attention_caches(kv) if _largest_attention_tensor(facts, kv, c.cells, n_tokens) > max_tensor]


def _largest_attention_tensor(facts: ModelFacts, kv: KvPlan, cells: int, n_tokens: int) -> int:
    """The attention's largest tensor over a cache of `cells` per stream: the f16 mask with flash attention, the
    f32 scores of every head without (the f32 mask is a head's share of them)."""
    if kv.flash_attn:
        return cells * n_tokens * 2
    return cells * n_tokens * max(facts.head_count, default=1) * 4


def logits_bytes(facts: ModelFacts, kv: KvPlan, req: KvRequest | None) -> int:
    """The logits of the outputs one ubatch may hold (see compute_estimate)."""
    return _logits(facts, kv, req, kv.context.n_ubatch)


def _logits(facts: ModelFacts, kv: KvPlan, req: KvRequest | None, n_tokens: int) -> int:
    tool = req.tool if req is not None else "server"
    n_outputs = max(kv.context.n_seq_max, 1) if tool == "server" else n_tokens
    return facts.vocab_size * 4 * n_outputs


def split_compute(facts: ModelFacts, kv: KvPlan, req: KvRequest | None, costs: ComputeCosts) -> int:
    """One CPU device's graph in a layer split ([compute] split_*), without the logits, the first device's
    inputs from the host and the pipeline's extra copies of the mask (plan.memory adds them where they are)."""
    per_token = costs.split_bytes_per_token + costs.split_bytes_per_embd * facts.embedding_length
    per_token += costs.split_bytes_per_ff * max(facts.feed_forward_length, facts.embedding_length)
    return kv.context.n_ubatch * per_token + _attention_bytes(facts, kv, kv.context.n_ubatch)


def expert_ff_width(facts: ModelFacts) -> int:
    """n_expert x n_ff of the experts, from the largest up-projection of experts (its rows are n_embd wide)."""
    types = dict(zip((name for name, _ in facts.tensors), facts.tensor_types, strict=False))
    widest = 0
    for name, size in facts.tensors:
        if name.endswith(("ffn_up_exps.weight", "ffn_gate_up_exps.weight")):
            row = row_bytes(types.get(name, "f32"), facts.embedding_length)
            widest = max(widest, size // row if row else 0)
    return widest


def device_compute(
    facts: ModelFacts, kv: KvPlan, req: KvRequest, target: Target, placed: Sequence[str], compute: int
) -> dict[str, int]:
    """The compute buffer of each device that runs layers in a layer split (placed: each layer's place, the
    output layer last). CPU devices (RPC workers under a CPU-only head): each from its own place, the first
    taking the host's inputs and the output layer's the logits ([compute] split_*); otherwise `compute`, the
    whole graph's estimate, on each."""
    holders = [p for p in dict.fromkeys(placed[:-1]) if p != "host"]
    costs = target.compute_costs or packaged_compute_costs()
    if target.on_gpu or not costs.split_bytes_per_token:
        return {place: compute for place in holders}
    own = split_compute(facts, kv, req, costs) + target.compute_extra
    first = costs.split_first_bytes_per_embd * facts.embedding_length * kv.context.n_ubatch
    logits = logits_bytes(facts, kv, req)
    return {
        place: own + (first if i == 0 else 0) + (logits if placed[-1] == place else 0)
        for i, place in enumerate(holders)
    }


def input_mask_bytes(kv: KvPlan) -> int:
    """The attention mask a graph takes as input: n_kv x n_ubatch, f16 with flash attention, f32 without."""
    return _n_kv(kv) * kv.context.n_ubatch * (2 if kv.flash_attn else 4)


def host_compute_estimate(
    facts: ModelFacts, kv: KvPlan, costs: ComputeCosts | None = None, max_tensor: int | None = None
) -> int:
    """The host-side compute buffer beside a GPU's, the larger of the two graphs' (see compute_estimate): the
    attention mask (n_kv x n_tokens, f16 with flash attention, f32 without) and the other inputs, per token
    per n_embd ([compute] host_inputs_bytes_per_embd, ..._without_flash) and a few fixed ones
    (graph_inputs_bytes); and the attention a device whose operations take no tensor above `max_tensor` leaves
    to the host (attention_on_host)."""
    costs = costs or packaged_compute_costs()
    per_embd = costs.host_inputs_bytes_per_embd if kv.flash_attn else costs.host_inputs_bytes_per_embd_without_flash

    def graph(n_tokens: int) -> int:
        on_host = attention_on_host(facts, kv, max_tensor, n_tokens)
        # each cache has its mask; beside a device that runs the attention the largest is counted (as the H200's
        # one-cache layouts were fitted), where the host runs it every one (lavapipe, a gemma-3 with --swa-full
        # at 16,384 cells and -fa off: 2 x 32 MiB of f32 masks, 340.02 MiB logged where one gave 311)
        cells = sum(c.cells for c in _attention_caches(kv)) if on_host is not None else _n_kv(kv)
        inputs = cells * n_tokens * (2 if kv.flash_attn else 4) + n_tokens * facts.embedding_length * per_embd
        return inputs + costs.graph_inputs_bytes + (on_host.host_bytes if on_host is not None else 0)

    return max(graph(n_tokens) for n_tokens in _graph_tokens(kv))


def packaged_compute_costs() -> ComputeCosts:
    """[compute] of the packaged configs/planner.toml, for a target made without a policy (tests, tools)."""
    return _packaged_policy().compute


@cache
def _packaged_policy() -> Policy:
    return load_policy(packaged_configs() / "planner.toml")
