"""Reading one header's hyperparameters by its architecture's rule: typed metadata access (every bad value a
one-line GGUFError naming the key), sliding-window patterns, recurrent and attending layers, state rows,
indexed layers, the vocabulary size.

Owns those readings; must not decide what they cost (model.facts assembles them, model.kv sizes caches)."""

from __future__ import annotations

from typing import NoReturn

from safe_llama.model.arch import LLAMA_MAX_LAYERS, ArchRule, SwaRule
from safe_llama.model.gguf_constants import constants
from safe_llama.model.gguf_header import (
    MAX_KEPT_STRING,
    GGUFError,
    GGUFHeader,
    MetadataValue,
    SkippedArray,
    SkippedString,
    printable,
    value_type_name,
)


class Meta:
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
        if isinstance(value, SkippedString):
            self.fail(f"key {printable(key)} is a string of {value.length} bytes, expected at most {MAX_KEPT_STRING}")
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


def swa_pattern(m: Meta, rule: SwaRule, n_layer_all: int, n_layer: int) -> list[bool]:
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


def recurrent_layers(
    m: Meta,
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


def attending_layers(rule: ArchRule, recurrent: list[bool], n_ff: tuple[int, ...], n_layer: int) -> list[bool]:
    """create_memory's attention filter for hybrids; every layer otherwise."""
    n_layer_all = len(recurrent)
    if rule.memory != "hybrid" or rule.recurrent_layers == "all":
        return [True] * n_layer_all
    if rule.recurrent_layers == "no_kv_heads_no_ff":
        return [not recurrent[il] and n_ff[il] == 0 for il in range(n_layer_all)]
    if rule.recurrent_layers == "interval":
        return [il < n_layer and not recurrent[il] for il in range(n_layer_all)]
    return [not r for r in recurrent]


def state_rows(m: Meta, rule: ArchRule, n_embd: int, n_head: int, head_k: int) -> tuple[int, int]:
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


def indexed_layers(m: Meta, rule: ArchRule, n_layer_all: int, n_layer: int, n_ctx_train: int) -> list[bool]:
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


def generic_rule(m: Meta) -> ArchRule:
    """For an architecture without a table entry: guess the memory from the keys present."""
    if m.k("wkv.head_size") in m.metadata:
        return ArchRule(memory="recurrent", state="wkv", mla=True)
    if m.k("ssm.conv_kernel") in m.metadata or m.k("ssm.inner_size") in m.metadata:
        return ArchRule(memory="hybrid", recurrent_layers="no_kv_heads", state="ssm_groups", mla=True)
    return ArchRule(mla=True)


def read_vocab_size(m: Meta, header: GGUFHeader) -> int:
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


def block_index(name: str) -> int | None:
    if not name.startswith("blk."):
        return None
    number = name[4:].partition(".")[0]
    return int(number) if number.isdigit() else None
