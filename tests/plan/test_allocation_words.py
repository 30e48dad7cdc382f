"""plan.allocation_words: each allocation's label, its limit's, and the reason lines' words, from values alone."""

from __future__ import annotations

import pytest

from safe_llama.device.limits import Sourced
from safe_llama.plan import allocation_words
from safe_llama.plan.memory import Allocation

GIB = 1 << 30
MIB = 1 << 20

ONE_BUFFER = Allocation(
    "kv buffer", "OPENVINO0", 7 * GIB, 4 * GIB - 4 * MIB, 65536,
    source=Sourced(4 * GIB, "profile", "intel-uhd-770"), margin_bytes=4 * MIB, cache="full", one_allocation=True,
)  # fmt: skip
WORKER = Allocation(
    "device total", "RPC0", 6 * GIB, int(8 * GIB * 0.98), 4096,
    source=Sourced(8 * GIB, "declared", "--rpc-memory 10.0.0.2:50052=8.00 GiB"), margin_fraction=0.02,
    counted=("weights", "kv", "compute", "worker", "draft_kv"), endpoint="10.0.0.2:50052",
)  # fmt: skip
CGROUP = Allocation(
    "host total", "host", 900 * MIB, int(GIB * 0.98), 8192, "cgroup", Sourced(GIB, "probed", "memory.max"),
    margin_fraction=0.02, counted=("process", "kv", "compute", "prompt_cache", "checkpoints"),
)  # fmt: skip
SPACE = Allocation(
    "host total", "host", GIB, GIB + 8 * MIB, 0, "address space", Sourced(GIB, "probed", "RLIMIT_AS"),
    margin_bytes=-8 * MIB, counted=("process", "mapped model file", "kv", "compute"),
)  # fmt: skip


@pytest.mark.parametrize(
    ("allocation", "label", "limit_label", "described"),
    [
        pytest.param(
            ONE_BUFFER,
            "KV full buffer (one allocation)",
            "device max allocation 4.00 GiB (profile) less 4.00 MiB margin",
            "KV cache (one allocation) 7.00 GiB at -c 65536 is above the GPU's 4.00 GiB limit per allocation "
            "(profile, less a 4.00 MiB margin)",
            id="kv-one-allocation",
        ),
        pytest.param(
            WORKER,
            "RPC0 (10.0.0.2:50052) total (weights, kv, compute, worker, draft kv)",
            "device memory 8.00 GiB (declared: --rpc-memory 10.0.0.2:50052=8.00 GiB) less 2%",
            "RPC0 (10.0.0.2:50052) (weights, KV, compute, worker, draft KV) 6.00 GiB at -c 4096 is within its "
            "7.84 GiB usable (8.00 GiB declared: --rpc-memory 10.0.0.2:50052=8.00 GiB less 2%)",
            id="rpc-worker",
        ),
        pytest.param(
            CGROUP,
            "host cgroup charge (process, KV, compute estimate, prompt cache and checkpoints)",
            "host budget 1.00 GiB (probed: memory.max) less 2%",
            "the host's cgroup charge (process, KV, compute, prompt cache and checkpoints) 900.00 MiB at -c 8192 "
            "is within its 1003.52 MiB usable (1.00 GiB probed: memory.max, less 2%)",
            id="cgroup",
        ),
        pytest.param(
            SPACE,
            "host address space (process, mapped model file, KV, compute estimate)",
            "host budget 1.00 GiB (probed: RLIMIT_AS) plus 8.00 MiB",
            "the address space (process, mapped model file, KV, compute) 1.00 GiB is within its 1.01 GiB usable "
            "(1.00 GiB probed: RLIMIT_AS, plus 8.00 MiB)",
            id="address-space-band",
        ),
    ],
)
def test_words_of_an_allocation(allocation: Allocation, label: str, limit_label: str, described: str) -> None:
    assert allocation_words.label(allocation) == allocation.name == label
    assert allocation_words.limit_label(allocation) == allocation.limit_name == limit_label
    assert allocation_words.describe(allocation) == described


def test_kv_pieces_of_several_caches_name_their_cache() -> None:
    piece = Allocation(
        "kv buffer", "Vulkan0", GIB, 2 * GIB, 1024, source=Sourced(2 * GIB, "probed", "x"), cache="swa", caches=2,
        piece=2, pieces=3,
    )  # fmt: skip
    assert allocation_words.label(piece) == "KV swa buffer 2/3"
    assert allocation_words.subject(piece) == "swa KV cache piece 2 of 3"
    assert allocation_words.limit_words(piece) == "the GPU's 2.00 GiB limit per allocation (probed)"


def test_a_tensor_and_the_kv_cap() -> None:
    tensor = Allocation(
        "kv tensor", "Vulkan0", 3 * GIB, 2 * GIB, 1024, source=Sourced(2 * GIB, "probed", "maxStorageBufferRange"),
        cache="full", caches=2, part="V",
    )  # fmt: skip
    assert allocation_words.label(tensor) == "KV full V tensor of one layer"
    assert allocation_words.describe(tensor) == (
        "one layer's V cache (full) 3.00 GiB at -c 1024 is above the device's 2.00 GiB limit per tensor "
        "(probed: maxStorageBufferRange)"
    )
    cap = Allocation("kv cap", "", 2 * GIB, GIB, 4096)
    assert (allocation_words.label(cap), allocation_words.limit_label(cap)) == (
        "KV total",
        "smaller than the start that failed",
    )
    assert (
        allocation_words.describe(cap)
        == "the KV cache 2.00 GiB at -c 4096 is above the 1.00 GiB allowed after the start that failed"
    )


def test_the_attention_on_the_host_is_said_with_the_limit_that_put_it_there() -> None:
    limit = Sourced(128 << 20, "probed", "Vulkan maxStorageBufferRange of 'llvmpipe'")
    words = allocation_words.host_attention_words(
        scores=False, tensor_bytes=256 << 20, host_bytes=68 << 20, n_ubatch=4096, device="Vulkan0", limit=limit
    )
    assert words == (
        "attention on the CPU: the attention mask (256.00 MiB at -ub 4096) is above Vulkan0's 128.00 MiB limit per"
        " tensor (probed: Vulkan maxStorageBufferRange of 'llvmpipe'), so llama.cpp runs the attention there; the"
        " host's compute buffer holds copies of one layer's K and V (68.00 MiB more)"
    )
