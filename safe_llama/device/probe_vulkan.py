"""Vulkan devices through the loader (ctypes on libvulkan.so.1): the limits ggml-vulkan reads from them
(maxMemoryAllocationSize, maxBufferSize, limits.maxStorageBufferRange), their memory heaps and what
VK_EXT_memory_budget says is free.

Owns the only libvulkan load, and running the query in a child Python (a crashing ICD must not take
safe-llama down). Must not raise when Vulkan is missing or broken: the report says what it saw and why
it saw nothing. Must not decide which device llama.cpp uses nor compute llama.cpp's limits (target_device and
vulkan_limits do).
"""

from __future__ import annotations

import contextlib
import json
import struct
import sys
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from safe_llama import state
from safe_llama.cmdline import env_scan
from safe_llama.errors import SafeLlamaError

if TYPE_CHECKING:
    import ctypes  # imported where a probe runs: a cached launch never loads it

RESULT_MARK = "safe-llama-vulkan-report "  # drivers may print on stdout too; our line is marked

# Environment variables that change which Vulkan devices exist or what they report (the loader's driver
# selection, Mesa's switches); a cached probe is only valid for the same values.
ENV_PREFIXES = ("VK_", "MESA_", "LP_", "RADV_", "ANV_", "NVK_", "__NV", "__EGL", "DISABLE_LAYER", "LD_LIBRARY_PATH")

# VkStructureType values (vulkan_core.h)
_APPLICATION_INFO = 0
_INSTANCE_CREATE_INFO = 1
_PROPERTIES_2 = 1000059001
_MEMORY_PROPERTIES_2 = 1000059006
_MAINTENANCE_3_PROPERTIES = 1000168000
_MAINTENANCE_4_PROPERTIES = 1000413001
_MEMORY_BUDGET_PROPERTIES = 1000237000
_INSTANCE_ENUMERATE_PORTABILITY = 0x00000001
_HEAP_DEVICE_LOCAL = 0x00000001
_DEVICE_TYPES = {0: "other", 1: "integrated-gpu", 2: "discrete-gpu", 3: "virtual-gpu", 4: "cpu"}

# VkPhysicalDeviceProperties: five uint32, deviceName[256], pipelineCacheUUID[16], then VkPhysicalDeviceLimits
# (8-byte aligned, at 296) whose 8th uint32 is maxStorageBufferRange; 824 bytes in all.
_PROPS_SIZE = 824
_LIMITS_AT = 296
_STORAGE_RANGE_AT = _LIMITS_AT + 7 * 4
# VkPhysicalDeviceMemoryProperties: memoryTypeCount, 32 x {flags, heapIndex}, memoryHeapCount, 16 x
# {VkDeviceSize size, flags} (at 264); 520 bytes.
_MEMORY_SIZE = 520
_HEAP_COUNT_AT = 4 + 32 * 8
_HEAPS_AT = 264


@dataclass(frozen=True)
class VulkanHeap:
    size: int
    device_local: bool
    budget: int | None  # VK_EXT_memory_budget heapBudget, None without the extension
    usage: int | None  # heapUsage: what this and other processes already use of it


@dataclass(frozen=True)
class VulkanDevice:
    index: int  # position in vkEnumeratePhysicalDevices (what GGML_VK_VISIBLE_DEVICES counts)
    name: str
    device_type: str  # integrated-gpu, discrete-gpu, virtual-gpu, cpu, other
    vendor_id: int
    device_id: int
    api_version: str
    max_memory_allocation_size: int  # VkPhysicalDeviceMaintenance3Properties
    max_buffer_size: int | None  # VkPhysicalDeviceMaintenance4Properties; None without VK_KHR_maintenance4
    max_storage_buffer_range: int  # limits.maxStorageBufferRange
    heaps: tuple[VulkanHeap, ...]
    memory_budget: bool  # VK_EXT_memory_budget
    shader_64bit_indexing: bool  # VK_EXT_shader_64bit_indexing (lifts the storage range in builds that know it)


