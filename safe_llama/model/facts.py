"""What a GGUF header means for memory: per-layer KV widths, sliding windows, recurrent state, weights.

Owns llama.cpp's rules for reading hyperparameters (src/llama-model.cpp load_hparams, src/models/*.cpp
load_arch_hparams, src/llama-hparams.cpp, create_memory) as tables per architecture. Pure: reads no files
except through load_model_facts, and does no KV arithmetic over context sizes (the planner does).
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Literal, NoReturn

from safe_llama.model.gguf_constants import constants
from safe_llama.model.gguf_header import (
    GGUFError,
    GGUFHeader,
    MetadataValue,
    SkippedArray,
    printable,
    read_header,
    value_type_name,
)

LLAMA_MAX_LAYERS = 512  # src/llama-hparams.h
FACTS_SCHEMA = 3  # bump when ModelFacts changes, so cached facts from an older safe-llama are not trusted

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
    "deepseek4": Unmodelled(
        ArchRule(mla=True),
        "over",
        "llama_kv_cache_dsv4 keeps a sliding window and compressed caches, not a full-context cache per layer",
    ),
    "dots3note": Unmodelled(
        ArchRule(mla=True, indexer="types"),
        "over",
        "llama_kv_cache_dsa_iswa: sliding-window layers keep a window-sized cache, counted here at full size",
    ),
    "minimax-m3": Unmodelled(ArchRule(), "under", "llama_kv_cache_msa's indexer key cache is not counted"),
    "glm5-next": Unmodelled(
        ArchRule(memory="hybrid", recurrent_layers="no_kv_heads", state="kda", mla=True),
        "under",
        "llama_memory_hybrid_idx's indexer key cache is not counted",
    ),
    "qwen4exp": Unmodelled(
        ArchRule(memory="hybrid", recurrent_layers="interval", state="ssm_groups"),
        "under",
        "llama_memory_hybrid_idx's indexer key cache and the PLE conv rows are not counted",
    ),
    # not written by test-llama-archs: encoders/decoders, draft heads and projectors
    **{
        arch: Unmodelled(ArchRule(mla=True), "unknown", "an encoder-decoder, draft head or projector")
        for arch in ("clip", "t5", "t5encoder", "graniteswitch", "gemma4-assistant", "eagle3", "dflash", "gptj")
    },
}


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


def load_model_facts(path: str | os.PathLike[str]) -> ModelFacts:
    return model_facts(read_header(path))


class _Meta:
    """Typed access to one header's metadata; every bad value is a one-line GGUFError naming the key."""

    def __init__(self, header: GGUFHeader) -> None:
        self.header = header
        self.metadata = header.metadata
        self.arch = ""
        self.notes: list[str] = []

    def k(self, suffix: str) -> str:
        return f"{self.arch}.{suffix}"

    def fail(self, problem: str) -> NoReturn:
        raise GGUFError(self.header.path, problem)

    def missing(self, key: str) -> NoReturn:
        self.fail(f"missing key {printable(key)}")

    def wrong_type(self, key: str, expected: str) -> NoReturn:
        self.fail(f"key {printable(key)} has type {self.header.type_name(key)}, expected {expected}")

    def string(self, key: str) -> str | None:
        value = self.metadata.get(key)
        if value is None or isinstance(value, str):
            return value
        self.wrong_type(key, "string")

    def uint(self, key: str, default: int | None = None) -> int:
        value = self.metadata.get(key)
        if value is None:
            if default is None:
                self.missing(key)
            return default
        return self._uint(key, value)

    def optional_uint(self, key: str) -> int | None:
        return None if key not in self.metadata else self.uint(key)

    def _uint(self, key: str, value: MetadataValue) -> int:
        if not isinstance(value, int) or isinstance(value, bool):
            self.wrong_type(key, "uint32")
        if not 0 <= value < 1 << 32:
            self.fail(f"key {printable(key)} is {value}, expected a uint32")
        # llama.cpp's get_key takes exactly uint32 for every integer key read here
        uint32 = constants().GGUFValueType.UINT32
        stored = self.header.value_types.get(key, uint32)
        if stored != uint32:
            note = f"key {printable(key)} is {value_type_name(stored)}: llama.cpp wants uint32 and refuses it"
            if note not in self.notes:
                self.notes.append(note)
        return value

    def array(self, key: str, *, flags: bool, limit: int) -> tuple[int, ...]:
        """An integer (or, with flags, bool) array of at most limit entries."""
        value = self.metadata[key]
        if isinstance(value, SkippedArray):
            self.fail(f"key {printable(key)} has {value.count} entries, more than {limit}")
        if not isinstance(value, tuple):
            self.wrong_type(key, "array")
        if len(value) > limit:
            self.fail(f"key {printable(key)} has {len(value)} entries, more than {limit}")
        items = []
        for item in value:
            if isinstance(item, bool) and flags:
                items.append(int(item))
            elif isinstance(item, int) and not isinstance(item, bool) and item >= 0:
                items.append(item)
            else:
                kind = "bool or integer" if flags else "integer"
                self.fail(f"key {printable(key)} must be an array of {kind}s, found {printable(repr(item), 40)}")
        return tuple(items)

    def per_layer(
        self, key: str, n_layer: int, default: tuple[int, ...] | None, *, flags: bool = False
    ) -> tuple[int, ...]:
        """get_key_or_arr: one value for every layer, or an array with exactly one entry per layer."""
        value = self.metadata.get(key)
        if value is None:
            if default is None:
                self.missing(key)
            return default
        if isinstance(value, tuple | SkippedArray):
            count = value.count if isinstance(value, SkippedArray) else len(value)
            if count != n_layer:
                self.fail(f"key {printable(key)} has {count} entries, expected {n_layer} (one per layer)")
            return self.array(key, flags=flags, limit=n_layer)
        if flags and isinstance(value, bool):
            return (int(value),) * n_layer
        return (self._uint(key, value),) * n_layer


