"""Tests for safe_llama/diagnosis/signatures.py: the table, the incremental scanner, the classification.

Lines come from tests/fixtures/logs/ (real output of the pinned llama.cpp, the NVIDIA H200 recording and
the seed report; each file's first line says how it was produced). Backends that cannot run here (HIP,
Vulkan, SYCL, Metal, OpenCL) are tested with their pinned source's format strings filled in.
"""

from __future__ import annotations

import re
import signal
from pathlib import Path

import pytest

from safe_llama.diagnosis.signatures import (
    LESSON_FIELDS,
    Failure,
    Match,
    Scanner,
    SignatureTable,
    classify,
    clean_line,
    load_table,
    merge_tables,
    parse_table,
    scan_text,
)
from safe_llama.errors import ExitStatus, SafeLlamaError
from tests import FIXTURES

LOGS = FIXTURES / "logs"
TABLE = load_table()


def log_bytes(name: str) -> bytes:
    """A fixture's output, without its first-line comment."""
    return (LOGS / name).read_bytes().split(b"\n", 1)[1]


def log_line(name: str, needle: str) -> str:
    """The first line of a fixture containing needle, exactly as recorded."""
    for line in log_bytes(name).decode().splitlines():
        if needle in line:
            return line
    raise AssertionError(f"{needle!r} not in {name}")


# ---------------------------------------------------------------------------------------------------
# One line, one signature
# ---------------------------------------------------------------------------------------------------

