"""llama.cpp's memory layout per architecture, as a table: which layers attend, slide or recur, and the caches
safe-llama does not reproduce (with the direction of the error). From the pinned source's
src/llama-model.cpp load_hparams, src/models/*.cpp load_arch_hparams and create_memory.

Owns that table; must not read files (hparams applies the rules to a header)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Literal

LLAMA_MAX_LAYERS = 512  # src/llama-hparams.h
Memory = Literal["kv", "none", "recurrent", "hybrid"]
SwaType = Literal["none", "standard", "chunked", "symmetric"]


@dataclass(frozen=True)
class SwaRule:
    """How an architecture decides which layers use a sliding window (its load_arch_hparams)."""

    swa_type: SwaType = "standard"
    period: int | None = None  # default of sliding_window_pattern; None: the per-layer array is required
    dense_first: bool = False  # set_swa_pattern(n, dense_first): the full layer opens each period
    # when the window applies: always, only if the sliding_window key is > 0, unless it is 0, or 64 layers
    when: Literal["always", "window_positive", "window_not_zero", "64_layers"] = "always"
    default_window: int | None = None  # used when the key is absent; None: the key is required
    forced_window: int | None = None  # llama.cpp sets this whatever the key says
    attention_layers: bool = False  # every attention (non-recurrent) layer is SWA
    head_dims_required: bool = False  # key_length_swa / value_length_swa must be present


@dataclass(frozen=True)
class ArchRule:
    """llama.cpp's memory layout for one architecture."""

    memory: Memory = "kv"
    swa: SwaRule | None = None
    mla: bool = False  # key_length_mla/value_length_mla make it cache one K-only head
    # hybrids: which layers are recurrent and which attend (create_memory's filters)
    recurrent_layers: Literal["", "no_kv_heads", "all", "no_kv_heads_no_ff", "interval"] = ""
    # recurrent state rows (llama_hparams::n_embd_r/n_embd_s): kda = Kimi delta attention, la = MiniMax
    # lightning attention
    state: Literal["ssm", "ssm_groups", "wkv", "shortconv", "kda", "la"] = "ssm"
    recurrent_interval: int = 4  # default of full_attention_interval for recurrent_layers="interval"
    kv_from_start: Literal["", "gemma3n", "gemma4"] = ""  # layers past this reuse earlier layers' KV
    # llama_kv_cache_dsa (src/llama-kv-cache-dsa.cpp): a second, K-only cache of one indexer key head per
    # indexed layer; "all": every trunk layer, "types": attention.indexer.types, "top_k": as "types" but
    # only when attention.indexer.top_k > 0 (hy_v4)
    indexer: Literal["", "all", "types", "top_k"] = ""
    loops: bool = False  # {arch}.num_loops repeats the layer stack, each pass with its own KV (nanbeige)
    # a sparse-attention memory with caches beyond the attention layers' (model.sparse): llama_kv_cache_dsv4,
    # _dsa_iswa (a window-sized SWA cache beside the DSA one), _msa (an indexer cache with K and V), or
    # llama_memory_hybrid_idx (a K-only indexer cache; "hybrid_qsa": qwen4exp's k-pool and PLE conv rows)
    sparse: Literal["", "dsv4", "dsa_iswa", "msa", "hybrid_idx", "hybrid_qsa"] = ""


# Architectures whose load_arch_hparams touches nothing that changes the KV cache: base rules only.
_PLAIN = (
    "llama", "llama-embed", "deci", "falcon", "grok", "gpt2", "gptneox", "mpt", "baichuan", "starcoder",
    "refact", "bloom", "stablelm", "qwen", "qwen2", "qwen2moe", "qwen2vl", "qwen3", "qwen3moe", "qwen3vl",
    "qwen3vlmoe", "phi2", "phi3", "phimoe", "plamo", "codeshell", "orion", "internlm2", "minicpm",
    "minicpm3", "gemma", "starcoder2", "xverse", "command-r", "dbrx", "olmo", "olmoe", "openelm", "arctic",
    "deepseek", "deepseek2-ocr", "chatglm", "glm4", "glm4moe", "bitnet", "jais", "jais2", "nemotron",
    "exaone", "granite", "granitemoe", "chameleon", "plm", "bailingmoe", "bailingmoe2", "dots1", "arcee",
    "ernie4_5", "ernie4_5-moe", "hunyuan-moe", "hunyuan-dense", "hunyuan_vl", "hy_v3", "smollm3",
    "seed_oss", "grovemoe", "apertus", "minimax-m2", "cogvlm", "pangu-embedded", "mistral3", "maincoder",
    "talkie", "paddleocr", "qwen3tts", "pockettts", "hrm_text",
)  # fmt: skip