def _swa_pattern(m: _Meta, rule: SwaRule, n_layer_all: int, n_layer: int) -> list[bool]:
    """load_swa_pattern (llama-model.cpp) and set_swa_pattern (llama-hparams.cpp)."""
    key = m.k("attention.sliding_window_pattern")
    value = m.metadata.get(key)
    if isinstance(value, tuple | SkippedArray):
        flags = m.array(key, flags=True, limit=LLAMA_MAX_LAYERS)
        return [il < len(flags) and flags[il] != 0 for il in range(n_layer_all)]
    if rule.period is None:
        if value is None:
            m.missing(key)
        m.wrong_type(key, "array")
    n = m.uint(key, default=rule.period)
    if rule.dense_first:
        return [il < n_layer and (n == 0 or il % n != 0) for il in range(n_layer_all)]
    return [il < n_layer and (n == 0 or il % n < n - 1) for il in range(n_layer_all)]


def _recurrent_layers(
    m: _Meta,
    rule: ArchRule,
    head_count_kv: tuple[int, ...],
    n_ff: tuple[int, ...],
    n_layer_all: int,
    n_layer: int,
) -> list[bool]:
    """Which layers have recurrent state (is_recr per architecture; recurrent memory loops n_layer())."""
    if rule.memory == "recurrent" or rule.recurrent_layers == "all":
        return [il < n_layer for il in range(n_layer_all)]
    if rule.recurrent_layers == "no_kv_heads":
        return [il < n_layer and head_count_kv[il] == 0 for il in range(n_layer_all)]
    if rule.recurrent_layers == "no_kv_heads_no_ff":
        return [il < n_layer and head_count_kv[il] == 0 and n_ff[il] == 0 for il in range(n_layer_all)]
    if rule.recurrent_layers == "interval":
        key = m.k("attention.recurrent_layers")
        if key in m.metadata:
            return [flag != 0 for flag in m.per_layer(key, n_layer_all, None, flags=True)]
        interval = m.uint(m.k("full_attention_interval"), default=rule.recurrent_interval)
        if interval == 0:
            m.fail(f"key {printable(m.k('full_attention_interval'))} is 0")
        return [il < n_layer and (il + 1) % interval != 0 for il in range(n_layer_all)]
    return [False] * n_layer_all