LINES = [
    # real output, pinned CPU build under ulimit -v
    pytest.param(
        log_line("server-kv-oom.log", "ggml_aligned_malloc"),
        ("cpu-aligned-malloc", "alloc", 6144393216, None, None),
        id="cpu-aligned-malloc",
    ),
    pytest.param(
        log_line("server-kv-oom.log", "ggml_backend_cpu_buffer_type_alloc_buffer"),
        ("backend-buffer-alloc", "alloc", 6144393216, None, None),
        id="cpu-buffer-type-alloc",
    ),
    pytest.param(
        log_line("server-kv-oom.log", "ggml_backend_buft_alloc_buffer_n_default"),
        ("named-buffer-alloc", "alloc", 6144393216, None, "CPU"),
        id="buft-alloc-buffer-n-default",
    ),
    pytest.param(
        log_line("completion-compute-oom.log", "ggml_gallocr_reserve_n_impl"),
        ("compute-graph-alloc", "alloc", 9374760960, None, "CPU"),
        id="gallocr-reserve",
    ),
    pytest.param(
        log_line("completion-compute-oom.log", "graph_reserve"),
        ("compute-buffers", "alloc", None, None, None),
        id="graph-reserve-compute-buffers",
    ),
    pytest.param(
        log_line("completion-compute-oom.log", "failed to allocate compute pp buffers"),
        ("compute-buffers", "alloc", None, None, None),
        id="context-compute-pp-buffers",
    ),
    pytest.param(
        log_line("server-kv-oom.log", "failed to allocate buffer for kv cache"),
        ("cache-buffer", "alloc", None, None, None),
        id="context-kv-cache-buffer",
    ),
    pytest.param(
        log_line("completion-weights-oom.log", "unable to allocate"),
        ("model-buffer", "alloc", None, None, "CPU"),
        id="weights-buffer",
    ),
    pytest.param(
        log_line("completion-mmap-oom.log", "mmap failed"),
        ("mmap-enomem", "alloc", None, None, None),
        id="mmap-enomem",
    ),
    pytest.param(
        log_line("server-thread-oom.log", "libgomp"),
        ("thread-create", "alloc", None, None, None),
        id="libgomp-thread-creation",
    ),
    pytest.param(
        log_line("server-thread-sliver.log", "what():"),
        ("std-thread-create", "alloc", None, None, None),
        id="std-thread-after-model-loaded",
    ),
    pytest.param(
        log_line("completion-bad-alloc.log", "bad_alloc"),
        ("bad-alloc", "alloc", None, None, None),
        id="bad-alloc",
    ),
    pytest.param(
        log_line("openvino-cpu-kv-oom.log", "GGML_ASSERT(data)"),
        ("openvino-host-assert", "alloc", None, None, None),
        id="openvino-host-assert",  # the OpenVINO build on its CPU device
    ),
    # real output, NVIDIA H200
    pytest.param(
        log_line("cuda-oom-ngl99.log", "cudaMalloc failed"),
        ("cuda-malloc", "alloc", round(250016.00 * 1024 * 1024), None, None),
        id="cuda-malloc",
    ),
    pytest.param(
        log_line("cuda-oom-ngl99.log", "failed to allocate CUDA0 buffer"),
        ("named-buffer-alloc", "alloc", 262160777216, None, "CUDA0"),
        id="cuda0-buffer",
    ),
    pytest.param(
        log_line("cuda-compute-oom-q8.log", "ggml_gallocr_reserve_n_impl"),
        ("compute-graph-alloc", "alloc", 34837395584, None, "CUDA0"),
        id="cuda0-compute-buffer",
    ),
    # the seed report (OpenVINO GPU plugin)
    pytest.param(
        log_line("openvino-seed.log", "[GPU] Exceeded"),
        ("openvino-max-alloc-size", "alloc", 7516192768, 4294959104, None),
        id="openvino-max-alloc-size",
    ),
    pytest.param(
        log_line("openvino-seed.log", "failed to initialize the context"),
        ("context-init", "context", None, None, None),
        id="openvino-context-init",
    ),
    pytest.param(
        log_line("openvino-seed.log", "unable to create context"),
        ("context-create", "context", None, None, None),
        id="completion-unable-to-create-context",
    ),
    pytest.param(
        log_line("server-kv-oom.log", "failed to create_context"),
        ("context-create", "context", None, None, None),
        id="server-failed-to-create-context",
    ),
    # not memory, real output
    pytest.param(
        log_line("server-bad-magic.log", "invalid magic"),
        ("gguf-invalid", "not_memory", None, None, None),
        id="gguf-invalid-magic",
    ),
    pytest.param(
        log_line("server-truncated-header.log", "failed to read key-value pairs"),
        ("gguf-invalid", "not_memory", None, None, None),
        id="gguf-truncated-header",
    ),
    pytest.param(
        log_line("server-missing-model.log", "failed to open GGUF file"),
        ("gguf-invalid", "not_memory", None, None, None),
        id="gguf-missing-file",
    ),
    pytest.param(
        log_line("server-truncated-data.log", "not within the file bounds"),
        ("model-corrupt", "not_memory", None, None, None),
        id="tensor-data-out-of-bounds",
    ),
    pytest.param(
        log_line("server-bad-magic.log", "error loading model"),
        ("error-loading-model", "not_memory", None, None, None),
        id="error-loading-model",
    ),
    pytest.param(
        log_line("server-bad-argument.log", "invalid argument"),
        ("invalid-argument", "not_memory", None, None, None),
        id="invalid-argument",
    ),
    pytest.param(
        log_line("completion-bad-value.log", "error while handling argument"),
        ("invalid-argument", "not_memory", None, None, None),
        id="argument-value",
    ),
    pytest.param(
        log_line("completion-quantized-v-no-fa.log", "quantized V cache"),
        ("context-parameters", "not_memory", None, None, None),
        id="quantized-v-without-flash-attn",
    ),
    pytest.param(
        log_line("server-rpc-worker-oom.log", "Remote RPC server crashed"),
        ("rpc-worker-lost", "alloc", None, None, None),
        id="rpc-worker-killed-by-its-cgroup",
    ),
    pytest.param(
        log_line("server-rpc-worker-alloc.log", "failed to allocate RPC0"),
        ("named-buffer-alloc", "alloc", 234881024, None, "RPC0[127.0.0.1:50121]"),
        id="rpc-worker-refused-an-allocation",
    ),
    pytest.param(
        log_line("server-rpc-connect.log", "Failed to connect to"),
        ("rpc-connect", "not_memory", None, None, "127.0.0.1:50199"),
        id="rpc-worker-not-listening",
    ),
    pytest.param(
        log_line("server-port-in-use.log", "couldn't bind"),
        ("http-bind", "not_memory", None, None, None),
        id="port-in-use",
    ),
    pytest.param(
        log_line("completion-https-unsupported.log", "HTTPS is not supported"),
        ("https-unsupported", "not_memory", None, None, None),
        id="build-without-https",
    ),
    pytest.param(
        log_line("completion-hf-no-model.log", "--model is required"),
        ("model-required", "not_memory", None, None, None),
        id="hf-repository-not-listed",
    ),
    pytest.param(
        log_line("server-port-in-use.log", "exiting due to HTTP server error"),
        ("http-bind", "not_memory", None, None, None),
        id="http-server-error",
    ),
    # other readers print the magic error without gguf.cpp's function name (the line above, cut)
    pytest.param(
        log_line("server-bad-magic.log", "invalid magic").split("gguf_init_from_reader: ")[1],
        ("invalid-magic", "not_memory", None, None, None),
        id="invalid-magic-bare",
    ),
    # backends that cannot run here: their format strings (pinned source) with numbers filled in
    pytest.param(
        "ggml_backend_cuda_buffer_type_alloc_buffer: allocating 4096.00 MiB on device 1: "
        "cudaMalloc failed: out of memory",
        ("cuda-malloc", "alloc", 4096 * 1024 * 1024, None, None),
        id="hip-malloc-format",  # ggml-cuda.cu; HIP builds keep the "cudaMalloc" text, hipGetErrorString
    ),
    pytest.param(
        "CUDA error: out of memory", ("cuda-error-oom", "alloc", None, None, None), id="cuda-check-oom-format"
    ),
    pytest.param(
        "ROCm error: invalid device function",
        ("gpu-runtime-error", "not_memory", None, None, None),
        id="rocm-error-format",
    ),
    pytest.param(
        "ggml_vulkan: Device memory allocation of size 4294967296 failed.",
        ("vulkan-device-alloc", "alloc", 4294967296, None, None),
        id="vulkan-device-alloc-format",  # ggml-vulkan-buffers.cpp
    ),
    pytest.param(
        "ggml_vulkan: vk::Device::allocateMemory: ErrorOutOfDeviceMemory",
        ("vulkan-out-of-memory", "alloc", None, None, None),
        id="vulkan-error-out-of-device-memory",
    ),
    pytest.param(
        "ggml_backend_sycl_buffer_type_alloc_buffer: can't allocate 8589934592 Bytes of memory on device",
        ("sycl-alloc", "alloc", 8589934592, None, None),
        id="sycl-alloc-format",  # ggml-sycl.cpp
    ),
    pytest.param(
        "ggml_backend_metal_buffer_type_alloc_buffer: "
        "failed to allocate Metal buffer of 8589934592 bytes (out of memory)",
        ("metal-buffer-alloc", "alloc", 8589934592, None, None),
        id="metal-buffer-format",  # ggml-metal.cpp
    ),
    pytest.param(
        "ggml_metal_buffer_init: error: failed to allocate buffer, size =  8192.00 MiB",
        ("metal-device-alloc", "alloc", 8192 * 1024 * 1024, None, None),
        id="metal-device-format",  # ggml-metal-device.m
    ),
    pytest.param(
        "ggml_backend_opencl_buffer_type_alloc_buffer: failed to allocate 7168.00 MiB (err=-4). Consider reducing "
        "-ngl, lowering -c / -ub, or using quantized KV cache.",
        ("opencl-alloc", "alloc", 7168 * 1024 * 1024, None, None),
        id="opencl-alloc-format",  # ggml-opencl.cpp
    ),
    pytest.param(
        "llama_context: output_reserve: failed to allocate output buffer of size 1024.00 MiB",
        ("output-buffer", "alloc", 1024 * 1024 * 1024, None, None),
        id="output-buffer-format",  # llama-context.cpp
    ),
    pytest.param(
        log_line("openvino-device-refused.log", "is not available"),
        ("openvino-device-unavailable", "not_memory", None, None, None),
        id="openvino-device-unavailable",
    ),
    pytest.param(
        "/src/ggml/src/ggml.c:1712: GGML_ASSERT(ctx->mem_buffer != NULL) failed",
        ("ggml-init-no-memory", "alloc", None, None, None),
        id="ggml-init-assert-is-memory",
    ),
    pytest.param(
        "/src/ggml/src/ggml-cpu/ops.cpp:40: GGML_ASSERT(ne00 == ne01) failed",
        ("ggml-assert", "generic", None, None, None),
        id="ggml-assert-format",
    ),
    pytest.param(
        log_line("vulkan-kv-tensor-abort.log", "pre-allocated tensor"),
        ("kv-tensor-unsupported", "alloc", None, None, "Vulkan0"),
        id="kv-tensor-unsupported-format",  # ggml-backend.cpp GGML_ABORT
    ),
    pytest.param(
        "/src/ggml/src/ggml-backend.cpp:1081: pre-allocated tensor (blk.0.attn_q.weight) in a buffer (Vulkan0) that"
        " cannot run the operation (MUL_MAT)",
        ("tensor-unsupported", "alloc", None, None, "Vulkan0"),
        id="tensor-unsupported-format",
    ),
    pytest.param(
        log_line("vulkan-pinned-memory.log", "pinned memory"),
        ("vulkan-pinned-memory", "harmless", None, None, None),
        id="vulkan-pinned-memory-format",  # ggml-vulkan.cpp: a warning, then a plain host buffer
    ),
]


