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
)
