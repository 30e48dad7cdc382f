"""KV arithmetic against llama.cpp's rules, with plain values (the real-binary matrix is test_kv_real.py)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field, replace

import pytest

from safe_llama.model.kv import (
    Cache,
    KvRequest,
    buffers,
    ctx_unit,
    mib_line,
    pad,
    plan_kv,
    resolve_context,
    row_bytes,
)
from safe_llama.model.sparse import SparseMemory


@dataclass(frozen=True)
class Layer:
    has_kv: bool = True
    swa: bool = False
    recurrent: bool = False
    n_embd_k_gqa: int = 1024
    n_embd_v_gqa: int = 1024
    n_embd_r: int = 0
    n_embd_s: int = 0
    n_embd_k_idx: int = 0


@dataclass(frozen=True)
class Facts:
    context_length: int = 131072
    sliding_window: int = 0
    is_mla: bool = False
    layers: Sequence[Layer] = field(default_factory=tuple)
    sparse: SparseMemory | None = None


LLAMA_3B = Facts(layers=tuple(Layer() for _ in range(28)))  # 8 KV heads x 128
GEMMA3_270M = Facts(
    context_length=32768,
    sliding_window=512,
    layers=tuple(Layer(swa=il % 6 < 5, n_embd_k_gqa=256, n_embd_v_gqa=256) for il in range(18)),
)


def test_seed_single_allocation() -> None:
    kv = plan_kv(LLAMA_3B, KvRequest(tool="completion", n_ctx=65536))
    assert kv.total_bytes == 7_516_192_768
    assert buffers(kv.caches[0].tensor_bytes, None) == [7_516_192_768]


def test_seed_split_at_max_alloc_matches_reference() -> None:
    kv = plan_kv(LLAMA_3B, KvRequest(tool="completion", n_ctx=65536))
    assert buffers(kv.caches[0].tensor_bytes, 4_294_959_104) == [4_160_749_568, 3_355_443_200]


@pytest.mark.parametrize(
    ("req", "n_ctx", "n_ctx_seq", "n_seq", "n_stream"),
    [
        pytest.param(KvRequest(tool="server", n_ctx=37449), 37632, 37632, 4, 1, id="server-auto-slots-pad"),
        pytest.param(KvRequest(tool="server", n_ctx=4096, n_parallel=3), 4608, 1536, 3, 3, id="np3-split"),
        pytest.param(
            KvRequest(tool="server", n_ctx=4096, n_parallel=3, kv_unified=True),
            4096,
            4096,
            3,
            1,
            id="np3-kvu",
        ),
        pytest.param(KvRequest(tool="server", n_ctx=1000, n_parallel=2), 1024, 512, 2, 2, id="np2-1000"),
        pytest.param(KvRequest(tool="server", n_parallel=2), 2 * 131072, 131072, 2, 2, id="unset-fit-streams"),
        pytest.param(KvRequest(tool="server", n_parallel=2, fit=False), 131072, 65536, 2, 2, id="unset-nofit"),
        pytest.param(KvRequest(tool="server", n_ctx=0), 131072, 131072, 4, 1, id="c0"),
        pytest.param(KvRequest(tool="completion", n_ctx=1), 256, 256, 1, 1, id="tiny"),
    ],
)
def test_resolve_context(req: KvRequest, n_ctx: int, n_ctx_seq: int, n_seq: int, n_stream: int) -> None:
    ctx = resolve_context(req, 131072)
    assert (ctx.n_ctx, ctx.n_ctx_seq, ctx.n_seq_max, ctx.n_stream) == (n_ctx, n_ctx_seq, n_seq, n_stream)


@pytest.mark.parametrize(
    ("req", "unit"),
    [
        pytest.param(KvRequest(tool="completion"), 256, id="one-slot"),
        pytest.param(KvRequest(tool="server"), 256, id="server-auto-slots-unified"),
        pytest.param(KvRequest(tool="server", n_parallel=3), 768, id="a-stream-per-slot"),
        pytest.param(KvRequest(tool="server", n_parallel=3, kv_unified=True), 256, id="unified"),
    ],
)
def test_ctx_unit_is_the_step_between_contexts(req: KvRequest, unit: int) -> None:
    assert ctx_unit(req) == unit
    for n_ctx in (unit, 5 * unit):
        assert resolve_context(replace(req, n_ctx=n_ctx), 0).n_ctx == n_ctx
    assert resolve_context(replace(req, n_ctx=unit + 1), 0).n_ctx == 2 * unit


def test_gemma3_swa_reference_numbers() -> None:
    kv = plan_kv(GEMMA3_270M, KvRequest(tool="server", n_ctx=65536))
    full, swa = kv.caches
    assert (full.kind, full.cells, full.layers) == ("full", 65536, 3)
    assert (swa.kind, swa.cells, swa.layers) == ("swa", 2560, 15)  # 512 * 4 slots + 512 ubatch
    assert mib_line(full)[0] == "192.00"
    assert mib_line(swa)[0] == "37.50"


def test_swa_full_and_small_ubatch() -> None:
    full = plan_kv(GEMMA3_270M, KvRequest(tool="completion", n_ctx=8192, swa_full=True))
    assert full.caches[1].cells == 8192
    small = plan_kv(GEMMA3_270M, KvRequest(tool="completion", n_ctx=8192, n_ubatch=100))
    assert small.caches[1].cells == pad(512 + 100)


def test_quantized_rows() -> None:
    assert row_bytes("q8_0", 1024) == 1088
    assert row_bytes("q4_0", 1024) == 576
    assert row_bytes("f32", 3) == 12
    kv = plan_kv(LLAMA_3B, KvRequest(tool="completion", n_ctx=4096, type_k="q8_0", type_v="q4_0"))
    assert kv.caches[0].k_bytes == 28 * 1088 * 4096
    assert kv.caches[0].v_bytes == 28 * 576 * 4096


def test_mla_caches_k_only() -> None:
    facts = Facts(is_mla=True, layers=tuple(Layer(n_embd_k_gqa=576, n_embd_v_gqa=512) for _ in range(4)))
    kv = plan_kv(facts, KvRequest(tool="completion", n_ctx=1024))
    assert kv.caches[0].v_bytes == 0
    assert kv.caches[0].k_bytes == 4 * 576 * 2 * 1024


def test_recurrent_state_independent_of_context() -> None:
    layers = tuple(Layer(has_kv=False, recurrent=True, n_embd_r=3 * 1536, n_embd_s=16 * 1536) for _ in range(4))
    facts = Facts(layers=layers)
    small = plan_kv(facts, KvRequest(tool="server", n_ctx=1024, n_parallel=2))
    big = plan_kv(facts, KvRequest(tool="server", n_ctx=65536, n_parallel=2))
    assert small.total_bytes == big.total_bytes == 4 * 2 * 4 * (3 + 16) * 1536


def test_variable_v_padded_without_flash_attention() -> None:
    layers = (Layer(n_embd_v_gqa=256), Layer(n_embd_v_gqa=512))
    on = plan_kv(Facts(layers=layers), KvRequest(tool="completion", n_ctx=256, flash_attn="on"))
    off = plan_kv(Facts(layers=layers), KvRequest(tool="completion", n_ctx=256, flash_attn="off"))
    assert on.caches[0].v_bytes == (256 + 512) * 2 * 256
    assert off.caches[0].v_bytes == 2 * 512 * 2 * 256


@pytest.mark.parametrize(
    ("sizes", "max_size", "expected"),
    [
        pytest.param([100, 100, 100], None, [384], id="one-buffer-aligned"),
        pytest.param([64, 64, 64], 128, [128, 64], id="split"),
        pytest.param([256, 64], 128, [256, 64], id="oversized-tensor-alone"),
        pytest.param([], 128, [], id="empty"),
    ],
)
def test_buffers(sizes: list[int], max_size: int | None, expected: list[int]) -> None:
    assert buffers(sizes, max_size) == expected


def test_mib_line_is_float32() -> None:
    cache = Cache("full", 1, 1, 1, 1, "f16", "f16", 1048576 * 3 // 2, 0, (1,))
    assert mib_line(cache) == ("1.50", "1.50", "0.00")


def test_cache_type_sizes_are_ggmls() -> None:
    """kv's own table of the cache types (kept to avoid loading the gguf package on every launch) agrees with
    gguf's GGML_QUANT_SIZES."""
    from safe_llama.model.cache_types import CACHE_TYPE_SIZES
    from safe_llama.model.gguf_constants import constants

    c = constants()
    for name, sizes in CACHE_TYPE_SIZES.items():
        assert tuple(map(int, c.GGML_QUANT_SIZES[c.GGMLQuantizationType[name.upper()]])) == sizes, name