@pytest.mark.parametrize(("line", "expected"), LINES)
def test_line_matches_signature(line: str, expected: tuple[str, str, int | None, int | None, str | None]) -> None:
    found = TABLE.match_line(clean_line(line))
    assert found is not None, line
    assert (found.signature_id, found.category, found.requested_bytes, found.limit_bytes, found.buffer) == expected


def test_every_packaged_signature_has_a_line() -> None:
    tested = {param.values[1][0] for param in LINES}  # type: ignore[index]
    assert {sig.id for sig in TABLE.signatures} == tested


@pytest.mark.parametrize(
    "line",
    [
        log_line("server-kv-oom.log", "load_model: loading model"),
        log_line("cuda-oom-ngl99.log", "failed to fit params"),
        log_line("cuda-oom-ngl99.log", "possible training context overflow"),
        log_line("server-truncated-header.log", "encountered an error while trying to fit params"),
        "0.01.152.380 I srv    operator(): operator(): cleaning up before exit...",
    ],
)
def test_ordinary_lines_match_nothing(line: str) -> None:
    assert TABLE.match_line(clean_line(line)) is None


@pytest.mark.parametrize(
    ("raw", "clean"),
    [
        ("0.01.147.997 E ggml_aligned_malloc: x", "ggml_aligned_malloc: x"),
        ("E llama_init_from_model: failed", "llama_init_from_model: failed"),  # the seed: no timestamp
        ("\x1b[34m0.01.388.252\x1b[0m \x1b[31mE graph_reserve: y\x1b[0m\r", "graph_reserve: y"),
        ("Loading model... |\b-\b\\\x1b[34m0.01.388.252\x1b[0m \x1b[31mE gguf_init: z\x1b[0m", "gguf_init: z"),
        ("Error: the server exited before becoming ready", "Error: the server exited before becoming ready"),
        ("[GPU] Exceeded max size", "[GPU] Exceeded max size"),
    ],
)
def test_clean_line(raw: str, clean: str) -> None:
    assert clean_line(raw) == clean


