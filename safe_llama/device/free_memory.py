"""Which free-memory reading belongs to the device llama.cpp will use, and the figure the plan takes.

Owns matching a vendor reading (NVML, amdgpu sysfs) to a llama.cpp device (by CUDA's numbering under
CUDA_VISIBLE_DEVICES, by name, by PCI address), and the fallback to llama.cpp's own `--list-devices` free
figure, said with its age. Pure: readings, devices and the environment come in as values."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from safe_llama.backends.registry import backend_named
from safe_llama.device.limits import Sourced
from safe_llama.device.llama_listing import LlamaDevice
from safe_llama.device.probe_free import FreeReading
from safe_llama.device.probe_sysfs import PciGpu

# llama.cpp's CUDA backend numbers the devices CUDA shows it; NVML numbers every GPU in PCI order. They agree
# unless CUDA_VISIBLE_DEVICES reorders or hides GPUs (then its entries are NVML indices or GPU UUIDs).


def _visible(readings: Sequence[FreeReading], env: Mapping[str, str]) -> list[FreeReading] | None:
    """The NVIDIA GPUs CUDA shows, in its order; None when CUDA_VISIBLE_DEVICES names what NVML cannot map."""
    text = env.get("CUDA_VISIBLE_DEVICES")
    ordered = sorted(readings, key=lambda r: r.index)
    if text is None:
        return ordered
    out = []
    for item in (part.strip() for part in text.split(",")):
        if not item:
            break
        if item.isdigit():
            found = next((r for r in ordered if r.index == int(item)), None)
        elif item.startswith("GPU-"):
            found = next((r for r in ordered if r.uuid and r.uuid.startswith(item)), None)
        else:
            return None  # MIG-... instances: NVML's whole-GPU figure is not the instance's
        if found is None:
            break  # CUDA stops at the first entry it cannot use
        out.append(found)
    return out


def match_reading(
    device: LlamaDevice | None, pci: PciGpu | None, readings: Sequence[FreeReading], env: Mapping[str, str]
) -> tuple[FreeReading | None, str]:
    """The reading of this device, and how it was matched (or why none was)."""
    if device is None or not readings:
        return None, ""
    nvidia = [r for r in readings if r.source == "nvml"]
    if backend_named(device.backend).free_source == "nvml" and nvidia:
        visible = _visible(nvidia, env)
        if visible is None:
            return None, "CUDA_VISIBLE_DEVICES names a MIG instance: NVML's free figure is the whole GPU's"
        index = device.index or 0
        if index >= len(visible):
            return None, f"NVML shows no GPU {index} under CUDA_VISIBLE_DEVICES"
        found = visible[index]
        if found.name and found.name != device.hardware_name:
            return None, f"NVML's GPU {found.index} is '{found.name}', not '{device.hardware_name}'"
        return found, f"CUDA{index} is NVML's GPU {found.index} ({found.pci_bdf})"
    if pci is not None:
        by_bdf = next((r for r in readings if r.pci_bdf == pci.bdf), None)
        if by_bdf is not None:
            return by_bdf, f"PCI {pci.bdf}"
    named = [r for r in nvidia if r.name and r.name == device.hardware_name]
    if len(named) == 1:
        return named[0], f"the only NVIDIA GPU named '{device.hardware_name}'"
    return None, ""


def free_figure(
    device: LlamaDevice | None,
    reading: FreeReading | None,
    *,
    listing_age: float | None,
    vulkan_budget: int | None = None,
) -> Sourced[int] | None:
    """What is free on the device now: the vendor's reading, else VK_EXT_memory_budget's read now by the Vulkan
    probe (`vulkan_budget`: heapBudget - heapUsage over the heaps ggml counts), else llama.cpp's own listing
    with its age (listing_age: seconds since `--list-devices` ran; None when no listing)."""
    if reading is not None:
        where = reading.pci_bdf or reading.name
        detail = f"free now ({reading.source}, {where})"
        return Sourced(reading.free_bytes, "probed", detail)
    if vulkan_budget is not None:
        return Sourced(vulkan_budget, "probed", "free now (VK_EXT_memory_budget)")
    if device is None:
        return None
    when = "now" if listing_age is None or listing_age < 1 else f"{listing_age:.0f} s ago"
    return Sourced(device.free_bytes, "probed", f"free {when} (llama.cpp --list-devices)")
