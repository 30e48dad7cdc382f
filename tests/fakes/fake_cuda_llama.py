# FAKE: stands in for llama.cpp's CUDA build on an NVIDIA H200, a GPU this machine lacks.
"""It decides from recorded numbers only (the H200 runs in tests/fixtures/nvidia-h200-cuda/, the model known by its
file's size), never from safe-llama's code, so a test checks the code against the GPU and not against itself.

The GPU's free memory is the number of MiB in the file FAKE_FREE_FILE, as NVML reads it (no CUDA context of ours
yet). Like the real build, `--list-devices` reports it less the CUDA context it made to ask (524 MiB: NVML's
60617 MiB against the listing's 60093 MiB while 80 GiB were held, 4501 against 3977 with 4.4 GiB free), and a
start allocates its buffers from what the file says AT ITS START less that context: the model's weights, then the
KV cache, then the compute buffers. The first that does not fit fails in llama.cpp's words (recorded in
shared-gpu/bare80-c2M-ngl99.log, shared-gpu/bare5-dense-c8k-ngl99.log, logs/cuda-compute-oom-q8.log), exit 1;
when all fit it logs the KV and compute sizes, `model loaded`, and serves /health until SIGTERM or SIGINT.

FAKE_SHRINK_TO=N: before reading the file, a start lowers it to N MiB (another program took memory between
safe-llama's plan and the start); later starts find it there already.
FAKE_ARGV_LOG: each start appends its argv there as one JSON line.
A command line with no recorded figures (another model, -ngl between 1 and all layers for the big model, an f16
KV with it) exits 2 saying so: a test that gets there asks more than was recorded.

NVML_SOURCE is the same machine's NVML (libnvidia-ml.so.1), for a test to compile: the H200's recorded reading
(shared-gpu/nvml-idle.json), its free figure read from FAKE_FREE_FILE when that is set.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

MIB = 1 << 20
VERSION = "version: 0.6.0-dev (build 0, commit unknown)\nbuilt with GNU 12.2.0 for Linux x86_64\n"
TOTAL_MIB = 143155  # CUDA0: NVIDIA H200 (143155 MiB, ... MiB free)
CONTEXT_MIB = 524  # NVML's free less the listing's, with 0, 80 and 138 GiB held (shared-gpu/nvml-*.json)
CELL_PAD = 256  # -c 2000000 gives n_ctx 2000128
# bytes per cell per layer of K and V together, by cache type
Q8_0 = 34 / 32
F16 = 2.0


@dataclass(frozen=True)
class Model:
    file_size: int  # the GGUF file as tests/tiny_gguf.write_tiny_gguf writes it
    n_layer: int
    kv_width: int  # n_head_kv x head_dim: K (or V) values per layer per cell
    weights_all: int  # CUDA0 model buffer with every layer offloaded (logged)
    per_layer: int | None  # bytes of one repeating layer's weights; None: only full offload was recorded
    # (cells, CUDA0 compute buffer bytes) at two sizes, q8_0 KV with flash attention; the line through them
    compute_points: tuple[tuple[int, int], tuple[int, int]] | None
    # the CUDA0 compute buffer at one context (-c 8192), all layers offloaded and some: (all, some)
    compute_fixed: tuple[int, int] | None


MODELS = {
    # write_tiny_gguf(n_layer=8, n_head=16, n_head_kv=16, head_dim=256, n_ff=64, n_ctx_train=2_000_000, sparse=True):
    # nvidia-h200-cuda/first-start-ngl99-c2M.log (CUDA0 model buffer 2077.38 MiB, 9/9 layers; KV 110483 MiB at
    # 1663744 cells of q8_0, compute 27661.03 MiB) and first-start-ngl99-margin5.log (1612032 cells, 26802.53 MiB)
    2_178_297_824: Model(
        file_size=2_178_297_824,
        n_layer=8,
        kv_width=16 * 256,
        weights_all=round(2077.38 * MIB),
        per_layer=None,
        compute_points=((1_612_032, round(26802.53 * MIB)), (1_663_744, round(27661.03 * MIB))),
        compute_fixed=None,
    ),
    # write_tiny_gguf(n_layer=24, n_head=32, n_head_kv=8, head_dim=128, n_ff=4096, n_ctx_train=8192, sparse=True):
    # shared-gpu/bare5-dense-c8k-ngl99.log (CUDA0 model buffer 8864530432 bytes with all 25 layers; the fit's
    # breakdown: 768 MiB of f16 KV at 8192 cells, 48 MiB compute), free5-dense-c8k-ngl99-safe-llama.log (-ngl 10:
    # 3173.41 MiB of weights, 288 MiB of KV, 112 MiB compute), bare5-dense-c8k-ngl12.log (11 layers' weights fit
    # 3977 MiB, their KV 369098752 bytes did not). A repeating layer: 369131520 bytes.
    8_864_551_264: Model(
        file_size=8_864_551_264,
        n_layer=24,
        kv_width=8 * 128,
        weights_all=8_864_530_432,
        per_layer=369_131_520,
        compute_points=None,
        compute_fixed=(48 * MIB, 112 * MIB),
    ),
}


# The C stands in for NVIDIA's NVML, which this machine lacks; like the real one it leaves a thread of its own
# running after nvmlInit_v2 (measured on the H200: 1 thread before, 2 after).
NVML_SOURCE = r"""/* FAKE: stands in for NVIDIA's NVML (libnvidia-ml.so.1) on an H200, which this machine lacks
   (tests/fakes/fake_cuda_llama.py says how). */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