# ---------------------------------------------------------------------------------------------------
# Whole logs: what each real failure means
# ---------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("name", "returncode", "kind", "signature_id", "requested", "limit", "buffer"),
    [
        ("server-kv-oom.log", 1, "alloc", "cpu-aligned-malloc", 6144393216, None, "CPU"),
        ("server-kv-oom-lv4.log", 1, "alloc", "cpu-aligned-malloc", 6144393216, None, "CPU"),
        ("openvino-cpu-kv-oom.log", -signal.SIGABRT, "alloc", "cpu-aligned-malloc", 6144393216, None, None),
        ("openvino-device-refused.log", -signal.SIGABRT, "not_memory", "openvino-device-unavailable", None, None, None),
        ("completion-kv-oom.log", 1, "alloc", "cpu-aligned-malloc", 6144393216, None, "CPU"),
        ("cli-kv-oom.log", 1, "alloc", "cpu-aligned-malloc", 6144393216, None, "CPU"),
        ("cli-kv-oom.pty.log", 1, "alloc", "cpu-aligned-malloc", 6144393216, None, "CPU"),
        ("completion-compute-oom.log", 1, "alloc", "cpu-aligned-malloc", 9374760960, None, "CPU"),
        ("completion-weights-oom.log", 1, "alloc", "cpu-aligned-malloc", 233316864, None, "CPU"),
        ("completion-mmap-oom.log", 1, "alloc", "mmap-enomem", None, None, None),
        ("completion-bad-alloc.log", 1, "alloc", "bad-alloc", None, None, None),
        ("cuda-oom-ngl99.log", 1, "alloc", "cuda-malloc", 262160777216, None, "CUDA0"),
        ("cuda-oom-fitoff.log", 1, "alloc", "cuda-malloc", 262160777216, None, "CUDA0"),
        ("cuda-oom-nglauto.log", -signal.SIGKILL, "signal", None, None, None, None),  # the recorder's kill
        ("openvino-seed.log", 1, "alloc", "openvino-max-alloc-size", 7516192768, 4294959104, None),
        ("openvino-seed.log", None, "alloc", "openvino-max-alloc-size", 7516192768, 4294959104, None),
        ("server-bad-magic.log", 1, "not_memory", "gguf-invalid", None, None, None),
        ("server-truncated-header.log", 1, "not_memory", "gguf-invalid", None, None, None),
        ("server-truncated-data.log", 1, "not_memory", "model-corrupt", None, None, None),
        ("server-missing-model.log", 1, "not_memory", "gguf-invalid", None, None, None),
        ("server-bad-argument.log", 1, "not_memory", "invalid-argument", None, None, None),
        ("completion-bad-value.log", 1, "not_memory", "invalid-argument", None, None, None),
        ("completion-quantized-v-no-fa.log", 1, "not_memory", "context-parameters", None, None, None),
        ("server-port-in-use.log", 1, "not_memory", "http-bind", None, None, None),
        ("completion-https-unsupported.log", 1, "not_memory", "https-unsupported", None, None, None),
        ("completion-hf-no-model.log", 1, "not_memory", "model-required", None, None, None),
        ("vulkan-kv-tensor-abort.log", -signal.SIGABRT, "alloc", "kv-tensor-unsupported", None, None, "Vulkan0"),
    ],
)
def test_classify_real_logs(
    name: str,
    returncode: int | None,
    kind: str,
    signature_id: str | None,
    requested: int | None,
    limit: int | None,
    buffer: str | None,
) -> None:
    failure = classify(scan_text(TABLE, log_bytes(name)), returncode)
    assert failure is not None
    assert failure.kind == kind
    assert failure.memory is (kind in ("alloc", "oom_killed", "context"))
    assert (failure.signature_id, failure.requested_bytes, failure.limit_bytes, failure.buffer) == (
        signature_id,
        requested,
        limit,
        buffer,
    )


