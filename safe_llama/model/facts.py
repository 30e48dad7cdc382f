"""What a GGUF header means for memory: per-layer KV widths, sliding windows, recurrent state, weights.

Owns ModelFacts, the values every layer above plans with (model.header_facts assembles them from one header;
model.facts_cache keeps them per file, so a warm plan imports neither the header's reader nor the
architectures' rules); must not read files, nor do KV arithmetic over context sizes (model.kv and the
planner do).
"""

from __future__ import annotations

from dataclasses import dataclass

TYPE_CHECKING = False  # typing.TYPE_CHECKING without importing typing (mypy reads the name)
if TYPE_CHECKING:
    from safe_llama.model.arch import SwaType
    from safe_llama.model.sparse import SparseMemory

FACTS_SCHEMA = 5  # bump when ModelFacts changes, so cached facts from an older safe-llama are not trusted


@dataclass(frozen=True)
class LayerKV:
    """One layer's cache rows: K and V widths (elements per cell) and recurrent state (f32 per sequence)."""

    has_kv: bool  # the layer gets K/V tensors in the context's KV cache
    swa: bool  # ...in the sliding-window cache rather than the full one
    recurrent: bool  # the layer gets R/S rows in the recurrent memory
    n_embd_k_gqa: int
    n_embd_v_gqa: int  # 0 for MLA: llama.cpp caches no V
    n_embd_r: int
    n_embd_s: int
    n_embd_k_idx: int = 0  # the layer's row in a sparse-attention indexer key cache (K only); 0: none


@dataclass(frozen=True)
class ModelFacts:
    """One model file's facts the planner needs: its layers' KV widths, windows and recurrent state, its weights."""

    path: str
    file_size: int
    architecture: str
    name: str | None
    known_architecture: bool  # safe-llama has llama.cpp's rules for it
    block_count: int  # all layers, NextN/MTP ones included (llama.cpp's n_layer_all)
    nextn_predict_layers: int  # trailing MTP layers, which get no KV in the main context
    embedding_length: int
    context_length: int  # n_ctx_train
    feed_forward_length: int  # the largest over the layers (0 if absent)
    vocab_size: int  # tokens in the tokenizer (0 if the file has none)
    head_count: tuple[int, ...]  # per layer
    head_count_kv: tuple[int, ...]
    key_length: tuple[int, ...]  # head dims, per layer (SWA layers may differ)
    value_length: tuple[int, ...]
    layers: tuple[LayerKV, ...]
    sliding_window: int  # 0 = no sliding window
    swa_type: SwaType
    is_mla: bool
    is_recurrent: bool  # recurrent memory only (mamba, rwkv)
    is_hybrid: bool  # recurrent memory and a KV cache (jamba, qwen3-next, ...)
    n_layer_kv_from_start: int  # -1: every layer has its own KV; else only the first N
    weight_bytes_per_layer: tuple[int, ...]  # tensors named blk.{il}.*
    other_weight_bytes: int  # token_embd, output, norms outside the blocks
    notes: tuple[str, ...]
    tensors: tuple[tuple[str, int], ...] = ()  # (name, bytes) of every tensor: where -ot / -ncmoe put them
    tensor_types: tuple[str, ...] = ()  # ggml type of each tensor in `tensors` (lower case: q4_0, q4_k, f16)
    sparse: SparseMemory | None = None  # a sparse-attention memory's extra caches (model.sparse)

    @property
    def is_swa_model(self) -> bool:
        """llama.cpp builds two caches (iSWA): full-attention layers and sliding-window layers."""
        return self.swa_type != "none"

    @property
    def total_weight_bytes(self) -> int:
        return sum(self.weight_bytes_per_layer) + self.other_weight_bytes

    @property
    def n_embd_v_gqa_max(self) -> int:
        """The V width every layer is padded to when flash attention is off and widths vary
        (llama-kv-cache.cpp, [TAG_V_CACHE_VARIABLE])."""
        return max((layer.n_embd_v_gqa for layer in self.layers), default=0)