def _attends(rule: ArchRule, recurrent: list[bool], n_ff: tuple[int, ...], n_layer: int) -> list[bool]:
    """create_memory's attention filter for hybrids; every layer otherwise."""
    n_layer_all = len(recurrent)
    if rule.memory != "hybrid" or rule.recurrent_layers == "all":
        return [True] * n_layer_all
    if rule.recurrent_layers == "no_kv_heads_no_ff":
        return [not recurrent[il] and n_ff[il] == 0 for il in range(n_layer_all)]
    if rule.recurrent_layers == "interval":
        return [il < n_layer and not recurrent[il] for il in range(n_layer_all)]
    return [not r for r in recurrent]


def _state_rows(m: _Meta, rule: ArchRule, n_embd: int, n_head: int, head_k: int) -> tuple[int, int]:
    """llama_hparams::n_embd_r() and n_embd_s(): f32 elements per sequence of a recurrent layer's R and S.

    n_head is layer 0's head count (llama_hparams::n_head() with no layer), head_k the full layers' K head dim.
    """
    if rule.state == "kda":
        # conv state for Q, K and V, then one head_dim x head_dim matrix per head
        head_dim = m.uint(m.k("kda.head_dim"))
        d_conv = m.uint(m.k("ssm.conv_kernel"))
        d_inner = n_head * head_dim
        return 3 * (d_conv - 1 if d_conv > 0 else 3) * d_inner, head_dim * head_dim * n_head
    if rule.state == "la":
        # minimax-01 loads no ssm keys, so its conv rows are empty; n_embd_head_la is the K head dim
        return 0, head_k * head_k * n_head
    if rule.state == "wkv":
        head_size = m.uint(m.k("wkv.head_size"))
        token_shift = m.uint(m.k("token_shift_count"), default=2)
        return token_shift * n_embd, n_embd * head_size
    if rule.state == "shortconv":
        l_cache = m.uint(m.k("shortconv.l_cache"))
        if l_cache:
            return n_embd * (l_cache - 1), 0
        return 0, 0
    d_conv = m.uint(m.k("ssm.conv_kernel"))
    d_inner = m.uint(m.k("ssm.inner_size"))
    d_state = m.uint(m.k("ssm.state_size"))
    n_group = m.uint(m.k("ssm.group_count"), default=0) if rule.state == "ssm_groups" else 0
    return max(d_conv - 1, 0) * (d_inner + 2 * n_group * d_state), d_state * d_inner


def _indexed_layers(m: _Meta, rule: ArchRule, n_layer_all: int, n_layer: int, n_ctx_train: int) -> list[bool]:
    """Which layers get a row in the DSA indexer cache: create_memory's filter_lid and the is_indexer_full
    defaults of src/models/glm-dsa.cpp and hy-v4.cpp."""
    if not rule.indexer:
        return [False] * n_layer_all
    if rule.indexer == "all":
        return [il < n_layer for il in range(n_layer_all)]
    if rule.indexer == "top_k" and m.uint(m.k("attention.indexer.top_k"), default=0) == 0:
        return [False] * n_layer_all
    if rule.indexer == "types" and n_ctx_train >= 1048576:
        # GLM-5.2's default: the first two layers, then every fourth from layer 2
        default = tuple(int(il < 2 or (il - 2) % 4 == 0) for il in range(n_layer))
    else:
        default = (int(rule.indexer == "types"),) * n_layer
    flags = m.per_layer(m.k("attention.indexer.types"), n_layer, default, flags=True)
    return [il < n_layer and flags[il] != 0 for il in range(n_layer_all)]


