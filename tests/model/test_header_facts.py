"""Tests for safe_llama.model.header_facts: tables of hand-built metadata and the facts llama.cpp's rules give,
plus the bundled Gemma 3 read for real."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from safe_llama.model.facts import LayerKV, ModelFacts
from safe_llama.model.facts_cache import facts_from_json, facts_to_json
from safe_llama.model.gguf_header import GGUFError, GGUFHeader, MetadataValue, SkippedArray, TensorInfo
from safe_llama.model.header_facts import load_model_facts, model_facts


def meta(arch: str, n_layer: int, n_embd: int, n_head: int | None, **keys: MetadataValue) -> dict[str, Any]:
    """Metadata with the required keys; keyword names are the key after '{arch}.', dots as '__'."""
    md: dict[str, Any] = {
        "general.architecture": arch,
        f"{arch}.block_count": n_layer,
        f"{arch}.embedding_length": n_embd,
        f"{arch}.context_length": 4096,
    }
    if n_head is not None:
        md[f"{arch}.attention.head_count"] = n_head
    md.update({f"{arch}.{key.replace('__', '.')}": value for key, value in keys.items()})
    return md


def facts_of(md: dict[str, Any], tensors: tuple[TensorInfo, ...] = ()) -> ModelFacts:
    return model_facts(GGUFHeader(path="/m.gguf", metadata=md, tensors=tensors))


def kv(k: int, v: int, *, swa: bool = False, has_kv: bool = True) -> LayerKV:
    return LayerKV(has_kv, swa, False, k, v, 0, 0)


def rec(r: int, s: int) -> LayerKV:
    return LayerKV(False, False, True, 0, 0, r, s)


G3 = dict(attention__head_count_kv=1, attention__key_length=256, attention__value_length=256)
DS = dict(attention__head_count_kv=1, attention__key_length=576, attention__value_length=512)
SSM = dict(ssm__conv_kernel=4, ssm__inner_size=1536, ssm__state_size=16, ssm__time_step_rank=48)

CASES = [
    pytest.param(
        meta("llama", 3, 4096, 32, attention__head_count_kv=8),
        dict(layers=(kv(1024, 1024),) * 3, swa_type="none", sliding_window=0, key_length=(128,) * 3),
        id="llama-gqa",
    ),
    pytest.param(
        meta("llama", 2, 2048, 16),
        dict(layers=(kv(2048, 2048),) * 2, head_count_kv=(16, 16)),
        id="llama-kv-heads-default-to-heads",
    ),
    pytest.param(
        meta("deci", 4, 8192, 64, attention__head_count_kv=(8, 0, 4, 8)),
        dict(layers=(kv(1024, 1024), kv(0, 0), kv(512, 512), kv(1024, 1024)), head_count_kv=(8, 0, 4, 8)),
        id="per-layer-kv-heads",
    ),
    pytest.param(
        meta(
            "qwen2",
            2,
            896,
            14,
            attention__head_count_kv=2,
            attention__key_length=128,
            attention__value_length=96,
        ),
        dict(layers=(kv(256, 192),) * 2, key_length=(128, 128), value_length=(96, 96)),
        id="head-dim-not-embd-over-heads",
    ),
    pytest.param(
        meta("gemma3", 12, 1152, 4, attention__sliding_window=1024, **G3),
        dict(
            layers=((kv(256, 256, swa=True),) * 5 + (kv(256, 256),)) * 2,
            swa_type="standard",
            sliding_window=1024,
            is_swa_model=True,
        ),
        id="gemma3-swa-5-to-1",
    ),
    pytest.param(
        meta("gemma3", 6, 1152, 4, **G3),
        dict(layers=(kv(256, 256),) * 6, swa_type="none", sliding_window=0, is_swa_model=False),
        id="gemma3-without-window",
    ),
    pytest.param(
        meta(
            "gemma3",
            4,
            1152,
            4,
            attention__sliding_window=512,
            attention__sliding_window_pattern=(True, False, True, False),
            **G3,
        ),
        dict(layers=(kv(256, 256, swa=True), kv(256, 256)) * 2),
        id="explicit-pattern-array",
    ),
    pytest.param(
        meta("gemma3", 6, 1152, 4, attention__sliding_window=512, attention__sliding_window_pattern=3, **G3),
        dict(layers=(kv(256, 256, swa=True), kv(256, 256, swa=True), kv(256, 256)) * 2),
        id="scalar-pattern",
    ),
    pytest.param(
        meta(
            "gemma3",
            3,
            1152,
            4,
            attention__sliding_window=512,
            attention__key_length_swa=128,
            attention__value_length_swa=64,
            attention__sliding_window_pattern=(True, True),
            **G3,
        ),
        dict(layers=(kv(128, 64, swa=True), kv(128, 64, swa=True), kv(256, 256)), key_length=(128, 128, 256)),
        id="swa-head-dims-and-short-pattern",
    ),
    pytest.param(
        meta(
            "gemma2",
            4,
            2304,
            8,
            attention__head_count_kv=4,
            attention__key_length=256,
            attention__value_length=256,
        ),
        dict(layers=(kv(1024, 1024, swa=True), kv(1024, 1024)) * 2, sliding_window=4096),
        id="gemma2-default-window",
    ),
    pytest.param(
        meta("cohere2", 8, 4096, 32, attention__head_count_kv=8, attention__sliding_window=4096),
        dict(layers=((kv(1024, 1024, swa=True),) * 3 + (kv(1024, 1024),)) * 2),
        id="cohere2-period-4",
    ),
    pytest.param(
        meta("llama4", 4, 5120, 40, attention__head_count_kv=8, attention__sliding_window=1234),
        dict(
            layers=(kv(1024, 1024, swa=True),) * 3 + (kv(1024, 1024),),
            swa_type="chunked",
            sliding_window=8192,
        ),
        id="llama4-chunked",
    ),
    pytest.param(
        meta("llama4", 2, 5120, 40, attention__head_count_kv=8, attention__sliding_window=0),
        dict(layers=(kv(1024, 1024),) * 2, swa_type="none"),
        id="llama4-window-0",
    ),
    pytest.param(
        meta(
            "gpt-oss",
            4,
            2880,
            64,
            attention__head_count_kv=8,
            attention__key_length=64,
            attention__value_length=64,
            attention__sliding_window=128,
        ),
        dict(layers=(kv(512, 512, swa=True), kv(512, 512)) * 2, sliding_window=128),
        id="gpt-oss-period-2",
    ),
    pytest.param(
        meta(
            "gemma3n",
            30,
            2048,
            8,
            attention__head_count_kv=2,
            attention__key_length=256,
            attention__value_length=256,
            attention__sliding_window=512,
        ),
        dict(
            layers=tuple(kv(512, 512, swa=il % 5 < 4, has_kv=il < 20) for il in range(30)),
            n_layer_kv_from_start=20,
        ),
        id="gemma3n-kv-from-start",
    ),
    pytest.param(
        meta(
            "gemma4",
            4,
            1536,
            8,
            attention__head_count_kv=1,
            attention__key_length=512,
            attention__value_length=512,
            attention__key_length_swa=256,
            attention__value_length_swa=256,
            attention__sliding_window=512,
            attention__sliding_window_pattern=(True, False, True, False),
            attention__shared_kv_layers=2,
        ),
        dict(
            layers=(
                kv(256, 256, swa=True),
                kv(512, 512),
                kv(256, 256, swa=True, has_kv=False),
                kv(512, 512, has_kv=False),
            ),
            n_layer_kv_from_start=2,
        ),
        id="gemma4-shared-kv",
    ),
    pytest.param(
        meta(
            "deepseek2",
            2,
            7168,
            128,
            attention__kv_lora_rank=512,
            attention__key_length_mla=192,
            attention__value_length_mla=128,
            **DS,
        ),
        dict(layers=(kv(576, 0),) * 2, is_mla=True, key_length=(576, 576), value_length=(512, 512)),
        id="mla",
    ),
    pytest.param(
        meta("deepseek2", 2, 5120, 128, attention__key_length=192, attention__value_length=128),
        dict(layers=(kv(128 * 192, 128 * 128),) * 2, is_mla=False),
        id="deepseek2-without-mla-keys",
    ),
    pytest.param(
        meta(
            "glm4moe",
            4,
            4096,
            96,
            attention__head_count_kv=8,
            attention__key_length=128,
            attention__value_length=128,
            nextn_predict_layers=1,
        ),
        dict(layers=(kv(1024, 1024),) * 3 + (kv(1024, 1024, has_kv=False),), nextn_predict_layers=1),
        id="nextn-layer-has-no-kv",
    ),
    pytest.param(
        meta("mamba", 2, 768, 0, attention__head_count_kv=0, **SSM),
        dict(layers=(rec(3 * 1536, 16 * 1536),) * 2, is_recurrent=True, is_hybrid=False),
        id="mamba",
    ),
    pytest.param(
        meta("mamba", 2, 768, None, **SSM),
        dict(layers=(rec(3 * 1536, 16 * 1536),) * 2, head_count=(0, 0)),
        id="mamba-without-head-count",
    ),
    pytest.param(
        meta(
            "mamba2",
            2,
            2048,
            0,
            ssm__conv_kernel=4,
            ssm__inner_size=4096,
            ssm__state_size=128,
            ssm__time_step_rank=64,
            ssm__group_count=8,
        ),
        dict(layers=(rec(3 * (4096 + 2 * 8 * 128), 128 * 4096),) * 2, is_recurrent=True),
        id="mamba2-groups",
    ),
    pytest.param(
        meta("rwkv6", 3, 2048, 0, wkv__head_size=64, time_mix_extra_dim=32, time_decay_extra_dim=64),
        dict(layers=(rec(2 * 2048, 2048 * 64),) * 3, is_recurrent=True),
        id="rwkv6",
    ),
    pytest.param(
        meta("rwkv7", 2, 768, 0, wkv__head_size=64, token_shift_count=1),
        dict(layers=(rec(768, 768 * 64),) * 2),
        id="rwkv7-token-shift",
    ),
    pytest.param(
        meta("jamba", 4, 4096, 32, attention__head_count_kv=(0, 0, 8, 0), ssm__group_count=8, **SSM),
        dict(
            layers=(
                rec(3 * 1536, 16 * 1536),
                rec(3 * 1536, 16 * 1536),
                kv(1024, 1024),
                rec(3 * 1536, 16 * 1536),
            ),
            is_hybrid=True,
        ),
        id="jamba-hybrid-ignores-group-count",
    ),
    pytest.param(
        meta(
            "qwen3next",
            4,
            2048,
            16,
            attention__head_count_kv=2,
            attention__key_length=256,
            attention__value_length=256,
            ssm__conv_kernel=4,
            ssm__inner_size=4096,
            ssm__state_size=128,
            ssm__group_count=16,
            ssm__time_step_rank=32,
            full_attention_interval=2,
        ),
        dict(
            layers=(
                LayerKV(False, False, True, 512, 512, 3 * (4096 + 2 * 16 * 128), 128 * 4096),
                kv(512, 512),
            )
            * 2,
            is_hybrid=True,
        ),
        id="qwen3next-interval",
    ),
    pytest.param(
        meta(
            "falcon-h1",
            2,
            1024,
            8,
            attention__head_count_kv=2,
            ssm__conv_kernel=4,
            ssm__inner_size=1024,
            ssm__state_size=16,
            ssm__group_count=1,
            ssm__time_step_rank=16,
        ),
        dict(layers=(LayerKV(True, False, True, 256, 256, 3 * (1024 + 32), 16 * 1024),) * 2, is_hybrid=True),
        id="falcon-h1-every-layer-both",
    ),
    pytest.param(
        meta(
            "lfm2",
            3,
            1024,
            16,
            attention__head_count_kv=(0, 8, 0),
            shortconv__l_cache=3,
            attention__sliding_window=512,
        ),
        dict(layers=(rec(2 * 1024, 0), kv(512, 512, swa=True), rec(2 * 1024, 0)), swa_type="standard"),
        id="lfm2-shortconv-swa",
    ),
    pytest.param(
        meta("bert", 2, 768, 12),
        dict(layers=(kv(768, 768, has_kv=False),) * 2, known_architecture=True),
        id="encoder-has-no-kv",
    ),
    pytest.param(
        meta("foo", 2, 512, 8, attention__head_count_kv=2, attention__sliding_window=128),
        dict(
            layers=(kv(128, 128),) * 2,
            known_architecture=False,
            notes=("unknown architecture 'foo': generic rules used",),
            swa_type="none",
        ),
        id="unknown-arch",
    ),
    pytest.param(
        meta("t5", 2, 512, 8),
        dict(
            known_architecture=False,
            notes=(
                "architecture 't5' is not modelled exactly (an encoder-decoder, draft head or projector): "
                "its KV estimate is of unknown direction",
            ),
        ),
        id="unmodelled-arch",
    ),
    pytest.param(
        meta("bar", 2, 512, 0, ssm__conv_kernel=4, ssm__inner_size=1024, ssm__state_size=16),
        dict(layers=(rec(3 * 1024, 16 * 1024),) * 2, known_architecture=False),
        id="unknown-arch-with-ssm-keys",
    ),
]


@pytest.mark.parametrize(("metadata", "expected"), CASES)
def test_facts(metadata: dict[str, Any], expected: dict[str, Any]) -> None:
    facts = facts_of(metadata)
    for name, value in expected.items():
        assert getattr(facts, name) == value, name


BAD = [
    pytest.param({}, "missing key general.architecture", id="no-architecture"),
    pytest.param(
        {"general.architecture": 3},
        "key general.architecture has type integer, expected string",
        id="architecture-not-string",
    ),
    pytest.param(
        {**meta("llama", 2, 64, 4), "llama.block_count": "2"},
        "key llama.block_count has type string, expected uint32",
        id="block-count-string",
    ),
    pytest.param(
        {**meta("llama", 2, 64, 4), "llama.block_count": 2.0},
        "key llama.block_count has type float32, expected uint32",
        id="block-count-float",
    ),
    pytest.param(
        {**meta("llama", 2, 64, 4), "llama.block_count": True},
        "key llama.block_count has type bool, expected uint32",
        id="block-count-bool",
    ),
    pytest.param(
        {**meta("llama", 2, 64, 4), "llama.block_count": 0},
        "key llama.block_count is 0, expected 1 to 512",
        id="zero-layers",
    ),
    pytest.param(
        {**meta("llama", 2, 64, 4), "llama.block_count": 100000},
        "is 100000, expected 1 to 512",
        id="too-many-layers",
    ),
    pytest.param({**meta("llama", 2, 64, 4), "llama.embedding_length": -1}, "is -1, expected a uint32", id="negative"),
    pytest.param(
        {k: v for k, v in meta("llama", 2, 64, 4).items() if k != "llama.block_count"},
        "missing key llama.block_count",
        id="no-block-count",
    ),
    pytest.param(
        {k: v for k, v in meta("llama", 2, 64, 4).items() if k != "llama.embedding_length"},
        "missing key llama.embedding_length",
        id="no-embedding-length",
    ),
    pytest.param(meta("llama", 2, 64, None), "missing key llama.attention.head_count", id="no-head-count"),
    pytest.param(
        meta("llama", 3, 64, 4, attention__head_count_kv=(1, 2)),
        "key llama.attention.head_count_kv has 2 entries, expected 3 (one per layer)",
        id="kv-heads-wrong-length",
    ),
    pytest.param(
        meta("llama", 2, 64, 4, attention__head_count_kv=SkippedArray(4, 100000)),
        "has 100000 entries, expected 2",
        id="kv-heads-skipped",
    ),
    pytest.param(
        meta("llama", 2, 64, 4, attention__head_count_kv=("a", "b")),
        "must be an array of integers, found 'a'",
        id="kv-heads-strings",
    ),
    pytest.param(
        meta("gemma3", 2, 64, 4, attention__sliding_window=8, attention__sliding_window_pattern=(0.5, 1.0)),
        "must be an array of bool or integers, found 0.5",
        id="pattern-floats",
    ),
    pytest.param(meta("cohere2", 2, 64, 4), "missing key cohere2.attention.sliding_window", id="window-required"),
    pytest.param(
        meta(
            "gemma4",
            2,
            64,
            4,
            attention__sliding_window=8,
            attention__key_length_swa=8,
            attention__value_length_swa=8,
        ),
        "missing key gemma4.attention.sliding_window_pattern",
        id="pattern-required",
    ),
    pytest.param(meta("mamba", 2, 64, 0), "missing key mamba.ssm.conv_kernel", id="ssm-keys-required"),
]


@pytest.mark.parametrize(("metadata", "problem"), BAD)
def test_bad_metadata(metadata: dict[str, Any], problem: str) -> None:
    with pytest.raises(GGUFError) as caught:
        facts_of(metadata)
    assert str(caught.value) == f"safe-llama: /m.gguf: {problem}" or problem in str(caught.value)
    assert "\n" not in str(caught.value)


def test_stored_type_names_the_gguf_type() -> None:
    header = GGUFHeader(
        path="/m.gguf",
        metadata={**meta("llama", 2, 64, 4), "llama.block_count": "2"},
        value_types={"llama.block_count": 8},
    )
    with pytest.raises(GGUFError, match=r"key llama.block_count has type string, expected uint32$"):
        model_facts(header)


def test_weights_per_layer() -> None:
    tensors = (
        TensorInfo("token_embd.weight", (64, 100), 0, 0, 25600),
        TensorInfo("blk.0.attn_q.weight", (64, 64), 0, 25600, 16384),
        TensorInfo("blk.0.ffn_up.weight", (64, 32), 0, 41984, 8192),
        TensorInfo("blk.1.attn_q.weight", (64, 64), 0, 50176, 16384),
        TensorInfo("blk.7.attn_q.weight", (64, 64), 0, 66560, 16384),  # past block_count: counted as other
        TensorInfo("output_norm.weight", (64,), 0, 82944, 256),
    )
    facts = facts_of(meta("llama", 2, 64, 4), tensors)
    assert facts.weight_bytes_per_layer == (16384 + 8192, 16384)
    assert facts.other_weight_bytes == 25600 + 16384 + 256
    assert facts.total_weight_bytes == sum(t.n_bytes for t in tensors)
    assert facts.vocab_size == 100  # from token_embd, as there is no token list


def test_vocab_size_and_ffn() -> None:
    md = {
        **meta("llama", 2, 64, 4, feed_forward_length=(128, 256)),
        "tokenizer.ggml.tokens": SkippedArray(8, 32000),
    }
    facts = facts_of(md)
    assert (facts.vocab_size, facts.feed_forward_length) == (32000, 256)


def test_v_padding_width() -> None:
    facts = facts_of(meta("deci", 3, 1024, 8, attention__head_count_kv=(1, 4, 2)))
    assert facts.n_embd_v_gqa_max == 4 * 128


def test_bundled_gemma3(bundled_model: Path) -> None:
    facts = load_model_facts(bundled_model)
    assert (facts.architecture, facts.name, facts.known_architecture) == ("gemma3", "Gemma 3 270m", True)
    assert facts.block_count == 18
    assert set(facts.head_count_kv) == {1} and set(facts.key_length) == {256} == set(facts.value_length)
    assert (facts.sliding_window, facts.swa_type, facts.is_swa_model) == (512, "standard", True)
    assert [layer.swa for layer in facts.layers] == [il % 6 < 5 for il in range(18)]
    assert sum(layer.swa for layer in facts.layers) == 15
    assert all(layer.has_kv and layer.n_embd_k_gqa == layer.n_embd_v_gqa == 256 for layer in facts.layers)
    assert (facts.context_length, facts.embedding_length, facts.vocab_size) == (32768, 640, 262144)
    assert facts.total_weight_bytes < facts.file_size
    assert facts.notes == ()
    assert facts_from_json(json.loads(json.dumps(facts_to_json(facts)))) == facts


def test_integer_key_of_the_wrong_width_is_noted() -> None:
    header = GGUFHeader(path="/m.gguf", metadata=meta("llama", 2, 64, 4), value_types={"llama.block_count": 10})
    assert model_facts(header).notes == ("key llama.block_count is uint64: llama.cpp wants uint32 and refuses it",)


MLA = dict(attention__key_length_mla=192, attention__value_length_mla=128)
NEW_RULES = [
    pytest.param(
        # src/models/kimi-linear.cpp: n_head_kv == 0 marks a KDA layer; llama_hparams::n_embd_r/n_embd_s
        meta(
            "kimi-linear",
            2,
            2048,
            32,
            attention__head_count_kv=(0, 1),
            attention__key_length=576,
            **MLA,
            kda__head_dim=128,
            ssm__conv_kernel=4,
        ),
        (
            LayerKV(False, False, True, 0, 0, 3 * 3 * 32 * 128, 128 * 128 * 32),
            LayerKV(True, False, False, 576, 0, 0, 0),
        ),
        id="kimi-linear-kda",
    ),
    pytest.param(
        # src/models/minimax-01.cpp: every 8th layer attends; the state is one head_dim^2 matrix per head
        meta("minimax-01", 8, 512, 8),
        (LayerKV(False, False, True, 512, 512, 0, 64 * 64 * 8),) * 7 + (LayerKV(True, False, False, 512, 512, 0, 0),),
        id="minimax-01-lightning",
    ),
    pytest.param(
        # llama_kv_cache_dsa: one indexer key head per trunk layer, next to the MLA cache
        meta("deepseek32", 2, 2048, 16, **DS, **MLA, attention__indexer__key_length=128),
        (LayerKV(True, False, False, 576, 0, 0, 0, 128),) * 2,
        id="deepseek32-indexer",
    ),
    pytest.param(
        # src/models/glm-dsa.cpp: a 1M-token context means GLM-5.2 and its default indexer types
        meta("glm-dsa", 7, 2048, 16, **DS, **MLA, attention__indexer__key_length=64, context_length=1048576),
        tuple(LayerKV(True, False, False, 576, 0, 0, 0, 64 if il in (0, 1, 2, 6) else 0) for il in range(7)),
        id="glm-5.2-indexer-types",
    ),
    pytest.param(
        # src/models/nanbeige.cpp: num_loops passes over the stack, each with its own KV
        meta("nanbeige", 2, 256, 4, num_loops=3),
        (LayerKV(True, False, False, 256, 256, 0, 0),) * 6,
        id="nanbeige-loops",
    ),
]


@pytest.mark.parametrize(("metadata", "layers"), NEW_RULES)
def test_layers_of_newer_architectures(metadata: dict[str, Any], layers: tuple[LayerKV, ...]) -> None:
    facts = facts_of(metadata)
    assert facts.layers == layers
    assert facts.known_architecture
    assert not facts.notes
