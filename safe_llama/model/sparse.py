"""The sparse-attention memories of the pinned llama.cpp, read from a header: llama_kv_cache_dsv4
(deepseek4), llama_kv_cache_dsa_iswa (dots3note), llama_kv_cache_msa (minimax-m3) and llama_memory_hybrid_idx
(glm5-next, qwen4exp), as create_memory (src/llama-model.cpp) and their constructors build them.

Owns the readings that shape their extra caches (indexer rows, compression ratios, PLE conv rows, compressor
states); must not size caches over a context (model.kv does)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

TYPE_CHECKING = False  # typing.TYPE_CHECKING without importing typing (mypy reads the name)
if TYPE_CHECKING:  # read_sparse's arguments: a warm plan reads SparseMemory from the facts cache, no header
    from safe_llama.model.arch import ArchRule
    from safe_llama.model.hparams import Meta

SparseKind = Literal["dsv4", "dsa_iswa", "msa", "hybrid_idx"]
# src/llama-kv-cache-dsv4.cpp: the compression ratios with a cache of their own
DSV4_CSA_RATIO = 4  # compressed sparse attention: a compressed K cache, an indexer cache and their states
DSV4_HCA_RATIO = 128  # heavily compressed attention: a compressed K cache and its state
# llama_hparams::indexer_kpool_row: glm5-next caches key | gate | pooled side by side (qwen4exp: 2)
KPOOL_ROW_DEFAULT = 3
KPOOL_ROW_QWEN4EXP = 2


@dataclass(frozen=True)
class SparseMemory:
    """What a sparse-attention memory holds beyond the attention layers' own K/V (model.facts keeps those).

    Per-layer tuples have one entry per layer (llama.cpp's n_layer_all); 0 means none.
    """

    kind: SparseKind
    idx_k: tuple[int, ...]  # the indexer cache's K row of each layer (elements)
    idx_v: tuple[int, ...] = ()  # ...and its V row (msa keeps a V; the others are K-only)
    idx_v_max: int = 0  # the V width every indexer row is padded to without flash attention
    compress: tuple[int, ...] = ()  # dsv4: each layer's compression ratio (4: CSA, 128: HCA)
    state_head_k: int = 0  # dsv4: n_embd_head_k() (layer 0), the width of the compressor states
    indexer_head: int = 0  # dsv4: indexer_head_size, the width of the indexer's compressor state
    n_layer: int = 0  # dsv4: the trunk layers (n_layer()), which the compressor states loop
    ple_rows: tuple[int, ...] = ()  # qwen4exp: the f32 PLE conv history per sequence (cache_ple_r_l)


def read_sparse(
    m: Meta,
    rule: ArchRule,
    *,
    n_layer_all: int,
    n_layer: int,
    n_embd: int,
    head_k: tuple[int, ...],
    head_v: tuple[int, ...],
    attends: list[bool],
    recurrent: list[bool],
) -> SparseMemory | None:
    """The extra memory of rule.sparse's class (None for every other architecture).

    head_k/head_v: each layer's head dims as the model's hparams have them (SWA layers their own)."""
    kind = rule.sparse
    if not kind:
        return None
    if kind == "dsa_iswa":
        # the indexer rows come from the DSA reading (model.hparams.indexed_layers); only the order differs
        return SparseMemory(kind, (0,) * n_layer_all)
    indexer_head = m.uint(m.k("attention.indexer.key_length"))
    if kind == "msa":
        # create_memory: every layer past the leading dense ones; one key head of indexer_head_size and one
        # value head of the model's own head dim (llama_kv_cache_msa changes n_head_kv and the K dim only)
        dense_lead = m.uint(m.k("leading_dense_block_count"), default=0)
        rows = [il >= dense_lead for il in range(n_layer_all)]
        return SparseMemory(
            kind,
            tuple(indexer_head if rows[il] else 0 for il in range(n_layer_all)),
            tuple(head_v[il] if rows[il] else 0 for il in range(n_layer_all)),
            max(head_v, default=0),
        )
    if kind in ("hybrid_idx", "hybrid_qsa"):
        return _hybrid_idx(m, kind == "hybrid_qsa", n_layer_all, n_layer, n_embd, indexer_head, attends, recurrent)
    return _dsv4(m, n_layer_all, n_layer, head_k, indexer_head)


def _hybrid_idx(
    m: Meta,
    qwen4exp: bool,
    n_layer_all: int,
    n_layer: int,
    n_embd: int,
    indexer_head: int,
    attends: list[bool],
    recurrent: list[bool],
) -> SparseMemory:
    if qwen4exp:
        # load_arch_hparams: the k-pool is the one nonzero compression ratio (QSA layers)
        ratios = m.per_layer(m.k("attention.compress_ratios"), n_layer_all, (0,) * n_layer_all)
        kpool = next((r for r in ratios if r), 0)
        row = KPOOL_ROW_QWEN4EXP
        full = [True] * n_layer_all
    else:
        kpool = m.uint(m.k("attention.indexer.kpool"))
        row = KPOOL_ROW_DEFAULT
        flags = m.per_layer(m.k("attention.indexer.types"), n_layer, (1,) * n_layer, flags=True)
        full = [il < n_layer and flags[il] != 0 for il in range(n_layer_all)]
    width = indexer_head * (row if kpool > 0 else 1)
    idx_k = tuple(width if attends[il] and il < n_layer and full[il] else 0 for il in range(n_layer_all))
    ple = [0] * n_layer_all
    ple_layers = m.metadata.get(m.k("ple.layers"))
    if qwen4exp and isinstance(ple_layers, tuple) and ple_layers:
        ngram = m.uint(m.k("ple.ngram_size"))
        heads = (ngram - 1) * m.uint(m.k("ple.heads_per_ngram"))
        kernel = m.uint(m.k("ple.conv_kernel"))
        hc_mult = m.uint(m.k("hyper_connection.count"))
        if heads > 0 and kernel > 0:
            # llama_hparams::ple_conv_state: dilation equals the n-gram size
            for il in m.array(m.k("ple.layers"), flags=False, limit=n_layer_all):
                if il < n_layer_all and recurrent[il]:
                    ple[il] = (kernel - 1) * ngram * hc_mult * n_embd
    return SparseMemory("hybrid_idx", idx_k, ple_rows=tuple(ple))


def _dsv4(m: Meta, n_layer_all: int, n_layer: int, head_k: tuple[int, ...], indexer_head: int) -> SparseMemory:
    key = m.k("attention.compress_ratios")
    ratios = m.array(key, flags=False, limit=512)
    if len(ratios) < n_layer_all:
        m.fail(f"key {key} has {len(ratios)} entries, fewer than the {n_layer_all} layers")
    compress = tuple(ratios[:n_layer_all])
    idx_k = tuple(indexer_head if r == DSV4_CSA_RATIO else 0 for r in compress)
    return SparseMemory(
        "dsv4",
        idx_k,
        compress=compress,
        state_head_k=head_k[0],
        indexer_head=indexer_head,
        n_layer=n_layer,
    )