def _generic_rule(m: _Meta) -> ArchRule:
    """For an architecture without a table entry: guess the memory from the keys present."""
    if m.k("wkv.head_size") in m.metadata:
        return ArchRule(memory="recurrent", state="wkv", mla=True)
    if m.k("ssm.conv_kernel") in m.metadata or m.k("ssm.inner_size") in m.metadata:
        return ArchRule(memory="hybrid", recurrent_layers="no_kv_heads", state="ssm_groups", mla=True)
    return ArchRule(mla=True)


def _vocab_size(m: _Meta, header: GGUFHeader) -> int:
    """llama.cpp's n_vocab: the tokenizer's token count, else {arch}.vocab_size, else token_embd's rows."""
    tokens = m.metadata.get("tokenizer.ggml.tokens")
    if isinstance(tokens, SkippedArray):
        return tokens.count
    if isinstance(tokens, tuple):
        return len(tokens)
    declared = m.optional_uint(m.k("vocab_size"))
    if declared is not None:
        return declared
    embd = next((t for t in header.tensors if t.name == "token_embd.weight"), None)
    return embd.shape[1] if embd is not None and len(embd.shape) > 1 else 0


def _block_index(name: str) -> int | None:
    if not name.startswith("blk."):
        return None
    number = name[4:].partition(".")[0]
    return int(number) if number.isdigit() else None


