# FAKE: stands in for llama.cpp's OpenVINO build on an Intel UHD 770 iGPU, which this machine lacks.
"""It decides from recorded numbers only (tests/fixtures/seed-figures.json: the seed model's KV bytes per
cell and the device's max allocation), never from safe-llama's code, so the seed tests check the code
against the seed and not against itself. A build from before llama.cpp PR #29124 asks for the whole KV
as ONE device allocation and prints the seed's exact OpenVINO error when that exceeds FAKE_MAX_ALLOC
(default: the recorded limit), unless GGML_OPENVINO_STATEFUL_EXECUTION=1 keeps the KV in host memory.

FAKE_KEEP_RUNNING=1: print the error and keep running (llama.cpp issue #20661).
FAKE_ALWAYS_FAIL=1: fail every start with a CPU allocation error that names no limit.
FAKE_HOST_LIMIT=N: a KV above N bytes fails as ggml_init does under RLIMIT_AS: its generic-looking
  GGML_ASSERT(ctx->mem_buffer != NULL) first, the `insufficient memory` line after it, then abort.
FAKE_HANG=1: never become ready (a hung start-up), writing its pid to FAKE_PID_FILE.
FAKE_TOOL=server: once started, log llama-server's `model loaded` and serve until SIGTERM/SIGINT (or for
  FAKE_SERVE_SECONDS, 60 by default, then exit 0).
Installed into a test's bin/ as llama-completion (and llama-server), started through a tiny shell shim.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import time
from pathlib import Path

FIGURES = json.loads((Path(__file__).resolve().parent.parent / "fixtures" / "seed-figures.json").read_text())
VERSION = "version: 0.4.1-dev (build 1, commit 972d2313b)\nbuilt with GNU 12.2.0 for Linux x86_64\n"
DEVICES = "Available devices:\n  OPENVINO0: GGML_OPENVINO_DEVICE=GPU (selected) - {name} (25548 MiB, 25548 MiB free)\n"
SEED_ERROR = (
    "E llama_init_from_model: failed to initialize the context: Exception from "
    "src/inference/src/cpp/remote_context.cpp:73:\n"
    "Check '!exceed_allocatable_mem_size' failed at src/plugins/intel_gpu/src/runtime/engine.cpp:324:\n"
    "[GPU] Exceeded max size of memory object allocation: requested {n} bytes, but max alloc size supported by "
    "device is {m} bytes. Please try to reduce batch size, use lower precision, or set "
    "ov::intel_gpu::hint::enable_large_allocations config property to true.\n"
    "E cmn  common_init_: failed to create context with model '{model}'\n"
    "E llama_completion: error: unable to create context\n"
)
GGML_INIT_ASSERT = (
    "/src/ggml/src/ggml.c:1592: GGML_ASSERT(ctx->mem_buffer != NULL) failed\n"
    "E ggml_aligned_malloc: insufficient memory (attempted to allocate {mib:.2f} MB)\n"
)


def _value(args: list[str], flags: tuple[str, ...], env_name: str, default: str) -> str:
    value = os.environ.get(env_name, default)
    for i, arg in enumerate(args[:-1]):
        if arg in flags:
            value = args[i + 1]
    return value


def kv_bytes(args: list[str]) -> int:
    """The seed model's KV for this command line, from the recorded bytes per cell."""
    n_ctx = int(_value(args, ("-c", "--ctx-size"), "LLAMA_ARG_CTX_SIZE", "4096")) or FIGURES["n_ctx_train"]
    pad = FIGURES["cell_padding"]
    cells = -(-n_ctx // pad) * pad
    per_cell = FIGURES["k_or_v_bytes_per_cell"]
    k = _value(args, ("-ctk", "--cache-type-k"), "LLAMA_ARG_CACHE_TYPE_K", "f16")
    v = _value(args, ("-ctv", "--cache-type-v"), "LLAMA_ARG_CACHE_TYPE_V", "f16")
    return int(cells * (per_cell[k] + per_cell[v]))


def _serve() -> int:
    done: list[int] = []
    for signo in (signal.SIGTERM, signal.SIGINT):
        signal.signal(signo, lambda s, f: done.append(s))
    sys.stderr.write("0.00.900.000 I srv  llama_server: model loaded\n")
    sys.stderr.flush()
    deadline = time.monotonic() + float(os.environ.get("FAKE_SERVE_SECONDS", "60"))
    while not done and time.monotonic() < deadline:
        time.sleep(0.02)
    return 0


def main() -> int:
    tool = os.environ.get("FAKE_TOOL", "completion")
    args = sys.argv[1:]
    if "--version" in args:
        sys.stderr.write(VERSION)
        return 0
    if "--list-devices" in args:
        sys.stdout.write(DEVICES.format(name=os.environ.get("FAKE_DEVICE_NAME", "Intel(R) UHD Graphics 770 (iGPU)")))
        return 0
    with open(os.environ["FAKE_ARGV_LOG"], "a") as log:
        log.write(repr((args, os.environ.get("GGML_OPENVINO_STATEFUL_EXECUTION"))) + "\n")
    model = _value(args, ("-m", "--model"), "LLAMA_ARG_MODEL", "")
    kv = kv_bytes(args)
    if os.environ.get("FAKE_HANG") == "1":
        Path(os.environ["FAKE_PID_FILE"]).write_text(str(os.getpid()))
        time.sleep(60)
        return 1
    if os.environ.get("FAKE_ALWAYS_FAIL") == "1":  # a failure that names no limit, whatever the plan
        sys.stderr.write(f"E ggml_backend_cpu_buffer_type_alloc_buffer: failed to allocate buffer of size {kv}\n")
        return 1
    host_limit = os.environ.get("FAKE_HOST_LIMIT")
    if host_limit is not None and kv > int(host_limit):
        sys.stderr.write(GGML_INIT_ASSERT.format(mib=kv / 1048576))
        sys.stderr.flush()
        signal.signal(signal.SIGABRT, signal.SIG_DFL)
        os.abort()
    limit = int(os.environ.get("FAKE_MAX_ALLOC", str(FIGURES["max_alloc_bytes"])))
    if os.environ.get("GGML_OPENVINO_STATEFUL_EXECUTION") != "1" and kv > limit:
        sys.stderr.write(SEED_ERROR.format(n=kv, m=limit, model=model))
        sys.stderr.flush()
        if os.environ.get("FAKE_KEEP_RUNNING") == "1":
            while True:
                time.sleep(1)
        return 1
    sys.stderr.write(f"llama_kv_cache: size = {kv / 1048576:7.2f} MiB\n")
    if tool == "server":
        return _serve()
    sys.stderr.write(f"generate: n_ctx = {_value(args, ('-c', '--ctx-size'), 'LLAMA_ARG_CTX_SIZE', '4096')}\n")
    sys.stdout.write("Once upon a time, there was a fake GPU.\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