@pytest.mark.parametrize(
    ("name", "stage", "requested"),
    [
        pytest.param("server-kv-oom.log", "kv", 6144393216, id="cpu-kv"),
        pytest.param("server-compute-oom-lv4.log", "compute", 175403040, id="cpu-compute-after-kv"),
        pytest.param("completion-compute-oom.log", "compute", 9374760960, id="cpu-compute-batch"),
        pytest.param("cuda-compute-oom-q8.log", "compute", 34837395584, id="cuda-compute-exact-over-mib"),
        pytest.param("completion-weights-oom.log", "weights", 233316864, id="cpu-weights"),
        pytest.param("server-thread-oom.log", "thread", None, id="thread-stacks"),
        pytest.param("openvino-seed.log", "kv", 7516192768, id="openvino-kv"),
        pytest.param("vulkan-kv-tensor-abort.log", "kv", None, id="vulkan-kv-tensor-over-the-range"),
        pytest.param("completion-bad-alloc.log", None, None, id="no-stage-said"),
    ],
)
def test_failure_names_what_the_allocation_was_for(name: str, stage: str | None, requested: int | None) -> None:
    failure = classify(scan_text(TABLE, log_bytes(name)), 1)
    assert failure is not None and failure.memory
    assert (failure.stage, failure.requested_bytes) == (stage, requested)


def test_every_fixture_header_says_how_it_was_made() -> None:
    for path in LOGS.glob("*.log"):
        first = path.read_bytes().split(b"\n", 1)[0].decode()
        assert first.startswith("# ") and len(first) > 40, path.name


def _m(category: str, sig: str = "x", requested: int | None = None, estimate: bool = False) -> Match:
    return Match(sig, category, f"{sig} line", requested, None, None, estimate)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("matches", "returncode", "expected"),
    [
        pytest.param([], 0, None, id="clean-exit"),
        pytest.param([_m("alloc")], 0, None, id="clean-exit-despite-a-line"),
        pytest.param([], None, None, id="still-running-nothing-seen"),
        pytest.param([], 1, Failure("exit", False), id="exit-1-nothing-known"),
        pytest.param([], 130, Failure("exit", False), id="exit-130"),
        pytest.param([], -signal.SIGKILL, Failure("signal", False, signal=9), id="sigkill-without-evidence-is-a-user"),
        pytest.param(
            [_m("generic", "assert")],
            -signal.SIGABRT,
            Failure("not_memory", False, "assert", "assert line", signal=6),
            id="generic-assert-alone-is-not-memory",
        ),
        pytest.param(
            [_m("generic", "assert"), _m("alloc", "a", 1024)],
            -signal.SIGABRT,
            Failure("alloc", True, "a", "a line", requested_bytes=1024, signal=6),
            id="alloc-after-a-generic-assert-wins",
        ),
        pytest.param(
            [_m("alloc", "a"), _m("generic", "assert")],
            -signal.SIGABRT,
            Failure("alloc", True, "a", "a line", signal=6),
            id="alloc-before-a-generic-assert-wins",
        ),
        pytest.param([], -signal.SIGSEGV, Failure("signal", False, signal=11), id="segfault"),
        pytest.param([], -signal.SIGTERM, Failure("signal", False, signal=15), id="sigterm"),
        pytest.param(
            [_m("context", "ctx")], 1, Failure("context", True, "ctx", "ctx line"), id="context-alone-is-memory"
        ),
        pytest.param(
            [_m("context", "ctx"), _m("not_memory", "bad")],
            1,
            Failure("not_memory", False, "bad", "bad line"),
            id="context-with-something-specific",
        ),
        pytest.param(
            [_m("not_memory", "bad")],
            -signal.SIGKILL,
            Failure("not_memory", False, "bad", "bad line", signal=9),
            id="sigkill-after-a-known-cause",
        ),
        pytest.param(
            [_m("alloc", "a")],
            -signal.SIGABRT,
            Failure("alloc", True, "a", "a line", signal=6),
            id="abort-after-alloc",
        ),
        pytest.param(
            [_m("alloc", "a", 1000, estimate=True), _m("alloc", "b", 1024)],
            1,
            Failure("alloc", True, "a", "a line", requested_bytes=1024),
            id="exact-size-beats-estimate",
        ),
        pytest.param(
            [_m("not_memory", "first"), _m("alloc", "later")],
            1,
            Failure("not_memory", False, "first", "first line"),
            id="first-cause-printed-decides",
        ),
        pytest.param(
            [_m("context", "ctx"), _m("alloc", "a")],
            1,
            Failure("alloc", True, "a", "a line"),
            id="alloc-after-context-line",
        ),
    ],
)
def test_classify_rules(matches: list[Match], returncode: int | None, expected: Failure | None) -> None:
    assert classify(matches, returncode) == expected


