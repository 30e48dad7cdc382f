"""ggml-vulkan's limits from probed properties and the GGML_VK_* switches, as the pinned ggml-vulkan.cpp
computes them (ggml_vk_get_device); which probed device a llama.cpp VulkanN is."""

from __future__ import annotations

import dataclasses

import pytest

from safe_llama.device.probe_vulkan import VulkanDevice, VulkanHeap, VulkanReport
from safe_llama.device.vulkan_limits import match_vulkan, stoull, vulkan_limits

MIB = 1 << 20
GIB = 1 << 30

# what the probe read here from Mesa's lavapipe (mesa-vulkan-drivers 22.3.6) and, on the GPU machine, from
# NVIDIA's driver on an H200 (../shared/gpu/README.md)
LAVAPIPE = VulkanDevice(
    index=0, name="llvmpipe (LLVM 15.0.6, 256 bits)", device_type="cpu", vendor_id=0x10005, device_id=0,
    api_version="1.3.230", max_memory_allocation_size=2 * GIB, max_buffer_size=4 * GIB - 1,
    max_storage_buffer_range=128 * MIB, heaps=(VulkanHeap(2 * GIB, True, None, None),), memory_budget=False,
    shader_64bit_indexing=False,
)  # fmt: skip
H200 = VulkanDevice(
    index=0, name="NVIDIA H200", device_type="discrete-gpu", vendor_id=0x10DE, device_id=0x2335,
    api_version="1.4.312", max_memory_allocation_size=0xFFE00000, max_buffer_size=1 << 40,
    max_storage_buffer_range=4 * GIB - 1,
    heaps=(VulkanHeap(143771 * MIB, True, 143139 * MIB, 0), VulkanHeap(64 * GIB, False, 60 * GIB, 0)),
    memory_budget=True, shader_64bit_indexing=False,
)  # fmt: skip


@pytest.mark.parametrize(
    ("device", "env", "expected"),
    [
        pytest.param(
            LAVAPIPE, {}, (2 * GIB, 4 * GIB - 1, GIB, 128 * MIB, "Vulkan maxStorageBufferRange"), id="lavapipe"
        ),
        pytest.param(H200, {}, (0xFFE00000, 1 << 40, GIB, 4 * GIB - 1, "Vulkan maxStorageBufferRange"), id="h200"),
        pytest.param(
            dataclasses.replace(LAVAPIPE, max_buffer_size=None),
            {},
            (2 * GIB, 2 * GIB, GIB, 128 * MIB, "Vulkan maxStorageBufferRange"),
            id="no-maintenance4-buffer-is-the-allocation",
        ),
        pytest.param(
            LAVAPIPE,
            {"GGML_VK_FORCE_MAX_ALLOCATION_SIZE": str(64 * MIB)},
            (64 * MIB, 4 * GIB - 1, 64 * MIB, 128 * MIB, "Vulkan maxStorageBufferRange"),
            id="forced-allocation-shrinks-the-block",
        ),
        pytest.param(
            LAVAPIPE,
            {"GGML_VK_FORCE_MAX_BUFFER_SIZE": str(100 * MIB)},
            (2 * GIB, 100 * MIB, GIB, 100 * MIB, "GGML_VK_FORCE_MAX_BUFFER_SIZE"),
            id="forced-buffer-below-the-range-bounds-tensors",
        ),
        pytest.param(
            LAVAPIPE,
            {"GGML_VK_SUBALLOCATION_BLOCK_SIZE": str(256 * MIB)},
            (2 * GIB, 4 * GIB - 1, 256 * MIB, 128 * MIB, "Vulkan maxStorageBufferRange"),
            id="block-size",
        ),
        pytest.param(
            LAVAPIPE,
            {"GGML_VK_SUBALLOCATION_BLOCK_SIZE": str(8 * GIB)},
            (2 * GIB, 4 * GIB - 1, 2 * GIB, 128 * MIB, "Vulkan maxStorageBufferRange"),
            id="block-capped-at-the-allocation",
        ),
    ],
)
def test_limits(device: VulkanDevice, env: dict[str, str], expected: tuple[int, int, int, int, str]) -> None:
    limits = vulkan_limits(device, env)
    got = (
        limits.max_allocation.value,
        limits.max_buffer.value,
        limits.block.value,
        limits.max_tensor.value,
        limits.max_tensor.detail,
    )
    assert got[:4] == expected[:4]
    assert got[4].startswith(expected[4])
    assert limits.driver_allocation.value == device.max_memory_allocation_size


def test_budget_counts_device_local_heaps_only() -> None:
    assert vulkan_limits(H200, {}).free_bytes == 143139 * MIB
    assert vulkan_limits(LAVAPIPE, {}).free_bytes is None  # no VK_EXT_memory_budget: unknown, not the heap size


def test_a_switch_that_is_no_number_is_a_warning() -> None:
    limits = vulkan_limits(LAVAPIPE, {"GGML_VK_FORCE_MAX_BUFFER_SIZE": "64M"})
    assert limits.max_buffer.value == 64  # std::stoull stops at the first non-digit
    broken = vulkan_limits(LAVAPIPE, {"GGML_VK_FORCE_MAX_BUFFER_SIZE": "big"})
    assert broken.max_buffer.value == 4 * GIB - 1
    assert any("std::stoull" in w for w in broken.warnings)


@pytest.mark.parametrize(
    ("text", "value"),
    [("123", 123), ("  42abc", 42), ("+7", 7), ("-1", (1 << 64) - 1), ("x1", None), ("", None), (str(1 << 64), None)],
)
def test_stoull(text: str, value: int | None) -> None:
    assert stoull(text) == value


def test_64bit_indexing_is_named_but_the_range_still_planned() -> None:
    limits = vulkan_limits(dataclasses.replace(H200, shader_64bit_indexing=True), {})
    assert limits.max_tensor.value == 4 * GIB - 1
    assert any("VK_EXT_shader_64bit_indexing" in w for w in limits.warnings)


def test_match_by_name_and_by_visible_devices() -> None:
    second = dataclasses.replace(LAVAPIPE, index=1)
    report = VulkanReport((H200, second), "ok", "")
    found, how = match_vulkan("Vulkan0", LAVAPIPE.name, [LAVAPIPE.name], report, {})
    assert found == second and "named" in how
    found, how = match_vulkan("Vulkan0", "whatever", ["whatever"], report, {"GGML_VK_VISIBLE_DEVICES": "1"})
    assert found == second and "GGML_VK_VISIBLE_DEVICES=1" in how
    found, how = match_vulkan("Vulkan0", "Radeon", ["Radeon"], report, {})
    assert found is None and "Radeon" in how
    assert match_vulkan("Vulkan0", "x", ["x"], VulkanReport((), "no-loader", "none here"), {})[0] is None