def model_facts(header: GGUFHeader) -> ModelFacts:
    """Everything the KV arithmetic needs, derived from a header by llama.cpp's rules."""
    m = _Meta(header)
    notes: list[str] = []
    arch = m.string("general.architecture")
    if arch is None:
        m.missing("general.architecture")
    m.arch = arch
    name = m.string("general.name")
    shown = printable(arch, 60)

    rule = ARCHITECTURES.get(arch)
    known = rule is not None
    unmodelled = UNMODELLED.get(arch)
    if unmodelled is not None:
        rule = unmodelled.rule
        error = {
            "over": "an over-estimate (never under)",
            "under": "an under-estimate (never over)",
            "unknown": "of unknown direction",
        }
        notes.append(
            f"architecture '{shown}' is not modelled exactly ({unmodelled.reason}): "
            f"its KV estimate is {error[unmodelled.direction]}"
        )
    elif rule is None:
        rule = _generic_rule(m)
        notes.append(f"unknown architecture '{shown}': generic rules used")
        if rule.memory != "kv":
            notes.append(f"recurrent state assumed from the {rule.state} keys")

    n_layer_all = m.uint(m.k("block_count"))
    if not 0 < n_layer_all <= LLAMA_MAX_LAYERS:
        m.fail(f"key {printable(m.k('block_count'))} is {n_layer_all}, expected 1 to {LLAMA_MAX_LAYERS}")
    n_embd = m.uint(m.k("embedding_length"))
    n_ctx_train = m.uint(m.k("context_length"))
    nextn = m.uint(m.k("nextn_predict_layers"), default=0)
    if nextn > n_layer_all:
        m.fail(f"key {printable(m.k('nextn_predict_layers'))} is {nextn}, more than the {n_layer_all} layers")
    n_layer = n_layer_all - nextn

    no_heads = (0,) * n_layer_all if rule.memory == "recurrent" else None
    head_count = m.per_layer(m.k("attention.head_count"), n_layer_all, no_heads)
    head_count_kv = m.per_layer(m.k("attention.head_count_kv"), n_layer_all, head_count)
    if head_count[0] > 0:
        k_full = m.uint(m.k("attention.key_length"), default=n_embd // head_count[0])
        v_full = m.uint(m.k("attention.value_length"), default=n_embd // head_count[0])
    else:
        k_full = v_full = 0
    swa = rule.swa
    need_swa_dims = swa is not None and swa.head_dims_required
    k_swa = m.uint(m.k("attention.key_length_swa"), default=None if need_swa_dims else k_full)
    v_swa = m.uint(m.k("attention.value_length_swa"), default=None if need_swa_dims else v_full)

    n_ff = m.per_layer(m.k("feed_forward_length"), n_layer_all, (0,) * n_layer_all)
    recurrent = _recurrent_layers(m, rule, head_count_kv, n_ff, n_layer_all, n_layer)
    attends = _attends(rule, recurrent, n_ff, n_layer)

    swa_type: SwaType = "none"
    window = 0
    is_swa = [False] * n_layer_all
    if swa is not None:
        window_key = m.optional_uint(m.k("attention.sliding_window"))
        active = {
            "always": True,
            "window_positive": window_key is not None and window_key > 0,
            "window_not_zero": window_key != 0,
            "64_layers": n_layer == 64,
        }[swa.when]
        if active:
            swa_type = swa.swa_type
            if swa.forced_window is not None:
                window = swa.forced_window
            elif window_key is not None:
                window = window_key
            elif swa.default_window is not None:
                window = swa.default_window
            else:
                m.missing(m.k("attention.sliding_window"))
            if swa.attention_layers:
                is_swa = [il < n_layer and not recurrent[il] for il in range(n_layer_all)]
            else:
                is_swa = _swa_pattern(m, swa, n_layer_all, n_layer)
            if not any(is_swa):
                notes.append("a sliding window is set but no layer uses it: llama.cpp will abort")

    is_mla = False
    if rule.mla:
        k_mla = m.optional_uint(m.k("attention.key_length_mla"))
        v_mla = m.optional_uint(m.k("attention.value_length_mla"))
        is_mla = bool(k_mla) and bool(v_mla)

    kv_from_start = -1
    if rule.kv_from_start == "gemma3n":
        kv_from_start = 20  # hard-coded in src/models/gemma3n.cpp
    elif rule.kv_from_start == "gemma4":
        shared = m.uint(m.k("attention.shared_kv_layers"), default=0)
        kv_from_start = max(n_layer_all - shared, -1)

    # the default path leaves MTP layers out of the main context's cache (create_memory)
    drops_nextn = rule.memory == "kv" and nextn > 0 and n_layer > 0
    state_r, state_s = _state_rows(m, rule, n_embd, head_count[0], k_full) if any(recurrent) else (0, 0)
    indexed = _indexed_layers(m, rule, n_layer_all, n_layer, n_ctx_train)
    k_idx = m.uint(m.k("attention.indexer.key_length")) if any(indexed) else 0
    has_memory = rule.memory in ("kv", "hybrid")

    key_length = tuple(k_swa if is_swa[il] else k_full for il in range(n_layer_all))
    value_length = tuple(v_swa if is_swa[il] else v_full for il in range(n_layer_all))
    layers = tuple(
        LayerKV(
            has_kv=has_memory
            and attends[il]
            and (kv_from_start < 0 or il < kv_from_start)
            and not (drops_nextn and il >= n_layer),
            swa=is_swa[il],
            recurrent=recurrent[il],
            n_embd_k_gqa=key_length[il] * head_count_kv[il],
            n_embd_v_gqa=0 if is_mla else value_length[il] * head_count_kv[il],
            n_embd_r=state_r if recurrent[il] else 0,
            n_embd_s=state_s if recurrent[il] else 0,
            # the indexer cache shares the main cache's hparams but one head of indexer_head_size;
            # SWA layers keep their own head dim (llama_kv_cache_dsa's hparams_lid)
            n_embd_k_idx=(k_swa if is_swa[il] else k_idx) if indexed[il] else 0,
        )
        for il in range(n_layer_all)
    )
    if rule.loops:
        # each pass over the stack is a logical layer with its own KV (nanbeige load_arch_hparams)
        n_loops = m.uint(m.k("num_loops"), default=1)
        if not (n_loops >= 1 and n_layer_all * n_loops <= LLAMA_MAX_LAYERS):
            m.fail(f"key {printable(m.k('num_loops'))} is {n_loops}: {n_layer_all} layers x loops must be 1 to 512")
        layers *= n_loops

    layer_bytes = [0] * n_layer_all
    other_bytes = 0
    for tensor in header.tensors:
        il = _block_index(tensor.name)
        if il is not None and il < n_layer_all:
            layer_bytes[il] += tensor.n_bytes
        else:
            other_bytes += tensor.n_bytes
    vocab_size = _vocab_size(m, header)
    notes.extend(m.notes)
    split_count = m.metadata.get("split.count")
    if isinstance(split_count, int) and split_count > 1:
        notes.append(f"the model is split into {split_count} files: weights counted for this file only")

    return ModelFacts(
        path=header.path,
        file_size=header.file_size,
        architecture=arch,
        name=name,
        known_architecture=known,
        block_count=n_layer_all,
        nextn_predict_layers=nextn,
        embedding_length=n_embd,
        context_length=n_ctx_train,
        feed_forward_length=max(n_ff),
        vocab_size=vocab_size,
        head_count=head_count,
        head_count_kv=head_count_kv,
        key_length=key_length,
        value_length=value_length,
        layers=layers,
        sliding_window=window,
        swa_type=swa_type,
        is_mla=is_mla,
        is_recurrent=rule.memory == "recurrent",
        is_hybrid=rule.memory == "hybrid",
        n_layer_kv_from_start=kv_from_start,
        weight_bytes_per_layer=tuple(layer_bytes),
        other_weight_bytes=other_bytes,
        notes=tuple(notes),
        tensors=tuple((t.name, t.n_bytes) for t in header.tensors),
        tensor_types=tuple(_type_name(t.ggml_type) for t in header.tensors),
    )


def _type_name(ggml_type: int) -> str:
    from safe_llama.model.gguf_constants import constants

    try:
        return str(constants().GGMLQuantizationType(ggml_type).name).lower()
    except ValueError:
        return f"type{ggml_type}"


def facts_to_json(facts: ModelFacts) -> dict[str, Any]:
    """A JSON-ready dict (lists, not tuples) that facts_from_json turns back into the same facts."""
    return {
        "schema": FACTS_SCHEMA,
        "path": facts.path,
        "file_size": facts.file_size,
        "architecture": facts.architecture,
        "name": facts.name,
        "known_architecture": facts.known_architecture,
        "block_count": facts.block_count,
        "nextn_predict_layers": facts.nextn_predict_layers,
        "embedding_length": facts.embedding_length,
        "context_length": facts.context_length,
        "feed_forward_length": facts.feed_forward_length,
        "vocab_size": facts.vocab_size,
        "head_count": list(facts.head_count),
        "head_count_kv": list(facts.head_count_kv),
        "key_length": list(facts.key_length),
        "value_length": list(facts.value_length),
        "layers": [
            {
                "has_kv": layer.has_kv,
                "swa": layer.swa,
                "recurrent": layer.recurrent,
                "n_embd_k_gqa": layer.n_embd_k_gqa,
                "n_embd_v_gqa": layer.n_embd_v_gqa,
                "n_embd_r": layer.n_embd_r,
                "n_embd_s": layer.n_embd_s,
                "n_embd_k_idx": layer.n_embd_k_idx,
            }
            for layer in facts.layers
        ],
        "sliding_window": facts.sliding_window,
        "swa_type": facts.swa_type,
        "is_mla": facts.is_mla,
        "is_recurrent": facts.is_recurrent,
        "is_hybrid": facts.is_hybrid,
        "n_layer_kv_from_start": facts.n_layer_kv_from_start,
        "weight_bytes_per_layer": list(facts.weight_bytes_per_layer),
        "other_weight_bytes": facts.other_weight_bytes,
        "notes": list(facts.notes),
        "tensors": [[name, size] for name, size in facts.tensors],
        "tensor_types": list(facts.tensor_types),
    }


def _field(d: Mapping[str, Any], key: str, check: Callable[[Any], bool]) -> Any:
    value = d.get(key)
    if not check(value):
        raise ValueError(f"cached model facts: bad {key!r}: {value!r}")
    return value


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _ints(d: Mapping[str, Any], key: str) -> tuple[int, ...]:
    value = _field(d, key, lambda v: isinstance(v, list) and all(_is_int(x) for x in v))
    return tuple(value)


def facts_from_json(d: Mapping[str, Any]) -> ModelFacts:
    """The inverse of facts_to_json; ValueError for anything else (a stale or damaged cache entry)."""
    _field(d, "schema", lambda v: v == FACTS_SCHEMA)
    layer_keys = ("has_kv", "swa", "recurrent", "n_embd_k_gqa", "n_embd_v_gqa", "n_embd_r", "n_embd_s", "n_embd_k_idx")
    raw_layers = _field(d, "layers", lambda v: isinstance(v, list))
    layers = []
    for raw in raw_layers:
        if not isinstance(raw, dict) or set(raw) != set(layer_keys):
            raise ValueError(f"cached model facts: bad layer {raw!r}")
        for key in layer_keys[:3]:
            _field(raw, key, lambda v: isinstance(v, bool))
        for key in layer_keys[3:]:
            _field(raw, key, _is_int)
        layers.append(LayerKV(**raw))
    swa_types = ("none", "standard", "chunked", "symmetric")
    is_bool: Callable[[Any], bool] = lambda v: isinstance(v, bool)  # noqa: E731
    return ModelFacts(
        path=_field(d, "path", lambda v: isinstance(v, str)),
        file_size=_field(d, "file_size", _is_int),
        architecture=_field(d, "architecture", lambda v: isinstance(v, str)),
        name=_field(d, "name", lambda v: v is None or isinstance(v, str)),
        known_architecture=_field(d, "known_architecture", is_bool),
        block_count=_field(d, "block_count", _is_int),
        nextn_predict_layers=_field(d, "nextn_predict_layers", _is_int),
        embedding_length=_field(d, "embedding_length", _is_int),
        context_length=_field(d, "context_length", _is_int),
        feed_forward_length=_field(d, "feed_forward_length", _is_int),
        vocab_size=_field(d, "vocab_size", _is_int),
        head_count=_ints(d, "head_count"),
        head_count_kv=_ints(d, "head_count_kv"),
        key_length=_ints(d, "key_length"),
        value_length=_ints(d, "value_length"),
        layers=tuple(layers),
        sliding_window=_field(d, "sliding_window", _is_int),
        swa_type=_field(d, "swa_type", lambda v: v in swa_types),
        is_mla=_field(d, "is_mla", is_bool),
        is_recurrent=_field(d, "is_recurrent", is_bool),
        is_hybrid=_field(d, "is_hybrid", is_bool),
        n_layer_kv_from_start=_field(d, "n_layer_kv_from_start", _is_int),
        weight_bytes_per_layer=_ints(d, "weight_bytes_per_layer"),
        other_weight_bytes=_field(d, "other_weight_bytes", _is_int),
        notes=tuple(_field(d, "notes", lambda v: isinstance(v, list) and all(isinstance(x, str) for x in v))),
        tensors=tuple(
            (name, size)
            for name, size in _field(
                d,
                "tensors",
                lambda v: (
                    isinstance(v, list)
                    and all(isinstance(t, list) and len(t) == 2 and isinstance(t[0], str) and _is_int(t[1]) for t in v)
                ),
            )
        ),
        tensor_types=tuple(
            _field(d, "tensor_types", lambda v: isinstance(v, list) and all(isinstance(x, str) for x in v))
        ),
    )
