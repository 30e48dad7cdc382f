"""The SYCL backend (ggml/src/ggml-sycl, GGML_SYCL_NAME "SYCL"): devices SYCL0, SYCL1, ... (its buffer
types SYCL0, SYCL_Split, SYCL_Host), on Intel's compute runtime.

From the pinned source (ggml-sycl.cpp): one buffer is capped at the device's max allocation
(ggml_backend_sycl_buffer_type_get_max_size: get_max_mem_alloc_size(), the OpenCL figure of the same GPU), and
at 2 GiB when GGML_SYCL_HOST_PINNED_MEM_2G is set (ggml_sycl_get_env reads leading digits; the backend ANDs
it with GGML_SYCL_ENABLE_HOST_PINNED_MEM, default 1, so an even value does not cap: planned on the safe side,
as a cap). A BMG-G31 gets 60% of its max allocation; no probe here tells that GPU apart, so declare
--max-alloc there. A failed device allocation logs "ggml_backend_sycl_buffer_type_alloc_buffer: can't
allocate N Bytes of memory on device" (configs/signatures.toml's sycl-alloc reads its size).

Owns its description; must not probe."""

from __future__ import annotations

from safe_llama.backends.backend import AllocRule, Backend, EnvCap

PINNED_2G_ENV = "GGML_SYCL_HOST_PINNED_MEM_2G"

BACKEND = Backend(
    name="sycl",
    prefixes=("SYCL",),
    log_marks=r"\bSYCL\d|\bSYCL_(?:Split|Host)\b|ggml_sycl|ggml_backend_sycl",
    gpu_marks=r"\bSYCL\d|\bSYCL_Split\b"
    r"|ggml_backend_sycl_buffer_type_alloc_buffer: can't allocate \d+ Bytes of memory on device",
    rules={
        "": AllocRule(
            (),
            "opencl",
            "SYCL caps one allocation at the device's max allocation (the OpenCL figure of the same GPU on Intel's "
            "runtime)",
        )
    },
    env_caps=(EnvCap(PINNED_2G_ENV, 2 << 30, "SYCL caps one buffer at 2 GiB with host-pinned memory"),),
    renumbering_env=("ONEAPI_DEVICE_SELECTOR", "ZE_AFFINITY_MASK"),
    intel_runtime=True,
)