def test_sigkill_is_out_of_memory_only_with_evidence() -> None:
    evidence = "/sys/fs/cgroup/memory/x/memory.oom_control oom_kill rose from 0 to 1"
    failure = classify([], -signal.SIGKILL, oom_evidence=evidence)
    assert failure is not None and failure.kind == "oom_killed" and failure.memory
    assert failure.evidence == evidence and failure.line is not None and evidence in failure.line
    assert classify([], -signal.SIGKILL) == Failure("signal", False, signal=9)
    assert classify([], -signal.SIGTERM, oom_evidence=evidence) == Failure("signal", False, signal=15)


GGML_INIT_ASSERT = (
    b"0.00.100.000 I llama_context: constructing llama_context\n"
    b"/src/ggml/src/ggml.c:1592: GGML_ASSERT(ctx->mem_buffer != NULL) failed\n"
    b"0.00.100.100 E ggml_aligned_malloc: insufficient memory (attempted to allocate 5859.75 MB)\n"
    b"ggml_print_backtrace: ...\n"
)


def test_ggml_init_assert_before_the_malloc_line_is_memory() -> None:
    failure = classify(scan_text(TABLE, GGML_INIT_ASSERT), -signal.SIGABRT)
    assert failure is not None and failure.memory and failure.kind == "alloc"
    assert failure.signature_id == "ggml-init-no-memory"
    assert failure.requested_bytes == round(5859.75 * 1024 * 1024)  # from the later line


def test_the_pinned_memory_warning_ends_no_start() -> None:
    """ggml-vulkan falls back to a plain host buffer after it: the start goes on, and may become ready."""
    from safe_llama.process.relay import Stream
    from safe_llama.process.startup import StartupWatcher, Verdict

    whole = log_bytes("vulkan-pinned-memory.log")
    watcher = StartupWatcher(TABLE)
    assert watcher.output(Stream.STDERR, whole) == Verdict.CONTINUE
    assert watcher.conclude(None) is None
    assert [m.category for m in watcher.matches] == ["harmless"]
    assert classify(scan_text(TABLE, whole), 0) is None
    warning = log_line("vulkan-pinned-memory.log", "pinned memory").encode() + b"\n"
    later = classify(scan_text(TABLE, warning + b"llama_model_load: error loading model: bad magic\n"), 1)
    assert later is not None and not later.memory  # what decides is what follows it


def test_a_kv_tensor_over_the_devices_range_is_a_kv_failure() -> None:
    abort = b"/src/ggml/src/ggml-backend.cpp:1081: pre-allocated tensor (cache_k_l0) in a buffer (Vulkan0) that "
    abort += b"cannot run the operation (NONE)\n"
    failure = classify(scan_text(TABLE, abort), -signal.SIGABRT)
    assert failure is not None and failure.memory and failure.stage == "kv" and failure.buffer == "Vulkan0"


def test_other_asserts_are_generic_and_lose_to_an_alloc_line_anywhere() -> None:
    assert_line = b"/src/ggml/src/ggml-cpu/ops.cpp:12: GGML_ASSERT(ne00 == ne01) failed\n"
    alone = classify(scan_text(TABLE, assert_line), -signal.SIGABRT)
    assert alone is not None and not alone.memory and alone.signature_id == "ggml-assert"
    with_alloc = assert_line + b"E ggml_aligned_malloc: insufficient memory (attempted to allocate 10.00 MB)\n"
    failure = classify(scan_text(TABLE, with_alloc), -signal.SIGABRT)
    assert failure is not None and failure.memory and failure.signature_id == "cpu-aligned-malloc"


# ---------------------------------------------------------------------------------------------------
# The incremental scanner
# ---------------------------------------------------------------------------------------------------


def _feed_all(chunks: list[bytes], table: SignatureTable = TABLE) -> list[Match]:
    scanner = Scanner(table)
    found: list[Match] = []
    for chunk in chunks:
        found += scanner.feed(chunk)
    return found + scanner.close()


@pytest.mark.parametrize("name", ["openvino-seed.log", "cuda-oom-ngl99.log", "cli-kv-oom.pty.log"])
def test_split_at_every_byte_offset(name: str) -> None:
    data = log_bytes(name)
    whole = scan_text(TABLE, data)
    assert whole
    for cut in range(len(data) + 1):
        assert _feed_all([data[:cut], data[cut:]]) == whole, cut


