"""KV-cache arithmetic as llama.cpp 0.6.0-dev does it: context resolution, caches, buffers.

Owns the rules of src/llama-context.cpp (n_ctx padding, streams), src/llama-kv-cache*.cpp (cells, SWA
size, per-layer tensors; the sparse-attention memories' extra caches and compressor states),
src/llama-memory-recurrent.cpp, src/llama-memory-hybrid*.cpp, common/fit.cpp (n_ctx when -c is unset) and
ggml-backend.cpp (packing tensors into buffers). Pure: values in, values out.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Protocol

from safe_llama.model.cache_types import CACHE_TYPE_SIZES

if TYPE_CHECKING:  # a sparse-attention model's own module: imported where its caches are sized
    from safe_llama.model.sparse import SparseMemory

PAD = 256  # GGML_PAD(n_ctx, 256) in llama_context; the SWA cache is padded the same way
TENSOR_ALIGNMENT = 32  # ggml-impl.h; the CPU buffer type's alignment
DEFAULT_N_BATCH = 2048
DEFAULT_N_UBATCH = 512
SERVER_AUTO_SLOTS = 4  # llama-server with no -np: 4 slots sharing one unified KV


class LayerLike(Protocol):
    @property
    def has_kv(self) -> bool: ...
    @property
    def swa(self) -> bool: ...
    @property
    def recurrent(self) -> bool: ...
    @property
    def n_embd_k_gqa(self) -> int: ...
    @property
    def n_embd_v_gqa(self) -> int: ...
    @property
    def n_embd_r(self) -> int: ...
    @property
    def n_embd_s(self) -> int: ...
    @property
    def n_embd_k_idx(self) -> int: ...


class FactsLike(Protocol):
    @property
    def context_length(self) -> int: ...
    @property
    def sliding_window(self) -> int: ...
    @property
    def is_mla(self) -> bool: ...
    @property
    def layers(self) -> Sequence[LayerLike]: ...
    @property
    def sparse(self) -> SparseMemory | None: ...


@dataclass(frozen=True)
class KvRequest:
    """The memory-relevant part of a llama.cpp command line, already resolved from flags and env."""

    tool: str  # cli | server | completion
    n_ctx: int | None = None  # None: -c not given; 0: the model's context
    n_parallel: int | None = None  # None: the tool's default
    kv_unified: bool | None = None
    n_batch: int = DEFAULT_N_BATCH
    n_ubatch: int = DEFAULT_N_UBATCH
    swa_full: bool = False
    type_k: str = "f16"
    type_v: str = "f16"
    flash_attn: str = "auto"  # on | off | auto
    fit: bool = True
    kv_unified_per_slot: int = 0


# the kinds of the DSV4 compressor states (llama_dsv4_comp_state), which are no KV cache
STATE_KINDS = ("csa state", "hca state", "lid state")


@dataclass(frozen=True)
class Cache:
    """One cache llama.cpp allocates for a context (full, sliding-window, recurrent...): its cells, rows and bytes."""

    # full | swa | indexer | recurrent; DSV4: csa | hca (compressed K) and the STATE_KINDS
    kind: str
    cells: int
    layers: int
    n_seq_max: int
    n_stream: int
    type_k: str
    type_v: str
    k_bytes: int
    v_bytes: int
    tensor_bytes: tuple[int, ...] = field(repr=False)  # in creation order: per layer K then V
    p_bytes: int = 0  # recurrent: the PLE conv rows (llama_memory_recurrent's P)

    @property
    def total_bytes(self) -> int:
        return self.k_bytes + self.v_bytes + self.p_bytes


@dataclass(frozen=True)
class Context:
    """The context llama.cpp builds from a request: its cells, per sequence and per stream, and its batches."""

    n_ctx: int
    n_ctx_seq: int
    n_seq_max: int
    n_stream: int
    unified: bool
    n_batch: int
    n_ubatch: int


@dataclass(frozen=True)
class KvPlan:
    """Every cache of one context, as llama.cpp would allocate them."""

    context: Context
    caches: tuple[Cache, ...]
    flash_attn: bool
    notes: tuple[str, ...] = ()

    @property
    def total_bytes(self) -> int:
        return sum(c.total_bytes for c in self.caches)


def pad(n: int, to: int = PAD) -> int:
    return (n + to - 1) // to * to


def _sizes(type_name: str) -> tuple[int, int]:
    known = CACHE_TYPE_SIZES.get(type_name)
    if known is not None:
        return known
    from safe_llama.model.gguf_constants import constants  # a type cache_types does not list: rare

    c = constants()
    block, size = c.GGML_QUANT_SIZES[c.GGMLQuantizationType[type_name.upper()]]
    return int(block), int(size)


def row_bytes(type_name: str, n: int) -> int:
    """ggml_row_size: bytes of n elements of a ggml type."""
    block, size = _sizes(type_name)
    return size * n // block


def block_size(type_name: str) -> int:
    return _sizes(type_name)[0]


def resolve_slots(req: KvRequest) -> tuple[int, bool]:
    """(n_seq_max, unified) as the tool sets them up."""
    if req.tool == "server" and (req.n_parallel is None or req.n_parallel < 0):
        return SERVER_AUTO_SLOTS, True  # tools/server/server.cpp: auto -> 4 slots, unified
    n_seq = max(1, req.n_parallel or 1)
    return n_seq, bool(req.kv_unified)


def ctx_unit(req: KvRequest) -> int:
    """The step between the contexts llama.cpp makes of a request: PAD cells, times the slots when each
    slot has a stream of its own (the context is split between them, and each share padded)."""
    n_seq_max, unified = resolve_slots(req)
    return PAD * (1 if unified else n_seq_max)


def resolve_context(req: KvRequest, n_ctx_train: int) -> Context:
    n_seq_max, unified = resolve_slots(req)
    n_stream = 1 if unified else n_seq_max
    n_ctx = req.n_ctx or 0
    if n_ctx == 0 and req.tool == "server" and req.kv_unified_per_slot > 0 and req.n_ctx is None:
        n_ctx = n_seq_max * req.kv_unified_per_slot
    if n_ctx == 0:
        # common/fit.cpp resolves an unset context to the trained one per stream; without --fit,
        # llama_context takes the trained context in total.
        n_ctx = n_ctx_train * n_stream if req.fit else n_ctx_train
    # llama_context: with causal attention n_batch is capped by the (unpadded) context
    n_batch = min(n_ctx, req.n_batch)
    n_ubatch = min(n_batch, req.n_ubatch or req.n_batch)
    n_ctx = pad(n_ctx)
    if unified:
        n_ctx_seq = n_ctx
    else:
        n_ctx_seq = pad(n_ctx // n_seq_max)
        n_ctx = n_ctx_seq * n_seq_max
    return Context(n_ctx, n_ctx_seq, n_seq_max, n_stream, unified, n_batch, n_ubatch)


def _attention_cache(
    kind: str, layers: Sequence[LayerLike], cells: int, ctx: Context, req: KvRequest, mla: bool, v_trans: bool
) -> Cache:
    v_width_max = max((lay.n_embd_v_gqa for lay in layers), default=0)
    tensors: list[int] = []
    k_total = v_total = 0
    for lay in layers:
        k = row_bytes(req.type_k, lay.n_embd_k_gqa) * cells * ctx.n_stream
        tensors.append(k)
        k_total += k
        if not mla:  # MLA caches K only
            width = v_width_max if v_trans else lay.n_embd_v_gqa
            v = row_bytes(req.type_v, width) * cells * ctx.n_stream
            tensors.append(v)
            v_total += v
    return Cache(
        kind,
        cells,
        len(layers),
        ctx.n_seq_max,
        ctx.n_stream,
        req.type_k,
        req.type_v,
        k_total,
        v_total,
        tuple(tensors),
    )


def _rows_cache(
    kind: str, rows: Sequence[tuple[int, int]], cells: int, n_seq_max: int, n_stream: int, req: KvRequest
) -> Cache:
    """A llama_kv_cache of these (K, V) rows per layer (V 0: K only), in creation order."""
    tensors: list[int] = []
    k_total = v_total = 0
    for k_width, v_width in rows:
        k = row_bytes(req.type_k, k_width) * cells * n_stream
        tensors.append(k)
        k_total += k
        if v_width:
            v = row_bytes(req.type_v, v_width) * cells * n_stream
            tensors.append(v)
            v_total += v
    return Cache(kind, cells, len(rows), n_seq_max, n_stream, req.type_k, req.type_v, k_total, v_total, tuple(tensors))


def _dsv4_caches(facts: FactsLike, sparse: SparseMemory, ctx: Context, req: KvRequest) -> list[Cache]:
    """llama_kv_cache_dsv4 (src/llama-kv-cache-dsv4.cpp): a raw K-only iSWA cache, the CSA and HCA
    compressed K caches and the lightning-indexer cache, each with a stream per sequence whatever -kvu says,
    then the f32 compressor states (kv and score planes per layer)."""
    from safe_llama.model.sparse import DSV4_CSA_RATIO, DSV4_HCA_RATIO

    n_seq = ctx.n_seq_max
    kv_size = ctx.n_ctx_seq
    layers = [(il, lay) for il, lay in enumerate(facts.layers) if lay.has_kv]
    size_swa = kv_size if req.swa_full else pad(min(kv_size, facts.sliding_window + ctx.n_ubatch))
    caches = [
        _rows_cache("full", [(lay.n_embd_k_gqa, 0) for _, lay in layers if not lay.swa], kv_size, n_seq, n_seq, req),
        _rows_cache("swa", [(lay.n_embd_k_gqa, 0) for _, lay in layers if lay.swa], size_swa, n_seq, n_seq, req),
    ]
    ratio = sparse.compress
    for kind, wanted in (("csa", DSV4_CSA_RATIO), ("hca", DSV4_HCA_RATIO)):
        cells = pad(max(1, -(-kv_size // wanted)))
        rows = [(lay.n_embd_k_gqa, 0) for il, lay in layers if ratio[il] == wanted]
        caches.append(_rows_cache(kind, rows, cells, n_seq, n_seq, req))
    lid_rows = [(lay.n_embd_k_idx, 0) for il, lay in layers if ratio[il] == DSV4_CSA_RATIO]
    caches.append(_rows_cache("indexer", lid_rows, pad(max(1, -(-kv_size // DSV4_CSA_RATIO))), n_seq, n_seq, req))
    planes = n_seq  # n_stream x (1 + n_rs_seq); rollback snapshots only come with a speculative draft
    head_k = sparse.state_head_k
    for kind, wanted, size, width in (
        ("csa state", DSV4_CSA_RATIO, 2 * DSV4_CSA_RATIO, 2 * head_k),
        ("hca state", DSV4_HCA_RATIO, DSV4_HCA_RATIO, head_k),
        ("lid state", DSV4_CSA_RATIO, 2 * DSV4_CSA_RATIO, 2 * sparse.indexer_head),
    ):
        n = sum(1 for il in range(sparse.n_layer) if ratio[il] == wanted)
        plane = row_bytes("f32", width) * size * planes
        caches.append(Cache(kind, size, n, n_seq, planes, "f32", "f32", plane * n, plane * n, (plane,) * (2 * n)))
    return caches


def plan_kv(facts: FactsLike, req: KvRequest) -> KvPlan:
    """Every cache llama.cpp creates for this model and request, in creation order (non-SWA first)."""
    ctx = resolve_context(req, facts.context_length)
    quantized_v = req.type_v not in ("f32", "f16", "bf16")
    flash = req.flash_attn == "on" or (req.flash_attn == "auto")
    notes: list[str] = []
    if req.flash_attn == "auto":
        notes.append("flash attention 'auto' assumed on (as on the CPU backend)")
    if quantized_v and req.flash_attn == "off":
        notes.append("quantized V cache requires flash attention: llama.cpp will refuse -fa off")
    v_trans = not flash
    sparse = facts.sparse
    if sparse is not None and sparse.kind == "dsv4":
        return KvPlan(ctx, tuple(_dsv4_caches(facts, sparse, ctx, req)), flash, tuple(notes))
    attn = [lay for lay in facts.layers if lay.has_kv]  # falcon-h1 layers attend and recur both
    full = [lay for lay in attn if not lay.swa]
    swa = [lay for lay in attn if lay.swa]
    caches: list[Cache] = []
    if swa and facts.sliding_window > 0:
        cells_swa = pad(min(ctx.n_ctx_seq, facts.sliding_window * (ctx.n_seq_max if ctx.unified else 1) + ctx.n_ubatch))
        if req.swa_full:
            cells_swa = ctx.n_ctx_seq
        caches.append(_attention_cache("full", full, ctx.n_ctx_seq, ctx, req, facts.is_mla, v_trans))
        caches.append(_attention_cache("swa", swa, cells_swa, ctx, req, facts.is_mla, v_trans))
    elif attn:
        caches.append(_attention_cache("full", attn, ctx.n_ctx_seq, ctx, req, facts.is_mla, v_trans))
    indexed = [(il, lay) for il, lay in enumerate(facts.layers) if lay.n_embd_k_idx > 0]
    if indexed:
        # the indexer cache: the same cells, one indexer key head per indexed layer; K only (llama_kv_cache_dsa,
        # llama_memory_hybrid_idx) or with one value head of the model's (llama_kv_cache_msa)
        with_v = sparse is not None and sparse.kind == "msa"
        rows = [
            (lay.n_embd_k_idx, (sparse.idx_v_max if v_trans else sparse.idx_v[il]) if with_v and sparse else 0)
            for il, lay in indexed
        ]
        index = _rows_cache("indexer", rows, ctx.n_ctx_seq, ctx.n_seq_max, ctx.n_stream, req)
        # llama_kv_cache_dsa_iswa makes its DSA pair (full, indexer) before the SWA cache
        at = len(caches) - 1 if sparse is not None and sparse.kind == "dsa_iswa" and len(caches) == 2 else len(caches)
        caches.insert(at, index)
    recurrent = [(il, lay) for il, lay in enumerate(facts.layers) if lay.recurrent]
    if recurrent:
        rows_rs = max(1, ctx.n_seq_max)
        tensors: list[int] = []
        p = 0
        for il, lay in recurrent:
            tensors += [row_bytes("f32", lay.n_embd_r) * rows_rs, row_bytes("f32", lay.n_embd_s) * rows_rs]
            ple = sparse.ple_rows[il] if sparse is not None and sparse.ple_rows else 0
            if ple:
                tensors.append(row_bytes("f32", ple) * rows_rs)
                p += tensors[-1]
        r = sum(row_bytes("f32", lay.n_embd_r) * rows_rs for _, lay in recurrent)
        s = sum(row_bytes("f32", lay.n_embd_s) * rows_rs for _, lay in recurrent)
        caches.append(
            Cache("recurrent", rows_rs, len(recurrent), ctx.n_seq_max, 1, "f32", "f32", r, s, tuple(tensors), p)
        )
    return KvPlan(ctx, tuple(caches), flash, tuple(notes))


def buffers(tensor_bytes: Sequence[int], max_size: int | None, alignment: int = TENSOR_ALIGNMENT) -> list[int]:
    """Buffer sizes ggml_backend_buft_alloc_buffer_n_plan makes: whole tensors packed up to max_size.

    A tensor larger than max_size gets a buffer of its own (and the device then refuses it).
    """
    out: list[int] = []
    current = 0
    for size in tensor_bytes:
        this = pad(size, alignment)
        if max_size is not None and current > 0 and current + this > max_size:
            out.append(current)
            current = this
        else:
            current += this
    if current > 0:
        out.append(current)
    return out


def cache_buffers(cache: Cache, max_size: int | None, alignment: int = TENSOR_ALIGNMENT) -> list[int]:
    return buffers(cache.tensor_bytes, max_size, alignment)


def f32_mib(n: int) -> str:
    """n bytes as llama.cpp prints a KV size: float32 MiB with 2 decimals."""
    import struct

    value = struct.unpack("f", struct.pack("f", float(n)))[0] / struct.unpack("f", struct.pack("f", 1048576.0))[0]
    value = struct.unpack("f", struct.pack("f", value))[0]
    return f"{value:.2f}"


def mib_line(cache: Cache) -> tuple[str, str, str]:
    """Total, K and V as llama.cpp prints them: float32 MiB with 2 decimals."""
    return f32_mib(cache.total_bytes), f32_mib(cache.k_bytes), f32_mib(cache.v_bytes)
