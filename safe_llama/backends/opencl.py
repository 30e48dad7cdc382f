"""The OpenCL backend (ggml/src/ggml-opencl): device GPUOpenCL.

Owns its description; must not probe (device/probe_opencl does)."""

from __future__ import annotations

from safe_llama.backends.backend import AllocRule, Backend

BACKEND = Backend(
    name="opencl",
    prefixes=("GPUOpenCL",),
    log_marks=r"GPUOpenCL|ggml_opencl",
    rules={"": AllocRule((), "opencl", "the OpenCL backend obeys CL_DEVICE_MAX_MEM_ALLOC_SIZE")},
    intel_runtime=True,
)
