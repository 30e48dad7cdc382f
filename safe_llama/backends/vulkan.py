"""The Vulkan backend (ggml/src/ggml-vulkan): devices Vulkan0, Vulkan1, ...; its limits are computed by
device/vulkan_limits from what device/probe_vulkan reads.

Owns its description; must not probe."""

from __future__ import annotations

from safe_llama.backends.backend import AllocRule, Backend

BACKEND = Backend(
    name="vulkan",
    prefixes=("Vulkan",),
    log_marks=r"\bVulkan\d|ggml_vulkan",
    gpu_marks=r"\bVulkan\d",
    rules={
        "": AllocRule(
            (),
            "vulkan",
            "Vulkan packs buffers of at most min(1 GiB, its max allocation), none above maxBufferSize, and runs no "
            "operation on a tensor above maxStorageBufferRange",
        )
    },
    renumbering_env=("GGML_VK_VISIBLE_DEVICES",),
    # ggml-vulkan.cpp supports_op: MUL_MAT takes a quantized src0 only contiguous in dims 0 and 1, which a
    # head's view of the K cache is not (H200, -fa off -ctk q8_0: splits = 18, Vulkan_Host 1,256.26 MiB)
    quantized_k_attention_on_host=True,
)