typedef struct { unsigned long long total, free, used; } nvmlMemory_t;
typedef struct {
    char busIdLegacy[16];
    unsigned int domain, bus, device, pciDeviceId, pciSubSystemId;
    char busId[32];
} nvmlPciInfo_t;

static const unsigned long long TOTAL = 150754820096ULL, IDLE_FREE = 150109880320ULL;

static void *linger(void *unused) { for (;;) pause(); return unused; }

int nvmlInit_v2(void) {
#ifdef HANG_IN_INIT
    for (;;) sleep(1);
#endif
    pthread_t thread;
    return pthread_create(&thread, 0, linger, 0) ? 999 : 0;
}
int nvmlShutdown(void) { return 0; }
static int copy(char *out, unsigned int length, const char *text) {
    if (strlen(text) + 1 > length) return 7; /* NVML_ERROR_INSUFFICIENT_SIZE */
    strcpy(out, text);
    return 0;
}
int nvmlSystemGetDriverVersion(char *out, unsigned int length) { return copy(out, length, "580.159.04"); }
int nvmlDeviceGetCount_v2(unsigned int *count) { *count = 1; return 0; }
int nvmlDeviceGetHandleByIndex_v2(unsigned int index, void **handle) {
    if (index != 0) return 2; /* NVML_ERROR_INVALID_ARGUMENT */
    *handle = (void *)0x1;
    return 0;
}
int nvmlDeviceGetHandleByUUID(const char *uuid, void **handle) {
    if (strcmp(uuid, "GPU-12c88ba7-4229-5615-d2f3-4c8f50f61e5b") != 0) return 6; /* NVML_ERROR_NOT_FOUND */
    *handle = (void *)0x1;
    return 0;
}
int nvmlDeviceGetMemoryInfo(void *handle, nvmlMemory_t *memory) {
    (void)handle;
    unsigned long long free = IDLE_FREE;
    const char *path = getenv("FAKE_FREE_FILE");
    if (path) {
        double mib = 0;
        FILE *file = fopen(path, "r");
        if (!file) return 999; /* NVML_ERROR_UNKNOWN */
        int read = fscanf(file, "%lf", &mib);
        fclose(file);
        if (read != 1) return 999;
        free = (unsigned long long)(mib * 1048576.0);
    }
    memory->total = TOTAL;
    memory->free = free;
    memory->used = TOTAL - free;
    return 0;
}
int nvmlDeviceGetName(void *handle, char *out, unsigned int length) {
    (void)handle;
    return copy(out, length, "NVIDIA H200");
}
int nvmlDeviceGetUUID(void *handle, char *out, unsigned int length) {
    (void)handle;
    return copy(out, length, "GPU-12c88ba7-4229-5615-d2f3-4c8f50f61e5b");
}
/* per-process use (issue 35's replay): the lines "PID BYTES" of FAKE_PROCESSES_FILE as compute processes; not
   supported (3) when it is not set, as on a driver that cannot tell */
typedef struct { unsigned int pid; unsigned long long usedGpuMemory; unsigned int gpuInstanceId, computeInstanceId; }
    nvmlProcessInfo_t;