def test_one_byte_at_a_time() -> None:
    data = log_bytes("server-kv-oom.log")
    assert _feed_all([data[i : i + 1] for i in range(len(data))]) == scan_text(TABLE, data)


def test_multibyte_utf8_split_inside_a_character() -> None:
    line = "E cmn  common_init_: failed to create context with model '/home/用户/模型 ü.gguf'\n".encode()
    expected = "cmn  common_init_: failed to create context with model '/home/用户/模型 ü.gguf'"
    for cut in range(len(line) + 1):
        found = _feed_all([line[:cut], line[cut:]])
        assert [m.line for m in found] == [expected], cut


def test_invalid_utf8_is_replaced_and_the_line_still_matches() -> None:
    data = b"\xff\xfe 0.00.1.000 E ggml_aligned_malloc: insufficient memory (attempted to allocate 1.00 MB) \xc3\n"
    (found,) = _feed_all([data])
    assert found.signature_id == "cpu-aligned-malloc"
    assert found.requested_bytes == 1024 * 1024
    assert "\ufffd" in found.line


@pytest.mark.parametrize(
    "chunks",
    [
        [b"graph_reserve: failed to allocate compute buffers\r\n"],
        [b"graph_reserve: failed to allocate compute buffers\r", b"\n"],
        [b"graph_reserve: failed to allocate compute buffers\r", b"\nnext\n"],
        [b"graph_reserve: failed to allocate compute buffers\r", b"next\n"],
        [b"graph_reserve: failed to allocate compute buffers"],  # no newline: close() flushes it
    ],
)
def test_line_endings(chunks: list[bytes]) -> None:
    assert [m.signature_id for m in _feed_all(chunks)] == ["compute-buffers"]


def test_close_flushes_a_partial_multibyte_character() -> None:
    scanner = Scanner(TABLE)
    assert scanner.feed(b"graph_reserve: failed to allocate compute buffers \xe6\xa8") == []
    (found,) = scanner.close()
    assert found.line.endswith("\ufffd")


def test_a_huge_line_is_bounded_and_the_next_line_still_matches() -> None:
    scanner = Scanner(TABLE, max_line=1000)
    for _ in range(16):
        assert scanner.feed(b"x" * 65536) == []
    found = scanner.feed(b" tail\ngraph_reserve: failed to allocate compute buffers\n")
    assert [m.signature_id for m in found] == ["compute-buffers"]


def test_a_match_beyond_max_line_is_not_seen() -> None:
    scanner = Scanner(TABLE, max_line=100)
    assert scanner.feed(b"y" * 200 + b"graph_reserve: failed to allocate compute buffers\n") == []


# ---------------------------------------------------------------------------------------------------
# Loading the table, and a user's own signatures
# ---------------------------------------------------------------------------------------------------

USER_TABLE = """
[[signature]]
id = "my-npu-oom"
category = "alloc"
regex = 'NPU out of memory: (?P<requested_bytes>\\d+) bytes'

[[signature]]
id = "http-bind"
category = "alloc"
regex = "couldn't bind"
"""


def test_user_signatures_come_first_and_replace_by_id(tmp_path: Path) -> None:
    user = tmp_path / "signatures.toml"
    user.write_text(USER_TABLE)
    table = load_table(user)
    ids = [sig.id for sig in table.signatures]
    assert ids[:2] == ["my-npu-oom", "http-bind"]
    assert ids.count("http-bind") == 1
    assert len(ids) == len(TABLE.signatures) + 1
    found = table.match_line("NPU out of memory: 42 bytes")
    assert found is not None and found.requested_bytes == 42
    replaced = table.match_line(clean_line(log_line("server-port-in-use.log", "couldn't bind")))
    assert replaced is not None and replaced.category == "alloc"


def test_merge_keeps_builtin_order() -> None:
    builtin = parse_table(USER_TABLE)
    assert merge_tables(builtin, ()).signatures == builtin


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("[[signature]]\nid = 'a'\ncategory = 'alloc'\nregex = '('\n", "bad regex"),
        ("[[signature]]\nid = 'a'\ncategory = 'fatal'\nregex = 'x'\n", "category must be one of"),
        ("[[signature]]\nid = 'a'\ncategory = 'alloc'\nregex = '(?P<bytes>x)'\n", "unknown named group"),
        ("[[signature]]\nid = 'a'\ncategory = 'alloc'\n", "regex is missing"),
        ("[[signature]]\ncategory = 'alloc'\nregex = 'x'\n", "needs an id"),
        ("[[signature]]\nid = 'a'\ncategory = 'alloc'\nregex = 'x'\npriority = 1\n", "unknown key"),
        ("[[signature]]\nid = 'a'\ncategory = 'alloc'\nregex = 'x'\nstage = 'kv-cache'\n", "stage must be one of"),
        ("[[signature]]\nid = 'a'\ncategory = 'alloc'\nregex = 'x'\nteaches = 'kv'\n", "teaches must name a field"),
        ("[[signature]]\nid = 'a'\ncategory = 'alloc'\nregex = 'x'\n" * 2, "duplicate signature id"),
        ("signature = 3\n", "array of tables"),
        ("[[signature]\n", "signatures"),
    ],
)
def test_invalid_tables_are_config_errors(text: str, message: str) -> None:
    with pytest.raises(SafeLlamaError, match=re.escape(message)) as err:
        parse_table(text)
    assert err.value.status == ExitStatus.BAD_CONFIG


