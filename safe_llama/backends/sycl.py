"""The SYCL backend (ggml/src/ggml-sycl, GGML_SYCL_NAME "SYCL"): devices SYCL0, SYCL1, ...

Owns its description; must not probe."""

from __future__ import annotations

from safe_llama.backends.backend import AllocRule, Backend

BACKEND = Backend(
    name="sycl",
    prefixes=("SYCL",),
    log_marks=r"\bSYCL\d|ggml_sycl",
    gpu_marks=r"\bSYCL\d",
    rules={
        "": AllocRule(
            (),
            "opencl",
            "SYCL caps one allocation at the device's max allocation (the OpenCL figure of the same GPU on Intel's "
            "runtime)",
        )
    },
    renumbering_env=("ONEAPI_DEVICE_SELECTOR", "ZE_AFFINITY_MASK"),
    intel_runtime=True,
)
