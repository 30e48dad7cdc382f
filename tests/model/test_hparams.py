"""model.hparams: one header's hyperparameters read by its architecture's rule. Hand-built headers in; the typed
readings, the layer patterns and the state sizes out, and every bad value a one-line GGUFError naming the key."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import pytest

from safe_llama.model.arch import ARCHITECTURES, ArchRule, SwaRule
from safe_llama.model.gguf_header import GGUFError, GGUFHeader, MetadataValue, SkippedArray, TensorInfo
from safe_llama.model.hparams import (
    Meta,
    attending_layers,
    block_index,
    generic_rule,
    indexed_layers,
    read_vocab_size,
    recurrent_layers,
    state_rows,
    swa_pattern,
)

UINT32, UINT64, STRING = 4, 10, 8  # GGUFValueType


def meta(arch: str = "x", value_types: dict[str, int] | None = None, **keys: MetadataValue) -> Meta:
    """A Meta over '{arch}.<key>' keys (dots written '__'), its arch set as model.facts sets it."""
    return meta_of(arch, keys, value_types)


def meta_of(arch: str, keys: Mapping[str, MetadataValue], value_types: dict[str, int] | None = None) -> Meta:
    header = GGUFHeader(
        path="/m.gguf",
        metadata={f"{arch}.{key.replace('__', '.')}": value for key, value in keys.items()},
        value_types=value_types or {},
    )
    m = Meta(header)
    m.arch = arch
    return m


def problem(call: Any, *args: Any, **kw: Any) -> str:
    """The problem of the GGUFError a reading raises (its message names the file too)."""
    with pytest.raises(GGUFError) as err:
        call(*args, **kw)
    assert err.value.message == f"safe-llama: /m.gguf: {err.value.problem}"
    return err.value.problem


def test_strings() -> None:
    m = meta(name="Gemma", count=3)
    assert m.string("x.name") == "Gemma" and m.string("x.absent") is None
    assert problem(m.string, "x.count") == "key x.count has type integer, expected string"


def test_unsigned_integers() -> None:
    m = meta(block_count=18, flag=True, big=1 << 32, negative=-1, text="18")
    assert m.uint("x.block_count") == 18 and m.optional_uint("x.block_count") == 18
    assert m.uint("x.absent", default=7) == 7 and m.optional_uint("x.absent") is None
    assert problem(m.uint, "x.absent") == "missing key x.absent"
    assert problem(m.uint, "x.flag") == "key x.flag has type bool, expected uint32"
    assert problem(m.uint, "x.text") == "key x.text has type string, expected uint32"
    assert problem(m.uint, "x.big") == "key x.big is 4294967296, expected a uint32"
    assert problem(m.uint, "x.negative") == "key x.negative is -1, expected a uint32"
    assert m.notes == []


def test_an_integer_of_another_width_is_noted_once() -> None:
    m = meta(value_types={"x.block_count": UINT64, "x.n": UINT32}, block_count=2, n=3)
    assert (m.uint("x.block_count"), m.uint("x.block_count"), m.uint("x.n")) == (2, 2, 3)
    assert m.notes == ["key x.block_count is uint64: llama.cpp wants uint32 and refuses it"]


def test_a_stored_type_is_named_in_errors() -> None:
    m = meta(value_types={"x.n": STRING}, n="4")
    assert problem(m.uint, "x.n") == "key x.n has type string, expected uint32"


def test_arrays() -> None:
    m = meta(ints=(1, 2, 3), flags=(True, False, 1), scalar=3, long=SkippedArray(UINT32, 9000), mixed=(1, "a"))
    assert m.array("x.ints", flags=False, limit=3) == (1, 2, 3)
    assert m.array("x.flags", flags=True, limit=3) == (1, 0, 1)
    assert problem(m.array, "x.ints", flags=False, limit=2) == "key x.ints has 3 entries, more than 2"
    assert problem(m.array, "x.long", flags=False, limit=512) == "key x.long has 9000 entries, more than 512"
    assert problem(m.array, "x.scalar", flags=False, limit=3) == "key x.scalar has type integer, expected array"
    assert problem(m.array, "x.flags", flags=False, limit=3) == "key x.flags must be an array of integers, found True"
    assert (
        problem(m.array, "x.mixed", flags=True, limit=3)
        == "key x.mixed must be an array of bool or integers, found 'a'"
    )
    assert "found -1" in problem(meta(neg=(1, -1)).array, "x.neg", flags=False, limit=3)


def test_per_layer_values() -> None:
    m = meta(one=8, each=(8, 0, 4), short=(8, 0), flag=True)
    assert m.per_layer("x.one", 3, None) == (8, 8, 8)
    assert m.per_layer("x.each", 3, None) == (8, 0, 4)
    assert m.per_layer("x.absent", 3, (1, 2, 3)) == (1, 2, 3)
    assert m.per_layer("x.flag", 2, None, flags=True) == (1, 1)
    assert problem(m.per_layer, "x.absent", 3, None) == "missing key x.absent"
    assert problem(m.per_layer, "x.short", 3, None) == "key x.short has 2 entries, expected 3 (one per layer)"
    long = meta(many=SkippedArray(UINT32, 100))
    assert "has 100 entries, expected 3" in problem(long.per_layer, "x.many", 3, None)


@pytest.mark.parametrize(
    ("rule", "keys", "pattern"),
    [
        pytest.param(SwaRule(period=6), {}, [True] * 5 + [False] + [True] * 2, id="gemma3-every-sixth-full"),
        pytest.param(
            SwaRule(period=4, dense_first=True),
            {},
            [False, True, True, True, False, True, True, True],
            id="dense-first",
        ),
        pytest.param(
            SwaRule(period=6), {"attention__sliding_window_pattern": 2}, [True, False] * 4, id="key-over-period"
        ),
        pytest.param(SwaRule(period=6), {"attention__sliding_window_pattern": 0}, [True] * 8, id="zero-all-swa"),
        pytest.param(
            SwaRule(),
            {"attention__sliding_window_pattern": (True, False, True)},
            [True, False, True] + [False] * 5,
            id="array",
        ),
    ],
)
def test_swa_pattern(rule: SwaRule, keys: dict[str, MetadataValue], pattern: list[bool]) -> None:
    assert swa_pattern(meta_of("x", keys), rule, 8, 8) == pattern


def test_swa_pattern_stops_at_the_trunk() -> None:
    assert swa_pattern(meta(), SwaRule(period=2), 4, 2) == [True, False, False, False]


def test_swa_pattern_without_a_period_needs_the_array() -> None:
    assert problem(swa_pattern, meta(), SwaRule(), 4, 4) == "missing key x.attention.sliding_window_pattern"
    with_scalar = meta(attention__sliding_window_pattern=2)
    assert problem(swa_pattern, with_scalar, SwaRule(), 4, 4) == (
        "key x.attention.sliding_window_pattern has type integer, expected array"
    )


def test_recurrent_layers_by_rule() -> None:
    kv, ff = (0, 8, 0, 0), (0, 64, 64, 0)
    m = meta()
    assert recurrent_layers(m, ArchRule(memory="recurrent"), kv, ff, 4, 3) == [True, True, True, False]
    assert recurrent_layers(m, ArchRule(memory="hybrid", recurrent_layers="no_kv_heads"), kv, ff, 4, 4) == [
        True, False, True, True,
    ]  # fmt: skip
    assert recurrent_layers(m, ArchRule(memory="hybrid", recurrent_layers="no_kv_heads_no_ff"), kv, ff, 4, 4) == [
        True, False, False, True,
    ]  # fmt: skip
    assert recurrent_layers(m, ArchRule(), kv, ff, 4, 4) == [False] * 4


def test_recurrent_layers_by_interval() -> None:
    rule = ArchRule(memory="hybrid", recurrent_layers="interval")
    none = (0,) * 8
    assert recurrent_layers(meta(), rule, none, none, 8, 8) == [True, True, True, False] * 2
    assert recurrent_layers(meta(full_attention_interval=2), rule, none, none, 8, 8) == [True, False] * 4
    assert recurrent_layers(meta(full_attention_interval=2), rule, none, none, 4, 2) == [True, False, False, False]
    flags = meta(attention__recurrent_layers=(1, 0, 0, 1))
    assert recurrent_layers(flags, rule, none, none, 4, 4) == [True, False, False, True]
    zero = meta(full_attention_interval=0)
    assert problem(recurrent_layers, zero, rule, none, none, 8, 8) == "key x.full_attention_interval is 0"


def test_attending_layers() -> None:
    recurrent = [True, False, True, False]
    assert attending_layers(ArchRule(), recurrent, (0,) * 4, 4) == [True] * 4
    assert attending_layers(ArchRule(memory="hybrid", recurrent_layers="all"), recurrent, (0,) * 4, 4) == [True] * 4
    hybrid = ArchRule(memory="hybrid", recurrent_layers="no_kv_heads")
    assert attending_layers(hybrid, recurrent, (0,) * 4, 4) == [False, True, False, True]
    nemotron = ArchRule(memory="hybrid", recurrent_layers="no_kv_heads_no_ff")
    assert attending_layers(nemotron, recurrent, (0, 0, 0, 64), 4) == [False, True, False, False]  # an FFN layer
    interval = ArchRule(memory="hybrid", recurrent_layers="interval")
    assert attending_layers(interval, recurrent, (0,) * 4, 2) == [False, True, False, False]  # past the trunk


@pytest.mark.parametrize(
    ("arch", "keys", "rows"),
    [
        pytest.param(
            "mamba", dict(ssm__conv_kernel=4, ssm__inner_size=1536, ssm__state_size=16), (3 * 1536, 16 * 1536), id="ssm"
        ),
        pytest.param(
            "mamba2",
            dict(ssm__conv_kernel=4, ssm__inner_size=1536, ssm__state_size=128, ssm__group_count=8),
            (3 * (1536 + 2 * 8 * 128), 128 * 1536),
            id="ssm-groups",
        ),
        pytest.param(
            "mamba2",
            dict(ssm__conv_kernel=4, ssm__inner_size=64, ssm__state_size=8),
            (3 * 64, 8 * 64),
            id="no-groups-key",
        ),
        pytest.param(
            "mamba", dict(ssm__conv_kernel=0, ssm__inner_size=64, ssm__state_size=8), (0, 8 * 64), id="no-conv"
        ),
        pytest.param("rwkv6", dict(wkv__head_size=64), (2 * 2048, 2048 * 64), id="wkv-two-token-shifts"),
        pytest.param("rwkv7", dict(wkv__head_size=64, token_shift_count=1), (2048, 2048 * 64), id="wkv-one-shift"),
        pytest.param("lfm2", dict(shortconv__l_cache=3), (2 * 2048, 0), id="shortconv"),
        pytest.param("lfm2", dict(shortconv__l_cache=0), (0, 0), id="shortconv-none"),
        pytest.param("minimax-01", {}, (0, 128 * 128 * 16), id="lightning"),
        pytest.param(
            "kimi-linear", dict(kda__head_dim=128, ssm__conv_kernel=4), (3 * 3 * 16 * 128, 128 * 128 * 16), id="kda"
        ),
        pytest.param(
            "kimi-linear",
            dict(kda__head_dim=128, ssm__conv_kernel=0),
            (3 * 3 * 16 * 128, 128 * 128 * 16),
            id="kda-default-conv",
        ),
    ],
)
def test_state_rows(arch: str, keys: dict[str, MetadataValue], rows: tuple[int, int]) -> None:
    assert state_rows(meta_of(arch, keys), ARCHITECTURES[arch], 2048, 16, 128) == rows


def test_state_rows_need_their_keys() -> None:
    assert problem(state_rows, meta("mamba"), ARCHITECTURES["mamba"], 64, 1, 64) == "missing key mamba.ssm.conv_kernel"
    assert problem(state_rows, meta("rwkv6"), ARCHITECTURES["rwkv6"], 64, 1, 64) == "missing key rwkv6.wkv.head_size"


def test_indexed_layers() -> None:
    assert indexed_layers(meta(), ArchRule(), 4, 4, 4096) == [False] * 4
    assert indexed_layers(meta(), ArchRule(indexer="all"), 4, 3, 4096) == [True, True, True, False]
    assert indexed_layers(meta(), ArchRule(indexer="types"), 4, 4, 4096) == [True] * 4
    assert indexed_layers(meta(attention__indexer__types=(1, 0, 0, 1)), ArchRule(indexer="types"), 4, 4, 4096) == [
        True, False, False, True,
    ]  # fmt: skip
    # GLM-5.2's default at 1M context: the first two layers, then every fourth from layer 2
    assert indexed_layers(meta(), ArchRule(indexer="types"), 8, 8, 1048576) == [
        True,
        True,
        True,
        False,
        False,
        False,
        True,
        False,
    ]
    top_k = ArchRule(indexer="top_k")
    assert indexed_layers(meta(), top_k, 4, 4, 4096) == [False] * 4
    assert indexed_layers(meta(attention__indexer__top_k=2048), top_k, 4, 4, 4096) == [False] * 4  # types default 0
    assert (
        indexed_layers(meta(attention__indexer__top_k=2048, attention__indexer__types=1), top_k, 4, 4, 4096)
        == [True] * 4
    )


def test_a_generic_rule_guesses_from_the_keys() -> None:
    assert generic_rule(meta(wkv__head_size=64)) == ArchRule(memory="recurrent", state="wkv", mla=True)
    ssm = ArchRule(memory="hybrid", recurrent_layers="no_kv_heads", state="ssm_groups", mla=True)
    assert generic_rule(meta(ssm__conv_kernel=4)) == ssm == generic_rule(meta(ssm__inner_size=64))
    assert generic_rule(meta(block_count=2)) == ArchRule(mla=True)


def test_vocab_size_from_tokens_then_key_then_embeddings() -> None:
    embd = (TensorInfo("token_embd.weight", (64, 300), 0, 0, 1),)

    def vocab(tensors: tuple[TensorInfo, ...] = (), metadata: Mapping[str, MetadataValue] | None = None) -> int:
        m = Meta(GGUFHeader(path="/m.gguf", metadata=metadata or {}, tensors=tensors))
        m.arch = "x"
        return read_vocab_size(m, m.header)

    assert vocab(embd, {"tokenizer.ggml.tokens": SkippedArray(STRING, 32000), "x.vocab_size": 5}) == 32000
    assert vocab((), {"tokenizer.ggml.tokens": ("a", "b", "c")}) == 3
    assert vocab(embd, {"x.vocab_size": 5}) == 5
    assert vocab(embd) == 300
    assert vocab((TensorInfo("token_embd.weight", (64,), 0, 0, 1),)) == 0
    assert vocab() == 0


@pytest.mark.parametrize(
    ("name", "index"),
    [
        ("blk.0.attn_q.weight", 0),
        ("blk.17.ffn_up.weight", 17),
        ("blk.x.attn", None),
        ("output.weight", None),
        ("blk.", None),
    ],
)
def test_block_index(name: str, index: int | None) -> None:
    assert block_index(name) == index
