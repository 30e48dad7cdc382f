"""The Vulkan probe for real, on Mesa's lavapipe (mesa-vulkan-drivers, which scripts/setup.sh --test installs):
what it reads against what the pinned Vulkan build of llama.cpp itself reports, its cache, and a missing loader."""

from __future__ import annotations

import os
import re
import subprocess
from pathlib import Path

import pytest

from safe_llama.device.probe_vulkan import (
    VulkanDevice,
    VulkanReport,
    probe_vulkan_cached,
    probe_vulkan_isolated,
    report_from_dict,
    report_to_dict,
)
from safe_llama.device.probing import probe_devices

LAVAPIPE = "llvmpipe"


@pytest.fixture(scope="module")
def report() -> VulkanReport:
    return probe_vulkan_isolated(os.environ)


def _lavapipe(report: VulkanReport) -> VulkanDevice:
    found = [d for d in report.devices if d.name.startswith(LAVAPIPE)]
    assert found, f"lavapipe not among the Vulkan devices: {report.note}"
    return found[0]


def test_lavapipe_is_probed(report: VulkanReport) -> None:
    device = _lavapipe(report)
    assert report.status == "ok"
    assert device.device_type == "cpu"
    # Vulkan's required minimum for maxStorageBufferRange is 128 MiB; lavapipe's is no smaller, the others larger
    assert device.max_storage_buffer_range >= 1 << 27
    assert device.max_memory_allocation_size >= device.max_storage_buffer_range
    assert device.heaps and all(h.size > 0 for h in device.heaps)
    assert report_from_dict(report_to_dict(report)) == report


def test_the_heap_is_what_llama_cpp_lists(report: VulkanReport, vulkan_bin: Path, clean_env: dict[str, str]) -> None:
    """llama.cpp's --list-devices total is the device-local heaps' sum (ggml_backend_vk_get_device_memory)."""
    device = _lavapipe(report)
    env = {**clean_env, "GGML_VK_VISIBLE_DEVICES": str(device.index)}
    listing = subprocess.run(
        [str(vulkan_bin / "llama-server"), "--list-devices"], env=env, capture_output=True, text=True, timeout=120
    )
    found = re.search(r"Vulkan0: (.+) \((\d+) MiB, (\d+) MiB free\)", listing.stdout + listing.stderr)
    assert found is not None, listing.stdout + listing.stderr
    assert found.group(1) == device.name
    heaps = sum(h.size for h in device.heaps if h.device_local)
    assert int(found.group(2)) == heaps // (1 << 20)


def test_cached_until_the_environment_changes(tmp_path: Path, clean_env: dict[str, str]) -> None:
    first, cached = probe_vulkan_cached(env=clean_env, cache=tmp_path, gpus=[])
    assert not cached and first.status == "ok"
    again, cached = probe_vulkan_cached(env=clean_env, cache=tmp_path, gpus=[])
    assert cached and again == first
    _, cached = probe_vulkan_cached(env={**clean_env, "MESA_VK_VERSION_OVERRIDE": "1.2"}, cache=tmp_path, gpus=[])
    assert not cached
    (tmp_path / "vulkan.json").write_text("{broken")
    assert probe_vulkan_cached(env=clean_env, cache=tmp_path, gpus=[])[1] is False


def test_no_loader_is_a_report_not_an_error(tmp_path: Path, clean_env: dict[str, str]) -> None:
    """A machine without libvulkan.so.1 (LD_LIBRARY_PATH cannot hide the system's, so a loader that is a stub)."""
    stub = tmp_path / "libvulkan.so.1"
    stub.write_bytes(b"not a library")
    report = probe_vulkan_isolated({**clean_env, "LD_LIBRARY_PATH": str(tmp_path)})
    assert report.status == "no-loader" and "libvulkan.so.1" in report.note and not report.devices


def test_devices_report_carries_the_limits(tmp_path: Path, vulkan_bin: Path, clean_env: dict[str, str]) -> None:
    env = {**clean_env, "GGML_VK_VISIBLE_DEVICES": "0", "XDG_CACHE_HOME": str(tmp_path)}
    report = probe_devices(binary=vulkan_bin / "llama-server", env=env, opencl_always=False)
    target = report.target
    assert target.backend == "vulkan" and target.llama_name == "Vulkan0"
    assert target.vulkan is not None and report.vulkan is not None
    assert target.vulkan.max_tensor.detail.startswith("Vulkan maxStorageBufferRange")
    assert target.integrated is not None and target.integrated.value  # a CPU driver: its heap is host RAM
    forced = probe_devices(
        binary=vulkan_bin / "llama-server", env={**env, "GGML_VK_FORCE_MAX_BUFFER_SIZE": str(64 << 20)}
    )
    assert forced.target.vulkan is not None and forced.target.vulkan.max_tensor.value == 64 << 20
    assert forced.target.max_alloc_bytes is not None and forced.target.max_alloc_bytes.value == 64 << 20


def test_a_cpu_build_probes_no_vulkan(tmp_path: Path, llama_bin: Path, clean_env: dict[str, str]) -> None:
    report = probe_devices(binary=llama_bin / "llama-server", env={**clean_env, "XDG_CACHE_HOME": str(tmp_path)})
    assert report.vulkan is None and report.target.vulkan is None
