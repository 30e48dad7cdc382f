"""The sparse-attention memories read from hand-built headers (model.sparse through model.facts) and sized
by model.kv, with plain values; tests/model/test_archs_real.py holds them against the real binaries."""

from __future__ import annotations

from typing import Any

import pytest

from safe_llama.model.kv import KvRequest, plan_kv, row_bytes
from safe_llama.model.sparse import SparseMemory
from tests.model.test_header_facts import facts_of, meta

MLA = dict(attention__key_length_mla=192, attention__value_length_mla=128)


def test_msa_indexer_rows_skip_the_leading_dense_layers_and_keep_a_value_head() -> None:
    facts = facts_of(meta("minimax-m3", 3, 256, 2, leading_dense_block_count=1, attention__indexer__key_length=64))
    assert facts.sparse == SparseMemory("msa", (0, 64, 64), (0, 128, 128), 128)
    assert [layer.n_embd_k_idx for layer in facts.layers] == [0, 64, 64]
    assert not facts.notes
    kv = plan_kv(facts, KvRequest("completion", n_ctx=4096, flash_attn="on"))
    assert [(c.kind, c.cells, c.layers) for c in kv.caches] == [("full", 4096, 3), ("indexer", 4096, 2)]
    assert kv.caches[1].k_bytes == 2 * 4096 * 64 * 2 and kv.caches[1].v_bytes == 2 * 4096 * 128 * 2


def test_dsa_iswa_makes_its_dsa_pair_before_the_window_cache() -> None:
    md = meta(
        "dots3note",
        4,
        128,
        1,
        attention__head_count_kv=1,
        attention__key_length=576,
        attention__value_length=512,
        attention__sliding_window=32,
        attention__sliding_window_pattern=(False, True, False, True),
        attention__indexer__key_length=128,
        attention__indexer__types=(True, False, True, False),
        **MLA,
    )
    facts = facts_of(md)
    assert facts.sparse is not None and facts.sparse.kind == "dsa_iswa"
    kv = plan_kv(facts, KvRequest("completion", n_ctx=8192, flash_attn="on"))
    assert [(c.kind, c.cells, c.layers) for c in kv.caches] == [
        ("full", 8192, 2),
        ("indexer", 8192, 2),
        ("swa", 768, 2),
    ]
    assert all(c.v_bytes == 0 for c in kv.caches)  # MLA and the indexer: K only


def _dsv4(**keys: Any) -> dict[str, Any]:
    return meta(
        "deepseek4",
        4,
        512,
        8,
        attention__head_count_kv=1,
        attention__key_length=64,
        attention__value_length=64,
        attention__sliding_window=32,
        attention__sliding_window_pattern=2,  # ignored: every layer slides
        attention__indexer__key_length=128,
        attention__compress_ratios=(0, 0, 4, 128),
        **keys,
    )


def test_dsv4_caches_keep_a_stream_per_sequence_and_compressor_states() -> None:
    facts = facts_of(_dsv4())
    assert all(layer.swa for layer in facts.layers) and facts.is_mla
    kv = plan_kv(facts, KvRequest("server", n_ctx=8192))  # 4 slots sharing one unified KV
    shape = [(c.kind, c.cells, c.layers, c.n_stream) for c in kv.caches]
    assert shape == [
        ("full", 8192, 0, 4),
        ("swa", 768, 4, 4),
        ("csa", 2048, 1, 4),
        ("hca", 256, 1, 4),
        ("indexer", 2048, 1, 4),
        ("csa state", 8, 1, 4),
        ("hca state", 128, 1, 4),
        ("lid state", 8, 1, 4),
    ]
    assert kv.caches[1].k_bytes == 4 * row_bytes("f16", 64) * 768 * 4 and kv.caches[1].v_bytes == 0
    # the states are f32 kv and score planes: 2 x width x size x streams per layer
    assert [c.total_bytes for c in kv.caches[5:]] == [2 * 4 * 128 * 8 * 4, 2 * 4 * 64 * 128 * 4, 2 * 4 * 256 * 8 * 4]


def test_dsv4_without_mtp_weights_counts_the_nextn_layers_as_trunk_layers() -> None:
    facts = facts_of(_dsv4(nextn_predict_layers=1))
    assert facts.nextn_predict_layers == 0
    assert facts.sparse is not None and facts.sparse.n_layer == 4


@pytest.mark.parametrize(
    ("arch", "keys", "idx_k", "ple"),
    [
        pytest.param(
            "glm5-next",
            dict(
                attention__head_count_kv=(1, 0, 1, 1),
                attention__key_length=512,
                attention__value_length=512,
                attention__indexer__key_length=128,
                attention__indexer__kpool=4,
                nextn_predict_layers=1,
                kda__head_dim=128,
                ssm__conv_kernel=4,
                **MLA,
            ),
            (384, 0, 384, 0),  # key | gate | pooled; the MTP layer is never attended
            (0, 0, 0, 0),
            id="glm5-next-kpool",
        ),
        pytest.param(
            "qwen4exp",
            dict(
                full_attention_interval=2,
                attention__indexer__key_length=64,
                attention__compress_ratios=(4, 4, 4, 4),
                ssm__conv_kernel=4,
                ssm__inner_size=256,
                ssm__state_size=128,
                ssm__group_count=2,
                hyper_connection__count=4,
                ple__layers=(0,),
                ple__ngram_size=3,
                ple__heads_per_ngram=2,
                ple__conv_kernel=4,
            ),
            (0, 128, 0, 128),  # raw key | pooled key on the attention layers
            (3 * 3 * 4 * 256, 0, 0, 0),  # (kernel - 1) x n-gram x hyper-connections x n_embd
            id="qwen4exp-qsa-ple",
        ),
    ],
)
def test_hybrid_idx_rows(arch: str, keys: dict[str, Any], idx_k: tuple[int, ...], ple: tuple[int, ...]) -> None:
    facts = facts_of(meta(arch, 4, 256, 1, **keys))
    assert facts.sparse is not None and facts.sparse.kind == "hybrid_idx"
    assert facts.sparse.idx_k == idx_k and (facts.sparse.ple_rows or (0,) * 4) == ple
    kv = plan_kv(facts, KvRequest("completion", n_ctx=4096, n_parallel=2))
    kinds = [c.kind for c in kv.caches]
    assert kinds == ["full", "indexer", "recurrent"]
    assert kv.caches[1].v_bytes == 0 and kv.caches[1].layers == sum(1 for k in idx_k if k)
    assert kv.caches[2].p_bytes == sum(4 * row * 2 for row in ple)  # f32 rows, one per sequence
