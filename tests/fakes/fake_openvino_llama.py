# FAKE: stands in for llama.cpp's OpenVINO build on an Intel UHD 770 iGPU, which this machine lacks.
"""It reads the real GGUF with safe-llama's own header reader, computes the KV cache that a build from
before llama.cpp PR #29124 asks for as ONE device allocation, and prints the seed's exact OpenVINO error
when that exceeds FAKE_MAX_ALLOC (default 4294959104), unless GGML_OPENVINO_STATEFUL_EXECUTION=1 keeps the
KV in host memory. FAKE_KEEP_RUNNING=1: print the error and keep running (llama.cpp issue #20661).
FAKE_ALWAYS_FAIL=1: fail every start with a CPU allocation error that names no limit.
Installed into a test's bin/ as llama-completion (and llama-server), started through a tiny shell shim.
"""

from __future__ import annotations

import os
import sys
import time

sys.path.insert(0, os.environ["FAKE_SAFE_LLAMA_ROOT"])

from safe_llama.kv import plan_kv
from safe_llama.llama_args import parse
from safe_llama.model_facts import load_model_facts
from safe_llama.request import to_request

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
    req = to_request(parse(tool, args, os.environ))
    assert req.model_path is not None
    kv = plan_kv(load_model_facts(req.model_path), req.kv).total_bytes
    if os.environ.get("FAKE_ALWAYS_FAIL") == "1":  # a failure that names no limit, whatever the plan
        sys.stderr.write(f"E ggml_backend_cpu_buffer_type_alloc_buffer: failed to allocate buffer of size {kv}\n")
        return 1
    limit = int(os.environ.get("FAKE_MAX_ALLOC", "4294959104"))
    if os.environ.get("GGML_OPENVINO_STATEFUL_EXECUTION") != "1" and kv > limit:
        sys.stderr.write(SEED_ERROR.format(n=kv, m=limit, model=req.model_path))
        sys.stderr.flush()
        if os.environ.get("FAKE_KEEP_RUNNING") == "1":
            while True:
                time.sleep(1)
        return 1
    sys.stderr.write(f"llama_kv_cache: size = {kv / 1048576:7.2f} MiB\ngenerate: n_ctx = {req.kv.n_ctx}\n")
    sys.stdout.write("Once upon a time, there was a fake GPU.\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
