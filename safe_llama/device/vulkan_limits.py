"""ggml-vulkan's limits for one device, computed as the pinned ggml-vulkan.cpp computes them from the probed
Vulkan properties and the environment llama.cpp will run with (GGML_VK_FORCE_MAX_ALLOCATION_SIZE,
GGML_VK_FORCE_MAX_BUFFER_SIZE, GGML_VK_SUBALLOCATION_BLOCK_SIZE), and which probed Vulkan device a llama.cpp
`VulkanN` is.

Owns that arithmetic. Pure: the probe report and the environment come in as values; it reads and runs nothing.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from safe_llama.device.limits import Sourced
from safe_llama.device.probe_vulkan import VulkanDevice, VulkanReport
from safe_llama.units import human

FORCE_MAX_ALLOCATION = "GGML_VK_FORCE_MAX_ALLOCATION_SIZE"
FORCE_MAX_BUFFER = "GGML_VK_FORCE_MAX_BUFFER_SIZE"
SUBALLOCATION_BLOCK = "GGML_VK_SUBALLOCATION_BLOCK_SIZE"
VISIBLE_DEVICES = "GGML_VK_VISIBLE_DEVICES"
DEFAULT_BLOCK = 1024 * 1024 * 1024  # "Limit batching of allocations to 1GB by default"


@dataclass(frozen=True)
class VulkanLimits:
    """What ggml-vulkan enforces on one device (ggml_vk_get_device, ggml_vk_create_buffer,
    ggml_backend_vk_device_supports_op)."""

    device: VulkanDevice
    # device->max_memory_allocation_size: min(maxMemoryAllocationSize, maxBufferSize) with VK_KHR_maintenance4
    max_allocation: Sourced[int]
    # device->max_buffer_size: a buffer above it throws "Requested buffer size exceeds device buffer size limit"
    max_buffer: Sourced[int]
    # the driver's own maxMemoryAllocationSize (a forced max allocation changes the block, not the driver)
    driver_allocation: Sourced[int]
    # device->suballocation_block_size (get_max_size): ggml packs tensors into buffers of at most this
    block: Sourced[int]
    # supports_op: a tensor above it cannot be used by any Vulkan operation. A weight stays on the host; a KV
    # tensor aborts ("pre-allocated tensor ... in a buffer (Vulkan0) that cannot run the operation")
    max_tensor: Sourced[int]
    # the largest heap a device buffer may come from: a buffer above it finds "No suitable memory type"
    heap_bytes: int | None
    # heapBudget - heapUsage over the heaps ggml counts (VK_EXT_memory_budget); None without the extension
    free_bytes: int | None
    warnings: tuple[str, ...] = ()


def stoull(text: str) -> int | None:
    """std::stoull(text) as ggml reads its switches: leading space, an optional sign, base-10 digits, the rest
    ignored ("-1" wraps around); None where it throws (llama.cpp then dies at start-up)."""
    found = re.match(r"[ \t\n\v\f\r]*([+-]?)([0-9]+)", text)
    if found is None:
        return None
    value = int(found.group(2))
    if value >= 1 << 64:
        return None
    return (-value) % (1 << 64) if found.group(1) == "-" else value


def _forced(env: Mapping[str, str], name: str, warnings: list[str]) -> int | None:
    if name not in env:
        return None
    value = stoull(env[name])
    if value is None:
        warnings.append(f"{name}={env[name]!r} is not a number: llama.cpp's std::stoull throws and it cannot start")
    return value


def vulkan_limits(device: VulkanDevice, env: Mapping[str, str]) -> VulkanLimits:
    """The limits ggml_vk_get_device sets for `device` under `env` (the environment llama.cpp inherits)."""
    warnings: list[str] = []
    what = f"of '{device.name}'"
    maint4 = device.max_buffer_size is not None
    forced_alloc = _forced(env, FORCE_MAX_ALLOCATION, warnings)
    if forced_alloc is not None:
        max_allocation = Sourced(forced_alloc, "declared", FORCE_MAX_ALLOCATION)
    elif device.max_buffer_size is not None:
        value = min(device.max_memory_allocation_size, device.max_buffer_size)
        max_allocation = Sourced(value, "probed", f"Vulkan min(maxMemoryAllocationSize, maxBufferSize) {what}")
    else:
        value = device.max_memory_allocation_size
        max_allocation = Sourced(value, "probed", f"Vulkan maxMemoryAllocationSize {what}")
    forced_buffer = _forced(env, FORCE_MAX_BUFFER, warnings)
    if forced_buffer is not None:
        max_buffer = Sourced(forced_buffer, "declared", FORCE_MAX_BUFFER)
    elif maint4 and device.max_buffer_size is not None:
        max_buffer = Sourced(device.max_buffer_size, "probed", f"Vulkan maxBufferSize {what}")
    else:
        max_buffer = Sourced(max_allocation.value, max_allocation.source, max_allocation.detail)
    forced_block = _forced(env, SUBALLOCATION_BLOCK, warnings)
    wanted_block = DEFAULT_BLOCK if forced_block is None else forced_block
    if wanted_block <= max_allocation.value:
        how = "ggml-vulkan's suballocation block (1 GiB)" if forced_block is None else SUBALLOCATION_BLOCK
        block = Sourced(wanted_block, "probed" if forced_block is None else "declared", how)
    else:
        block = Sourced(max_allocation.value, max_allocation.source, max_allocation.detail)
    range_words = f"Vulkan maxStorageBufferRange {what}"
    if device.max_storage_buffer_range < max_buffer.value:
        max_tensor = Sourced(device.max_storage_buffer_range, "probed", range_words)
    else:
        max_tensor = Sourced(max_buffer.value, max_buffer.source, max_buffer.detail)
    if device.shader_64bit_indexing:
        # the pinned build's headers (Vulkan 1.4.309) do not define it, so the range still applies
        warnings.append(
            f"'{device.name}' offers VK_EXT_shader_64bit_indexing, which lifts the "
            f"{human(device.max_storage_buffer_range)} storage range only in a llama.cpp built with newer Vulkan "
            "headers: planned with the range"
        )
    counted = [h for h in device.heaps if h.device_local or device.device_type == "integrated-gpu"]
    heap = max((h.size for h in device.heaps), default=None)
    free = None
    if device.memory_budget and counted and all(h.budget is not None and h.usage is not None for h in counted):
        free = sum(max((h.budget or 0) - (h.usage or 0), 0) for h in counted)
    driver = Sourced(device.max_memory_allocation_size, "probed", f"Vulkan maxMemoryAllocationSize {what}")
    return VulkanLimits(
        device=device,
        max_allocation=max_allocation,
        max_buffer=max_buffer,
        driver_allocation=driver,
        block=block,
        max_tensor=max_tensor,
        heap_bytes=heap,
        free_bytes=free,
        warnings=tuple(warnings),
    )


def match_vulkan(
    llama_name: str | None,
    hardware_name: str,
    listed_names: Sequence[str],
    report: VulkanReport,
    env: Mapping[str, str],
) -> tuple[VulkanDevice | None, str]:
    """The probed device behind llama.cpp's `VulkanN`, and how it was found. With GGML_VK_VISIBLE_DEVICES the
    N-th index listed there is the device's place in vkEnumeratePhysicalDevices; without it, by name (the k-th
    VulkanN of a name is the k-th probed device of that name)."""
    if not report.devices:
        return None, f"no Vulkan device probed ({report.note})"
    number = re.search(r"(\d+)$", llama_name or "")
    position = int(number.group(1)) if number else 0
    visible = env.get(VISIBLE_DEVICES)
    if visible:
        indices = [stoull(part) for part in visible.split(",")]
        if position < len(indices) and indices[position] is not None:
            wanted = indices[position]
            found = next((d for d in report.devices if d.index == wanted), None)
            if found is not None:
                return found, f"{VISIBLE_DEVICES}={visible}: {llama_name} is Vulkan physical device {wanted}"
    same = [d for d in report.devices if d.name == hardware_name]
    before = sum(1 for name in listed_names[:position] if name == hardware_name)
    if before < len(same):
        return same[before], f"{llama_name} matched to the Vulkan device named '{hardware_name}'"
    return None, f"no probed Vulkan device is named '{hardware_name}' ({report.note})"