int nvmlDeviceGetComputeRunningProcesses_v3(void *handle, unsigned int *count, nvmlProcessInfo_t *infos) {
    (void)handle;
    const char *path = getenv("FAKE_PROCESSES_FILE");
    if (!path) return 3; /* NVML_ERROR_NOT_SUPPORTED */
    FILE *file = fopen(path, "r");
    if (!file) return 999;
    unsigned int n = 0, pid;
    unsigned long long used;
    while (fscanf(file, "%u %llu", &pid, &used) == 2) {
        if (n >= *count) { fclose(file); return 7; }
        memset(&infos[n], 0, sizeof infos[n]);
        infos[n].pid = pid;
        infos[n].usedGpuMemory = used;
        n++;
    }
    fclose(file);
    *count = n;
    return 0;
}
int nvmlDeviceGetGraphicsRunningProcesses_v3(void *handle, unsigned int *count, nvmlProcessInfo_t *infos) {
    (void)handle;
    (void)infos;
    if (!getenv("FAKE_PROCESSES_FILE")) return 3;
    *count = 0;
    return 0;
}
int nvmlDeviceGetPciInfo_v3(void *handle, nvmlPciInfo_t *pci) {
    (void)handle;
    memset(pci, 0, sizeof *pci);
    strcpy(pci->busIdLegacy, "0000:00:06.0");
    pci->device = 6;
    pci->pciDeviceId = 0x233510de;
    strcpy(pci->busId, "00000000:00:06.0"); /* as nvidia-smi shows it there */
    return 0;
}
"""


def build_nvml(folder: Path, *defines: str) -> Path:
    """NVML_SOURCE compiled into folder/libnvidia-ml.so.1 (the name ctypes asks the dynamic loader for)."""
    folder.mkdir(parents=True, exist_ok=True)
    source = folder / "fake_nvml.c"
    source.write_text(NVML_SOURCE)
    library = folder / "libnvidia-ml.so.1"
    subprocess.run(["cc", "-shared", "-fPIC", "-pthread", *defines, "-o", str(library), str(source)], check=True)
    return library


def _value(args: list[str], flags: tuple[str, ...], default: str) -> str:
    value = default
    for i, arg in enumerate(args[:-1]):
        if arg in flags:
            value = args[i + 1]
    return value


def _free_file() -> Path:
    return Path(os.environ["FAKE_FREE_FILE"])


def _stamp(started: float) -> str:
    elapsed = int((time.monotonic() - started) * 1_000_000)
    return f"{elapsed // 60_000_000}.{elapsed // 1_000_000 % 60:02d}.{elapsed // 1000 % 1000:03d}.{elapsed % 1000:03d}"


class Log:
    def __init__(self) -> None:
        self.started = time.monotonic()

    def __call__(self, level: str, text: str) -> None:
        sys.stderr.write(f"{_stamp(self.started)} {level} {text}\n")
        sys.stderr.flush()


def _unrecorded(what: str) -> int:
    sys.stderr.write(f"FAKE: no recorded figures for {what}\n")
    return 2


_CUDA_MALLOC = (
    "ggml_backend_cuda_buffer_type_alloc_buffer: allocating {mib:.2f} MiB on device 0: cudaMalloc failed: out of memory"
)


def _weights_fail(log: Log, model: str, size: int) -> int:
    log("E", _CUDA_MALLOC.format(mib=size / MIB))
    log("E", f"ggml_backend_buft_alloc_buffer_n_default: failed to allocate CUDA0 buffer of size {size}")
    log("E", "llama_model_load: error loading model: unable to allocate CUDA0 buffer")
    log("E", "llama_model_load_from_file_impl: failed to load model")
    log("E", f"cmn  common_init_: failed to load model '{model}'")
    log("E", f"srv    load_model: failed to load model, '{model}'")
    log("I", "srv    operator(): operator(): cleaning up before exit...")
    log("E", "srv  llama_server: exiting due to model loading error")
    return 1


def _context_fail(log: Log, model: str, size: int, kv: bool) -> int:
    log("E", _CUDA_MALLOC.format(mib=size / MIB))
    if kv:
        log("E", f"ggml_backend_buft_alloc_buffer_n_default: failed to allocate CUDA0 buffer of size {size}")
        log("E", "llama_init_from_model: failed to initialize the context: failed to allocate buffer for kv cache")
    else:
        log("E", f"ggml_gallocr_reserve_n_impl: failed to allocate CUDA0 buffer of size {size}")
        log("E", "graph_reserve: failed to allocate compute buffers")
        log("E", "llama_init_from_model: failed to initialize the context: failed to allocate compute pp buffers")
    log("E", f"cmn  common_init_: failed to create context with model '{model}'")
    log("E", f"srv    load_model: failed to create_context with model '{model}'")
    log("I", "srv    operator(): operator(): cleaning up before exit...")
    log("E", "srv  llama_server: exiting due to model loading error")
    return 1


class _Health(BaseHTTPRequestHandler):
    def do_GET(self) -> None:
        body = b'{"status":"ok"}' if self.path == "/health" else b'{"error":"not found"}'
        self.send_response(200 if self.path == "/health" else 404)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: object) -> None:
        pass  # no access log on stderr: safe-llama reads it


def _serve(log: Log, args: list[str]) -> int:
    done = threading.Event()
    for signo in (signal.SIGTERM, signal.SIGINT):
        signal.signal(signo, lambda s, f: done.set())
    host = _value(args, ("--host",), "127.0.0.1")
    server = ThreadingHTTPServer((host, int(_value(args, ("--port",), "8080"))), _Health)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    log("I", "srv  llama_server: model loaded")
    log("I", f"srv  llama_server: listening on http://{host}:{server.server_address[1]}")
    done.wait(120)
    log("I", "srv    operator(): operator(): cleaning up before exit...")
    server.shutdown()
    return 0


def start(args: list[str]) -> int:
    log = Log()
    with open(os.environ["FAKE_ARGV_LOG"], "a") as argv_log:
        argv_log.write(json.dumps(args) + "\n")
    shrink = os.environ.get("FAKE_SHRINK_TO")
    if shrink is not None and float(_free_file().read_text()) > float(shrink):
        _free_file().write_text(shrink)
    available = (float(_free_file().read_text()) - CONTEXT_MIB) * MIB
    path = _value(args, ("-m", "--model"), "")
    model = MODELS.get(os.path.getsize(path)) if path else None
    if model is None:
        return _unrecorded(f"the model {path!r}")
    log("I", "srv  llama_server: initializing ...")
    log("I", f"srv    load_model: loading model '{path}'")
    ngl = int(_value(args, ("-ngl", "--gpu-layers", "--n-gpu-layers"), "-1"))
    layers = model.n_layer if ngl < 0 or ngl > model.n_layer else max(ngl - 1, 0)  # llama.cpp counts the output
    if layers == model.n_layer:
        weights = model.weights_all
    elif model.per_layer is None:
        return _unrecorded(f"-ngl {ngl} of {path}")
    else:
        weights = model.weights_all - (model.n_layer - layers) * model.per_layer if ngl > 0 else 0
    offloaded = model.n_layer + 1 if ngl < 0 else min(ngl, model.n_layer + 1)
    log("I", f"load_tensors: offloaded {offloaded}/{model.n_layer + 1} layers to GPU")
    if weights > available:
        return _weights_fail(log, path, weights)
    log("I", f"load_tensors:        CUDA0 model buffer size = {weights / MIB:8.2f} MiB")
    n_ctx = int(_value(args, ("-c", "--ctx-size"), "4096"))
    cells = -(-n_ctx // CELL_PAD) * CELL_PAD
    types = {_value(args, ("-ctk", "--cache-type-k"), "f16"), _value(args, ("-ctv", "--cache-type-v"), "f16")}
    if len(types) != 1 or not types <= {"f16", "q8_0"}:
        return _unrecorded(f"a {'/'.join(sorted(types))} KV cache")
    kind = types.pop()
    per_cell = model.kv_width * (Q8_0 if kind == "q8_0" else F16) * 2
    kv = int(cells * per_cell * layers)  # the offloaded layers' KV is on CUDA0, the others' in host memory
    if weights + kv > available:
        return _context_fail(log, path, kv, kv=True)
    kv_all = cells * per_cell * model.n_layer
    half = kv_all / 2 / MIB
    log("I", f"llama_kv_cache:      CUDA0 KV buffer size = {kv / MIB:8.2f} MiB")
    shape = f"{cells:7d} cells, {model.n_layer:3d} layers,  4/1 seqs"
    halves = f"K ({kind}): {half:8.2f} MiB, V ({kind}): {half:8.2f} MiB"
    log("I", f"llama_kv_cache: size = {kv_all / MIB:8.2f} MiB ({shape}), {halves}")
    flash = _value(args, ("-fa", "--flash-attn"), "auto")
    if model.compute_points is not None:
        if kind != "q8_0" or flash != "on":
            return _unrecorded(f"a {kind} KV with -fa {flash} of {path}")
        (c1, b1), (c2, b2) = model.compute_points
        compute = b1 + (cells - c1) * (b2 - b1) // (c2 - c1)
    else:
        assert model.compute_fixed is not None
        compute = model.compute_fixed[0 if layers == model.n_layer else 1]
    if weights + kv + compute > available:
        return _context_fail(log, path, compute, kv=False)
    log("I", f"sched_reserve:      CUDA0 compute buffer size = {compute / MIB:8.2f} MiB")
    return _serve(log, args)


def main() -> int:
    args = sys.argv[1:]
    if "--version" in args:
        sys.stderr.write(VERSION)
        return 0
    if "--list-devices" in args:
        free = float(_free_file().read_text()) - CONTEXT_MIB
        sys.stdout.write(f"Available devices:\n  CUDA0: NVIDIA H200 ({TOTAL_MIB} MiB, {int(free)} MiB free)\n")
        return 0
    return start(args)


if __name__ == "__main__":
    sys.exit(main())
