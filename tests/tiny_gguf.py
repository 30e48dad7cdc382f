"""Tiny random-weight GGUF models that the real pinned llama.cpp loads and runs (a few hundred KiB each).

Owns writing them with the gguf package's GGUFWriter: llama, deci (per-layer KV heads), qwen2 and gemma3,
with a small SentencePiece ('llama') vocabulary including the 256 byte tokens. Test-only: imports gguf
and numpy, which safe_llama itself must not.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from pathlib import Path

import gguf
import numpy as np

ARCHITECTURES = ("llama", "deci", "qwen2", "gemma3")

# Normal SentencePiece pieces after the control and byte tokens; "▁" marks a word start.
DEFAULT_WORDS: tuple[str, ...] = tuple(
    dict.fromkeys(
        ["▁" + w for w in ("hi", "hello", "the", "is", "of", "and", "to", "in", "it", "world", "model")]
        + ["▁" + c for c in "abcdefghijklmnopqrstuvwxyz"]
        + list("abcdefghijklmnopqrstuvwxyz")
        + ["▁", ".", ",", "!", "?"]
    )
)


def write_tiny_gguf(
    path: str | os.PathLike[str],
    *,
    arch: str = "llama",
    n_layer: int = 2,
    n_head: int = 4,
    n_head_kv: int = 2,
    head_dim: int = 16,
    n_embd: int | None = None,
    n_ff: int = 64,
    n_ctx_train: int = 2048,
    vocab: Sequence[str] = DEFAULT_WORDS,
    seed: int = 0,
    head_count_kv_per_layer: Sequence[int] | None = None,
    sliding_window: int | None = None,
    name: str = "tiny",
    n_expert: int = 0,
    n_expert_used: int = 2,
    expert_zeros: bool = False,
    sparse: bool = False,
) -> Path:
    """Write a model and return its path.

    n_embd defaults to n_head * head_dim; a different n_embd writes key_length/value_length = head_dim
    (llama, deci and gemma3 take that; qwen2 needs head_dim == n_embd / n_head). Per-layer KV head counts
    that differ between layers need arch="deci", whose tensors are shaped per layer. sliding_window is
    for gemma3 (every 6th layer full, as llama.cpp's default pattern). n_expert > 0 writes a Mixtral-style
    MoE llama (n_ff is each expert's size); expert_zeros fills the experts with f16 zeros instead of
    random f32, for models of many gigabytes where only the sizes matter. sparse writes the header only and
    extends the file to its full size with a hole: the same layout in no time and no disk (all weights read
    as zeros), for planning tests of big models.
    """
    if arch not in ARCHITECTURES:
        raise ValueError(f"arch must be one of {ARCHITECTURES}, not {arch!r}")
    embd = n_embd if n_embd is not None else n_head * head_dim
    kv_heads = list(head_count_kv_per_layer) if head_count_kv_per_layer is not None else [n_head_kv] * n_layer
    if len(kv_heads) != n_layer or min(kv_heads) < 1 or any(n_head % h for h in kv_heads):
        raise ValueError(f"KV heads {kv_heads}: need {n_layer} values, each >= 1 and dividing n_head={n_head}")
    if len(set(kv_heads)) > 1 and arch != "deci":
        raise ValueError(f"KV heads that differ per layer need arch='deci' ({arch} shapes layers like layer 0)")
    if arch == "qwen2" and head_dim * n_head != embd:
        raise ValueError("qwen2 needs head_dim == n_embd / n_head")
    if n_expert and arch != "llama":
        raise ValueError("experts are only written for llama (Mixtral's layout: n_ff is each expert's size)")
    if sliding_window is not None and arch != "gemma3":
        raise ValueError("sliding_window is only written for gemma3")

    rng = np.random.default_rng(seed)
    out = Path(path)
    writer = gguf.GGUFWriter(str(out), arch)
    writer.add_name(name)
    writer.add_context_length(n_ctx_train)
    writer.add_embedding_length(embd)
    writer.add_block_count(n_layer)
    writer.add_feed_forward_length(n_ff)
    writer.add_head_count(n_head)
    writer.add_head_count_kv(kv_heads if head_count_kv_per_layer is not None else n_head_kv)
    writer.add_key_length(head_dim)
    writer.add_value_length(head_dim)
    writer.add_rope_dimension_count(head_dim)
    writer.add_layer_norm_rms_eps(1e-6)
    writer.add_file_type(gguf.LlamaFileType.ALL_F32)
    if sliding_window is not None:
        writer.add_sliding_window(sliding_window)
    if n_expert:
        writer.add_expert_count(n_expert)
        writer.add_expert_used_count(n_expert_used)
    n_vocab = _add_vocab(writer, vocab)

    def weight(*shape: int) -> np.ndarray:
        if sparse:  # np.zeros touches no memory; only the shape and type are written
            return np.zeros(shape, dtype=np.float32)
        return (rng.standard_normal(shape) * 0.02).astype(np.float32)

    def expert(*shape: int) -> np.ndarray:
        # f16 zeros for big models (GPU sizing runs: gigabytes of experts in seconds), random f32 otherwise
        return np.zeros(shape, dtype=np.float16) if expert_zeros else weight(*shape)

    def ones(n: int) -> np.ndarray:
        return np.ones(n, dtype=np.float32)

    # numpy shapes are ggml's ne reversed: a {n_embd, n_vocab} tensor is (n_vocab, n_embd) here
    writer.add_tensor("token_embd.weight", weight(n_vocab, embd))
    writer.add_tensor("output_norm.weight", ones(embd))
    for il, heads in enumerate(kv_heads):
        blk = f"blk.{il}"
        writer.add_tensor(f"{blk}.attn_norm.weight", ones(embd))
        writer.add_tensor(f"{blk}.attn_q.weight", weight(n_head * head_dim, embd))
        writer.add_tensor(f"{blk}.attn_k.weight", weight(heads * head_dim, embd))
        writer.add_tensor(f"{blk}.attn_v.weight", weight(heads * head_dim, embd))
        writer.add_tensor(f"{blk}.attn_output.weight", weight(embd, n_head * head_dim))
        if arch == "qwen2":
            writer.add_tensor(f"{blk}.attn_q.bias", weight(n_head * head_dim))
            writer.add_tensor(f"{blk}.attn_k.bias", weight(heads * head_dim))
            writer.add_tensor(f"{blk}.attn_v.bias", weight(heads * head_dim))
        if arch == "gemma3":
            writer.add_tensor(f"{blk}.attn_q_norm.weight", ones(head_dim))
            writer.add_tensor(f"{blk}.attn_k_norm.weight", ones(head_dim))
            writer.add_tensor(f"{blk}.post_attention_norm.weight", ones(embd))
            writer.add_tensor(f"{blk}.post_ffw_norm.weight", ones(embd))
        writer.add_tensor(f"{blk}.ffn_norm.weight", ones(embd))
        if n_expert:
            writer.add_tensor(f"{blk}.ffn_gate_inp.weight", weight(n_expert, embd))
            for part, shape in (("gate", (n_ff, embd)), ("up", (n_ff, embd)), ("down", (embd, n_ff))):
                experts = expert(n_expert, *shape)
                writer.add_tensor(f"{blk}.ffn_{part}_exps.weight", experts)
            continue
        writer.add_tensor(f"{blk}.ffn_gate.weight", weight(n_ff, embd))
        writer.add_tensor(f"{blk}.ffn_up.weight", weight(n_ff, embd))
        writer.add_tensor(f"{blk}.ffn_down.weight", weight(embd, n_ff))
    if sparse:
        tensors = writer.tensors[0].values()
        data = sum(gguf.GGUFWriter.ggml_pad(ti.nbytes, writer.data_alignment) for ti in tensors)
        writer.write_header_to_file()
        writer.write_kv_data_to_file()
        writer.write_ti_data_to_file()
        writer.close()
        start = gguf.GGUFWriter.ggml_pad(out.stat().st_size, writer.data_alignment)
        os.truncate(out, start + data)
        return out
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return out


def _add_vocab(writer: gguf.GGUFWriter, words: Sequence[str]) -> int:
    """A SentencePiece vocabulary: <unk> <s> </s>, the 256 byte tokens, then the given pieces."""
    tokens = ["<unk>", "<s>", "</s>"] + [f"<0x{b:02X}>" for b in range(256)] + list(words)
    if len(set(tokens)) != len(tokens):
        raise ValueError("the vocabulary has duplicate tokens, which llama.cpp aborts on")
    types = (
        [gguf.TokenType.UNKNOWN, gguf.TokenType.CONTROL, gguf.TokenType.CONTROL]
        + [gguf.TokenType.BYTE] * 256
        + [gguf.TokenType.NORMAL] * len(words)
    )
    # SentencePiece prefers higher scores: longer pieces first, bytes only as the fallback
    scores = [0.0, 0.0, 0.0] + [-1000.0] * 256 + [float(len(w)) - 100.0 for w in words]
    writer.add_tokenizer_model("llama")
    writer.add_token_list(tokens)
    writer.add_token_scores(scores)
    writer.add_token_types(types)
    writer.add_unk_token_id(0)
    writer.add_bos_token_id(1)
    writer.add_eos_token_id(2)
    writer.add_add_bos_token(True)
    return len(tokens)


# Llama-3.2-3B's hyperparameters (the seed's model): 28 layers, 8 KV heads of 128, so 114,688 bytes of
# f16 KV per token and 7,516,192,768 bytes at -c 65536. Keys without the architecture prefix.
LLAMA_3B: dict[str, int] = {
    "block_count": 28, "embedding_length": 3072, "context_length": 131072, "feed_forward_length": 8192,
    "attention.head_count": 24, "attention.head_count_kv": 8, "attention.key_length": 128,
    "attention.value_length": 128,
}  # fmt: skip


def write_metadata_gguf(path: str | os.PathLike[str], arch: str, meta: Mapping[str, int]) -> Path:
    """A GGUF with metadata only (no tensors, no tokenizer): enough for safe-llama to plan, not for
    llama.cpp to load."""
    import gguf

    writer = gguf.GGUFWriter(str(path), arch)
    for key, value in meta.items():
        writer.add_uint32(f"{arch}.{key}", value)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return Path(path)


def write_wide_kv_gguf(folder: Path) -> Path:
    """folder/wide.gguf: the wide-KV llama the cgroup benchmarks and tests use (2 layers, embd 64, 4 KV heads of
    512, ff 128): 16 KiB of f16 KV per cell on tiny weights, so the context is nearly all of the charge."""
    return write_tiny_gguf(folder / "wide.gguf", n_layer=2, n_head=4, n_head_kv=4, head_dim=512, n_embd=64,
                           n_ff=128, n_ctx_train=1 << 20, name="wide-kv")  # fmt: skip