@dataclass(frozen=True)
class VulkanReport:
    devices: tuple[VulkanDevice, ...]
    status: str  # "ok", "no-loader", "no-devices", "error"
    note: str  # what was seen; when nothing, why


def _check(result: int, what: str) -> None:
    if result < 0:
        raise OSError(f"{what} failed: VkResult {result}")


def _extensions(vk: ctypes.CDLL, device: ctypes.c_void_p) -> set[str]:
    import ctypes

    count = ctypes.c_uint32(0)
    _check(vk.vkEnumerateDeviceExtensionProperties(device, None, ctypes.byref(count), None), "extension count")
    raw = (ctypes.c_char * (260 * count.value))()  # VkExtensionProperties: extensionName[256], specVersion
    _check(vk.vkEnumerateDeviceExtensionProperties(device, None, ctypes.byref(count), raw), "extensions")
    data = bytes(raw)
    return {data[i * 260 : i * 260 + 256].split(b"\0")[0].decode(errors="replace") for i in range(count.value)}


def _chain(*sizes: tuple[int, int]) -> list[Any]:
    """Structures of (sType, payload bytes), each an 8-byte aligned buffer whose pNext points at the next."""
    import ctypes

    bufs = [(ctypes.c_uint64 * ((16 + size + 7) // 8))() for _, size in sizes]
    for i, (stype, _) in enumerate(sizes):
        struct.pack_into("I", bufs[i], 0, stype)
        nxt = ctypes.addressof(bufs[i + 1]) if i + 1 < len(bufs) else 0
        struct.pack_into("Q", bufs[i], 8, nxt)
    return bufs


def _device(vk: ctypes.CDLL, handle: ctypes.c_void_p, index: int) -> VulkanDevice:
    extensions = _extensions(vk, handle)
    maint4 = "VK_KHR_maintenance4" in extensions
    budget_ext = "VK_EXT_memory_budget" in extensions
    props_chain = [(_PROPERTIES_2, _PROPS_SIZE), (_MAINTENANCE_3_PROPERTIES, 16)]
    if maint4:
        props_chain.append((_MAINTENANCE_4_PROPERTIES, 8))
    props = _chain(*props_chain)
    vk.vkGetPhysicalDeviceProperties2(handle, props[0])
    raw = bytes(props[0])[16:]
    api, _driver, vendor, device_id, kind = struct.unpack_from("5I", raw, 0)
    name = raw[20:276].split(b"\0")[0].decode(errors="replace")
    (storage_range,) = struct.unpack_from("I", raw, _STORAGE_RANGE_AT)
    (max_alloc,) = struct.unpack_from("Q", bytes(props[1]), 24)  # after maxPerSetDescriptors and padding
    max_buffer = struct.unpack_from("Q", bytes(props[2]), 16)[0] if maint4 else None
    memory_chain = [(_MEMORY_PROPERTIES_2, _MEMORY_SIZE)]
    if budget_ext:
        memory_chain.append((_MEMORY_BUDGET_PROPERTIES, 16 * 8 * 2))
    memory = _chain(*memory_chain)
    vk.vkGetPhysicalDeviceMemoryProperties2(handle, memory[0])
    mem = bytes(memory[0])[16:]
    budgets = bytes(memory[1])[16:] if budget_ext else b""
    heaps = []
    for i in range(min(struct.unpack_from("I", mem, _HEAP_COUNT_AT)[0], 16)):
        size, flags = struct.unpack_from("QI", mem, _HEAPS_AT + 16 * i)
        budget = struct.unpack_from("Q", budgets, 8 * i)[0] if budget_ext else None
        usage = struct.unpack_from("Q", budgets, 128 + 8 * i)[0] if budget_ext else None
        heaps.append(VulkanHeap(size, bool(flags & _HEAP_DEVICE_LOCAL), budget, usage))
    return VulkanDevice(
        index=index,
        name=name,
        device_type=_DEVICE_TYPES.get(kind, f"type {kind}"),
        vendor_id=vendor,
        device_id=device_id,
        api_version=f"{api >> 22 & 0x7F}.{api >> 12 & 0x3FF}.{api & 0xFFF}",
        max_memory_allocation_size=max_alloc,
        max_buffer_size=max_buffer,
        max_storage_buffer_range=storage_range,
        heaps=tuple(heaps),
        memory_budget=budget_ext,
        shader_64bit_indexing="VK_EXT_shader_64bit_indexing" in extensions,
    )


def probe_vulkan() -> VulkanReport:
    """Every physical device the Vulkan loader offers. Never raises: failures are in status and note."""
    import ctypes

    try:
        vk = ctypes.CDLL("libvulkan.so.1")
    except OSError as err:
        return VulkanReport((), "no-loader", f"no Vulkan loader (libvulkan.so.1): {err}")
    vk.vkCreateInstance.restype = ctypes.c_int32
    vk.vkEnumeratePhysicalDevices.restype = ctypes.c_int32
    vk.vkEnumerateDeviceExtensionProperties.restype = ctypes.c_int32
    vk.vkEnumerateInstanceExtensionProperties.restype = ctypes.c_int32
    vk.vkDestroyInstance.argtypes = [ctypes.c_void_p, ctypes.c_void_p]
    for fn in ("vkEnumerateDeviceExtensionProperties", "vkGetPhysicalDeviceProperties2"):
        getattr(vk, fn).argtypes = None
    app = _chain((_APPLICATION_INFO, 32))[0]
    struct.pack_into("I", app, 44, (1 << 22) | (2 << 12))  # VkApplicationInfo.apiVersion (its last field): 1.2
    info = _chain((_INSTANCE_CREATE_INFO, 48))[0]
    count = ctypes.c_uint32(0)
    vk.vkEnumerateInstanceExtensionProperties(None, ctypes.byref(count), None)
    raw = (ctypes.c_char * (260 * max(count.value, 1)))()
    vk.vkEnumerateInstanceExtensionProperties(None, ctypes.byref(count), raw)
    names = {bytes(raw)[i * 260 : i * 260 + 256].split(b"\0")[0] for i in range(count.value)}
    portability = b"VK_KHR_portability_enumeration" in names
    ext_list = (ctypes.c_char_p * 1)(b"VK_KHR_portability_enumeration")
    # VkInstanceCreateInfo payload: flags (u32, padded), pApplicationInfo, enabledLayerCount (padded),
    # ppEnabledLayerNames, enabledExtensionCount (padded), ppEnabledExtensionNames
    struct.pack_into("I", info, 16, _INSTANCE_ENUMERATE_PORTABILITY if portability else 0)
    struct.pack_into("Q", info, 24, ctypes.addressof(app))
    if portability:
        struct.pack_into("I", info, 48, 1)
        struct.pack_into("Q", info, 56, ctypes.addressof(ext_list))
    instance = ctypes.c_void_p()
    result = vk.vkCreateInstance(info, None, ctypes.byref(instance))
    if result != 0:
        return VulkanReport((), "error", f"vkCreateInstance failed: VkResult {result} (no usable Vulkan driver?)")
    try:
        count = ctypes.c_uint32(0)
        _check(vk.vkEnumeratePhysicalDevices(instance, ctypes.byref(count), None), "vkEnumeratePhysicalDevices")
        handles = (ctypes.c_void_p * max(count.value, 1))()
        _check(vk.vkEnumeratePhysicalDevices(instance, ctypes.byref(count), handles), "vkEnumeratePhysicalDevices")
        devices = tuple(_device(vk, ctypes.c_void_p(handles[i]), i) for i in range(count.value))
    except OSError as err:
        return VulkanReport((), "error", str(err))
    finally:
        vk.vkDestroyInstance(instance, None)
    if not devices:
        return VulkanReport((), "no-devices", "the Vulkan loader offers no physical device (no Vulkan driver?)")
    listed = ", ".join(f"{d.name} ({d.device_type})" for d in devices)
    return VulkanReport(devices, "ok", f"{len(devices)} device(s): {listed}")


def fingerprint(env: Mapping[str, str]) -> str:
    """A key that changes when the Vulkan set-up may have changed: the ICD manifests, the dynamic linker cache,
    the boot and the environment variables the loader and the drivers read."""
    parts = []
    for path in [Path("/etc/ld.so.cache"), Path("/proc/sys/kernel/random/boot_id")]:
        try:
            parts.append(f"{path}:{path.stat().st_mtime_ns}:{path.read_bytes()[:64]!r}")
        except OSError:
            parts.append(f"{path}:missing")
    for folder in ("/usr/share/vulkan/icd.d", "/etc/vulkan/icd.d", "/usr/local/share/vulkan/icd.d"):
        directory = Path(folder)
        if directory.is_dir():
            for manifest in sorted(directory.iterdir()):
                try:
                    st = manifest.stat()
                except OSError:
                    continue
                parts.append(f"{manifest}:{st.st_size}:{st.st_mtime_ns}")
    parts.extend(f"{k}={v}" for k, v in sorted(env_scan.prefixed(env, ENV_PREFIXES).items()))
    return state.digest("\n".join(parts))


def report_to_dict(report: VulkanReport) -> dict[str, Any]:
    return asdict(report)


def report_from_dict(data: Mapping[str, Any]) -> VulkanReport:
    devices = []
    for d in data["devices"]:
        heaps = tuple(VulkanHeap(**h) for h in d["heaps"])
        devices.append(VulkanDevice(**{**d, "heaps": heaps}))
    return VulkanReport(devices=tuple(devices), status=str(data["status"]), note=str(data["note"]))


def probe_vulkan_isolated(env: Mapping[str, str], *, timeout: float = 60.0) -> VulkanReport:
    """probe_vulkan in a child Python: a broken driver that crashes or hangs cannot take safe-llama with it,
    and the loader reads `env` (VK_DRIVER_FILES and the drivers' own switches)."""
    try:
        from safe_llama.device.proc import run_module  # only a probe that runs (a cache miss) needs it

        captured = run_module("safe_llama.device.probe_vulkan", env_scan.whole(env), timeout=timeout)
    except SafeLlamaError as err:
        return VulkanReport((), "error", f"could not start the Vulkan probe: {err}")
    if captured.timed_out:
        return VulkanReport((), "error", f"the Vulkan probe hung for {timeout:.0f} s (a stuck driver?)")
    if captured.returncode < 0:
        return VulkanReport((), "error", f"the Vulkan probe died of signal {-captured.returncode} (a broken driver?)")
    marked = [line for line in captured.stdout.splitlines() if line.startswith(RESULT_MARK)]
    try:
        return report_from_dict(json.loads(marked[-1][len(RESULT_MARK) :]))
    except (IndexError, ValueError, KeyError, TypeError):
        last = (captured.stderr.strip().splitlines() or ["no output"])[-1]
        return VulkanReport((), "error", f"the Vulkan probe exited {captured.returncode} without a report: {last}")


def probe_vulkan_cached(
    *, env: Mapping[str, str], cache: Path, gpus: Sequence[str], refresh: bool = False
) -> tuple[VulkanReport, bool]:
    """probe_vulkan_isolated, cached in cache/vulkan.json under a key that changes with the loader's set-up
    and the GPUs sysfs shows (`gpus`). What VK_EXT_memory_budget says is free is kept with it: a launch that
    needs it now (a GPU no vendor interface reads) asks again with refresh (probing.probe_devices)."""
    key = state.digest("\n".join([fingerprint(env), *gpus]))
    where = cache / "vulkan.json"
    data = None if refresh else state.read_json(where)
    if isinstance(data, dict) and data.get("key") == key and isinstance(data.get("payload"), dict):
        try:
            return report_from_dict(data["payload"]), True
        except (KeyError, TypeError):
            pass  # written by another version: probe again
    report = probe_vulkan_isolated(env)
    if report.status != "error":
        with contextlib.suppress(OSError):  # a cache that cannot be written only costs the next run a probe
            state.write_json(where, {"key": key, "payload": report_to_dict(report)})
    return report, False


def main() -> int:
    """`python -m safe_llama.device.probe_vulkan`: print one marked JSON line (what probe_vulkan_isolated reads)."""
    sys.stdout.write(RESULT_MARK + json.dumps(report_to_dict(probe_vulkan())) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