def test_missing_user_file_is_a_config_error(tmp_path: Path) -> None:
    with pytest.raises(SafeLlamaError) as err:
        load_table(tmp_path / "nope.toml")
    assert err.value.status == ExitStatus.BAD_CONFIG
    assert "nope.toml" in err.value.message


def test_a_failure_carries_the_lessons_its_lines_teach() -> None:
    """The H200 recording of a compute buffer that did not fit: the row that says so names the lesson."""
    failure = classify(scan_text(TABLE, log_bytes("cuda-compute-oom-q8.log")), 1)
    assert failure is not None and failure.teaches == ("compute_extra",)
    assert all(sig.teaches in (None, *LESSON_FIELDS) for sig in TABLE.signatures)


def test_a_log_that_ends_on_an_info_line_was_cut_short() -> None:
    """llama.cpp's logger thread is not waited for at exit: 5 of 200 real starts that failed to allocate their KV
    ended at `load the model` (the fixture); the other 195 ended on E lines. A failed start's last words are E
    lines, so a last line of another level is a log cut short; a line without llama.cpp's timestamp (its own usage
    message, --no-log-prefix) says nothing."""
    from safe_llama.diagnosis.signatures import Scanner, cut_short
    from safe_llama.process.relay import Stream
    from safe_llama.process.startup import StartupWatcher

    cut = log_bytes("completion-log-cut.log")
    scanner = Scanner(TABLE)
    scanner.feed(cut)
    assert cut_short(scanner.last_line)
    watcher = StartupWatcher(TABLE)
    watcher.output(Stream.STDERR, cut)
    failure = watcher.conclude(1)
    assert failure is not None and failure.kind == "log_cut" and not failure.memory
    whole = cut + b"0.00.017.531 E ggml_aligned_malloc: insufficient memory (attempted to allocate 3128.00 MB)\n"
    whole += b"0.00.018.873 E llama_completion: error: unable to create context\n"
    assert not cut_short(Scanner(TABLE).last_line)
    watcher = StartupWatcher(TABLE)
    watcher.output(Stream.STDERR, whole)
    failure = watcher.conclude(1)
    assert failure is not None and failure.memory and failure.kind == "alloc"
    assert not cut_short("error: invalid argument: --bogus")
    assert not cut_short("0.00.006.870 E gguf_init_from_file: failed to open GGUF file '/nonexistent.gguf'")
    assert cut_short("\x1b[32m0.00.002.706 I llama_completion: load the model\x1b[0m")  # a pty's colours
    assert classify([], 1, cut=True) == Failure(kind="log_cut", memory=False)
    assert classify([], -signal.SIGSEGV, cut=True) == Failure(kind="signal", memory=False, signal=signal.SIGSEGV)


def test_an_abort_s_words_run_into_a_log_line_are_still_read() -> None:
    """CI's llama-server just above RLIMIT_AS: the C++ runtime's `what():` line had no newline before the logger
    thread's next timestamped line, so the two came as one line; both are matched (the thread failure is memory)."""
    joined = (
        b"terminate called after throwing an instance of 'std::system_error'\n"
        b"  what():  Resource temporarily unavailable0.00.470.273 I srv    load_model: initializing, n_slots = 4\n"
        b"0.00.470.609 I srv  llama_server: model loaded\n"
    )
    matches = scan_text(TABLE, joined)
    assert [m.signature_id for m in matches if m.category == "alloc"] == ["std-thread-create"]
    failure = classify(matches, -signal.SIGABRT)
    assert failure is not None and failure.memory and failure.stage == "thread"


def test_an_abort_s_words_cut_by_the_abort_are_still_read() -> None:
    """CI again: the logger thread had written only its next line's timestamp when the abort ended it."""
    cut = b"terminate called after throwing an instance of 'std::system_error'\n"
    cut += b"  what():  Resource temporarily unavailable0.00.489.530 \n"
    failure = classify(scan_text(TABLE, cut), -signal.SIGABRT)
    assert failure is not None and failure.memory and failure.signature_id == "std-thread-create"