# create_memory returns no memory at all for these (encoders, diffusion models).
_NO_MEMORY = (
    "bert", "jina-bert-v2", "jina-bert-v3", "nomic-bert", "nomic-bert-moe", "neo-bert", "eurobert",
    "wavtokenizer-dec", "modern-bert", "gemma-embedding", "dream", "llada", "llada-moe", "rnd1", "clef",
)  # fmt: skip

_SPECIAL: dict[str, ArchRule] = {
    # sliding-window attention; period and condition from each src/models/<arch>.cpp
    "gemma2": ArchRule(swa=SwaRule(period=2, default_window=4096)),
    "gemma3": ArchRule(swa=SwaRule(period=6, when="window_positive")),
    "gemma3n": ArchRule(swa=SwaRule(period=5), kv_from_start="gemma3n"),
    "gemma4": ArchRule(swa=SwaRule(head_dims_required=True), kv_from_start="gemma4"),
    "cohere2": ArchRule(swa=SwaRule(period=4)),
    "cohere2moe": ArchRule(swa=SwaRule(period=4, dense_first=True)),
    "llama4": ArchRule(swa=SwaRule(swa_type="chunked", period=4, when="window_not_zero", forced_window=8192)),
    "gpt-oss": ArchRule(swa=SwaRule(period=2)),
    "exaone4": ArchRule(swa=SwaRule(period=4, when="64_layers", default_window=4096)),
    "exaone-moe": ArchRule(swa=SwaRule(period=4)),
    "olmo2": ArchRule(swa=SwaRule(period=4, when="window_positive")),
    "plamo3": ArchRule(swa=SwaRule(period=8, when="window_positive")),
    "afmoe": ArchRule(swa=SwaRule(period=4, when="window_positive")),
    "mellum": ArchRule(swa=SwaRule(period=4, when="window_positive")),
    "smallthinker": ArchRule(swa=SwaRule(period=4, dense_first=True, when="window_positive", forced_window=4096)),
    "muse-glimmer": ArchRule(swa=SwaRule(period=4)),
    "laguna": ArchRule(swa=SwaRule(period=4, dense_first=True, when="window_positive")),
    "granite_swa": ArchRule(swa=SwaRule()),
    "mimo2": ArchRule(swa=SwaRule()),
    "step35": ArchRule(swa=SwaRule()),
    "maple": ArchRule(swa=SwaRule()),
    "spark2_5": ArchRule(swa=SwaRule()),
    # multi-head latent attention
    "deepseek2": ArchRule(mla=True),
    "mistral4": ArchRule(mla=True),
    # ...plus a DeepSeek sparse-attention indexer cache (create_memory: llama_kv_cache_dsa)
    "deepseek32": ArchRule(mla=True, indexer="all"),
    "glm-dsa": ArchRule(mla=True, indexer="types"),
    "hy_v4": ArchRule(mla=True, indexer="top_k"),
    # sparse-attention memories (create_memory's own cases; model.sparse reads what shapes them)
    "deepseek4": ArchRule(swa=SwaRule(when="always"), sparse="dsv4"),
    "dots3note": ArchRule(swa=SwaRule(), mla=True, indexer="types", sparse="dsa_iswa"),
    "minimax-m3": ArchRule(sparse="msa"),
    "glm5-next": ArchRule(memory="hybrid", recurrent_layers="no_kv_heads", state="kda", mla=True, sparse="hybrid_idx"),
    "qwen4exp": ArchRule(memory="hybrid", recurrent_layers="interval", state="ssm_groups", sparse="hybrid_qsa"),
    # looped layers (src/models/nanbeige.cpp load_arch_hparams expands n_layer_all)
    "nanbeige": ArchRule(loops=True),
    # recurrent (llm_arch_is_recurrent) and hybrid (llm_arch_is_hybrid) models
    "mamba": ArchRule(memory="recurrent"),
    "mamba2": ArchRule(memory="recurrent", state="ssm_groups"),
    "rwkv6": ArchRule(memory="recurrent", state="wkv"),
    "rwkv6qwen2": ArchRule(memory="recurrent", state="wkv"),
    "rwkv7": ArchRule(memory="recurrent", state="wkv"),
    "arwkv7": ArchRule(memory="recurrent", state="wkv"),
    "jamba": ArchRule(memory="hybrid", recurrent_layers="no_kv_heads"),
    "granitehybrid": ArchRule(memory="hybrid", recurrent_layers="no_kv_heads", state="ssm_groups"),
    "plamo2": ArchRule(memory="hybrid", recurrent_layers="no_kv_heads", state="ssm_groups"),
    "lfm2": ArchRule(
        memory="hybrid",
        recurrent_layers="no_kv_heads",
        state="shortconv",
        swa=SwaRule(when="window_positive", attention_layers=True),
    ),
    "lfm2moe": ArchRule(memory="hybrid", recurrent_layers="no_kv_heads", state="shortconv"),
    "falcon-h1": ArchRule(memory="hybrid", recurrent_layers="all", state="ssm_groups"),
    "nemotron_h": ArchRule(memory="hybrid", recurrent_layers="no_kv_heads_no_ff", state="ssm_groups"),
    "nemotron_h_moe": ArchRule(memory="hybrid", recurrent_layers="no_kv_heads_no_ff", state="ssm_groups"),
    "qwen3next": ArchRule(memory="hybrid", recurrent_layers="interval", state="ssm_groups"),
    "qwen35": ArchRule(memory="hybrid", recurrent_layers="interval", state="ssm_groups"),
    "qwen35moe": ArchRule(memory="hybrid", recurrent_layers="interval", state="ssm_groups"),
    # Kimi delta attention layers (n_head_kv == 0) next to MLA layers (src/models/kimi-linear.cpp,
    # kimi-k3.cpp, bailingmoe3.cpp)
    "kimi-linear": ArchRule(memory="hybrid", recurrent_layers="no_kv_heads", state="kda", mla=True),
    "kimi-k3": ArchRule(memory="hybrid", recurrent_layers="no_kv_heads", state="kda", mla=True),
    "bailingmoe3": ArchRule(memory="hybrid", recurrent_layers="no_kv_heads", state="kda", mla=True),
    # lightning-attention layers, every 8th layer attends (src/models/minimax-01.cpp)
    "minimax-01": ArchRule(memory="hybrid", recurrent_layers="interval", state="la", recurrent_interval=8),
}

ARCHITECTURES: Mapping[str, ArchRule] = {
    **{arch: ArchRule() for arch in _PLAIN},
    **{arch: ArchRule(memory="none") for arch in _NO_MEMORY},
    **_SPECIAL,
}


@dataclass(frozen=True)
class Unmodelled:
    """An architecture llama.cpp knows whose memory safe-llama does not reproduce: the rule it is estimated
    with, which way that estimate errs, and why (checked against the real binary by tests/model/test_archs_real.py
    for the ones test-llama-archs writes)."""

    rule: ArchRule
    direction: Literal["over", "under", "unknown"]
    reason: str


# llama.cpp knows these, but they use caches safe-llama does not model.
UNMODELLED: Mapping[str, Unmodelled] = {
    # not written by test-llama-archs: encoders/decoders, draft heads and projectors
    **{
        arch: Unmodelled(ArchRule(mla=True), "unknown", "an encoder-decoder, draft head or projector")
        for arch in ("clip", "t5", "t5encoder", "graniteswitch", "gemma4-assistant", "eagle3", "dflash", "gptj")
    },
}
