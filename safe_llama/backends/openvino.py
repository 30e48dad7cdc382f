"""The OpenVINO backend (ggml/src/ggml-openvino): devices OPENVINO0, ..., each driving one of OpenVINO's own
devices (CPU, GPU, GPU.1, NPU: GGML_OPENVINO_DEVICE selects it), so its limits depend on that device's kind.

Its quirks: every buffer is allocated on the host first; stateful execution (STATEFUL_ENV) keeps the KV in
host RAM; a q8_0 KV cache was never verified there; before llama.cpp PR #29124 (0.6.0) it made the whole KV
one allocation (configs/planner.toml [kv_split] openvino, policy as data).

Owns its description; must not probe."""

from __future__ import annotations

from safe_llama.backends.backend import AllocRule, Backend

STATEFUL_ENV = "GGML_OPENVINO_STATEFUL_EXECUTION"
DEVICE_ENV = "GGML_OPENVINO_DEVICE"

BACKEND = Backend(
    name="openvino",
    prefixes=("OPENVINO",),
    log_marks=r"OpenVINO|OPENVINO\d|ggml-openvino|intel_gpu|\[GPU\] Exceeded",
    gpu_marks=r"\[GPU\]|intel_gpu|GGML_OPENVINO_DEVICE=GPU",
    rules={
        "CPU": AllocRule((), "none", "OpenVINO on the CPU allocates from host RAM with no cap"),
        "NPU": AllocRule((), "none", "OpenVINO on an NPU has no per-allocation cap (SIZE_MAX)"),
        "GPU": AllocRule(
            (0x8086,), "opencl", "OpenVINO on a GPU splits buffers at the device's CL_DEVICE_MAX_MEM_ALLOC_SIZE"
        ),
    },
    default_kind="CPU",  # OpenVINO picks its CPU when GGML_OPENVINO_DEVICE is unset
    host_kinds=frozenset({"CPU"}),
    host_memory_kinds=frozenset({"NPU"}),
    intel_runtime=True,
    stateful_env=STATEFUL_ENV,
    buffers_on_host_first=True,
    q8_kv_verified=False,
    own_device_env=DEVICE_ENV,
    # ggml-openvino's device description: "GGML_OPENVINO_DEVICE=GPU.1 (selected) - Intel(R) Arc(TM) ... (dGPU)"
    own_device_in_description=rf"^{DEVICE_ENV}=(?P<ov>\S+?)(?P<selected> \(selected\))? - (?P<full>.*)$",
    integrated_in_description=r"\((?P<integrated>i|d)GPU\)\s*$",
    igpu_first=True,  # OpenVINO's GPU.0 is the Intel iGPU when there is one
)
