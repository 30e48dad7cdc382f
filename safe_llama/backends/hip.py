"""The HIP backend (ROCm: ggml/src/ggml-hip builds ggml-cuda with GGML_CUDA_NAME "ROCm"): devices ROCm0, ...

Owns its description; must not probe."""

from __future__ import annotations

from safe_llama.backends.backend import AllocRule, Backend

BACKEND = Backend(
    name="hip",
    prefixes=("ROCm",),
    log_marks=r"\bROCm\d|hipMalloc|hipError",
    gpu_marks=r"\bROCm\d",
    rules={"": AllocRule((0x1002,), "none", "ggml's ROCm (HIP) buffers have no per-allocation cap")},
    renumbering_env=("HIP_VISIBLE_DEVICES", "ROCR_VISIBLE_DEVICES"),
)
