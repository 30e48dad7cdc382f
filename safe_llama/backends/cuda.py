"""The CUDA backend (ggml/src/ggml-cuda, GGML_CUDA_NAME "CUDA"): devices CUDA0, CUDA1, ...

Owns its description; must not probe (NVML is device/probe_free's)."""

from __future__ import annotations

from safe_llama.backends.backend import AllocRule, Backend

BACKEND = Backend(
    name="cuda",
    prefixes=("CUDA",),
    log_marks=r"\bCUDA\d|cudaMalloc|ggml_cuda",
    gpu_marks=r"\bCUDA\d",
    rules={
        "": AllocRule(
            (0x10DE,),
            "none",
            "ggml's CUDA buffers have no per-allocation cap; the OpenCL driver's figure does not apply",
        )
    },
    renumbering_env=("CUDA_VISIBLE_DEVICES",),
    free_source="nvml",  # NVML under CUDA_VISIBLE_DEVICES, as device/free_memory matches it
)
