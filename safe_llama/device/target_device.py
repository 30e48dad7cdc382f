"""The pure core of device knowledge: which device a llama.cpp request lands on, the limits that apply
to it, and the host's memory budget, each value marked probed, declared or profile.

Owns the mapping from llama.cpp device names to OpenCL/PCI devices, the per-backend allocation rules and
the precedence declared > named profile > probed > profile matched by name. Pure: every fact comes in
as a value (probe results, profiles, environment); it reads no files and runs nothing.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from safe_llama.backends import openvino
from safe_llama.backends.backend import AllocRule, EnvCap
from safe_llama.backends.registry import ALLOC_RULES, backend_named, backend_of, rule_for
from safe_llama.device.free_memory import free_figure, match_reading
from safe_llama.device.limits import (
    NOTHING_DECLARED,
    Choice,
    DeclaredLimits,
    DeviceProfile,
    Sourced,
)
from safe_llama.device.llama_listing import DeviceRequest, ListedDevices, LlamaDevice
from safe_llama.device.matching import (
    _match_opencl,
    _match_pci,
    _neo_filter,
    _normal,
)
from safe_llama.device.probe_free import FreeReading
from safe_llama.device.probe_opencl import OpenCLDevice, OpenCLReport
from safe_llama.device.probe_sysfs import PciGpu, SysfsReport
from safe_llama.errors import ExitStatus, SafeLlamaError

if TYPE_CHECKING:  # Vulkan's modules are imported only where a Vulkan device's limits are read
    from safe_llama.device.probe_vulkan import VulkanReport
    from safe_llama.device.vulkan_limits import VulkanLimits


@dataclass(frozen=True)
class TargetDevice:
    """The device a llama.cpp command line will run on, and the limits that apply to it."""

    llama_name: str | None  # OPENVINO0, CUDA0, Vulkan1; None = no llama.cpp device (CPU only, or unknown)
    backend: str  # openvino, cuda, hip, vulkan, sycl, opencl, metal, cpu, unknown
    backend_device: str | None  # OpenVINO's own id: CPU, GPU, GPU.1, NPU
    description: str
    requested_by: str  # --device, LLAMA_ARG_DEVICE, GGML_OPENVINO_DEVICE, default, profile
    opencl: OpenCLDevice | None  # the OpenCL device matched to it
    pci: PciGpu | None  # the PCI device sysfs shows for it
    pci_bdf: str | None
    limits_alloc: bool  # the backend obeys a per-allocation limit (None in max_alloc_bytes = unknown)
    max_alloc_bytes: Sourced[int] | None
    memory_bytes: Sourced[int] | None
    memory_free_bytes: Sourced[int] | None
    integrated: Sourced[bool] | None
    on_host: bool  # the device is the host CPU itself (CPU backend, --device none, OpenVINO's CPU)
    shares_host_memory: bool  # CPU, iGPU, NPU: the host budget bounds the device too
    neo_filter: dict[str, str] = field(default_factory=dict)  # env that makes only this Intel GPU visible
    mapping_note: str = ""
    warnings: tuple[str, ...] = ()
    listed: LlamaDevice | None = None  # llama.cpp's own line for it
    free_is_vendor: bool = False  # memory_free_bytes came from the vendor's interface now, not the listing
    free_reading: FreeReading | None = None  # that reading (a launch record reads the same GPU's again)
    vulkan: VulkanLimits | None = None  # a Vulkan device's limits as ggml-vulkan computes them


# -------------------------------------------------------------------------------------------- profiles


def parse_profile(key: str, path: str, data: Mapping[str, Any]) -> DeviceProfile:
    """A device profile from its TOML table; a wrong type is a config error naming the file."""

    def get(name: str, kind: type, default: Any = None) -> Any:
        value = data.get(name, default)
        if value is not None and (not isinstance(value, kind) or (kind is int and isinstance(value, bool))):
            raise SafeLlamaError(
                f"safe-llama: {path}: '{name}' must be {kind.__name__}, not {value!r}", ExitStatus.BAD_CONFIG
            )
        return value

    match = get("match", list, [])
    if not all(isinstance(m, str) and m for m in match):
        raise SafeLlamaError(f"safe-llama: {path}: 'match' must be a list of names", ExitStatus.BAD_CONFIG)
    for name in ("max_alloc_bytes", "memory_bytes"):
        if (get(name, int) or 1) <= 0:
            raise SafeLlamaError(f"safe-llama: {path}: '{name}' must be positive", ExitStatus.BAD_CONFIG)
    return DeviceProfile(
        key=key,
        path=path,
        name=get("name", str, key),
        match=tuple(match),
        vendor_id=get("vendor_id", int),
        backend=get("backend", str),
        integrated=get("integrated", bool),
        max_alloc_bytes=get("max_alloc_bytes", int),
        memory_bytes=get("memory_bytes", int),
    )


# ----------------------------------------------------------------------------------------- host budget


# ------------------------------------------------------------------------------------- target mapping


def _profile_for(name: str, profiles: Sequence[DeviceProfile]) -> DeviceProfile | None:
    wanted = _normal(name)
    for profile in profiles:
        if any(_normal(m) in wanted for m in profile.match):
            return profile
    return None


def _host_cpu(requested_by: str, why: str) -> Choice:
    return Choice(None, None, "cpu", None, "host CPU", requested_by, notes=(why,))


def _choose_llama_device(request: DeviceRequest, listed: ListedDevices | None, profile: DeviceProfile | None) -> Choice:
    """Which llama.cpp device the request lands on (llama.cpp's rules: src/llama.cpp, common/arg.cpp)."""
    devices = listed.devices if listed is not None else ()
    if request.devices == ("none",):
        return _host_cpu(request.devices_from, f"{request.devices_from} none: nothing is offloaded")
    notes: list[str] = []
    warnings: list[str] = [f"llama.cpp: {listed.problem}"] if listed is not None and listed.problem else []
    chosen: LlamaDevice | None = None
    requested_by = request.devices_from
    if request.devices:
        name: str | None = request.devices[0]
        if len(request.devices) > 1:
            notes.append(f"{len(request.devices)} devices requested; this describes the first, {name}")
        chosen = next((d for d in devices if d.name == name), None)
        if chosen is None and listed is not None and listed.problem is None:
            known = ", ".join(d.name for d in devices) or "none"
            warnings.append(f"{name} is not among llama.cpp's devices ({known}): llama.cpp rejects it")
    else:
        # Without --device llama.cpp offloads to every GPU-type device; OpenVINO registers only its
        # selected device as a GPU (the others are IGPU-type, skipped when a GPU exists).
        usable = [d for d in devices if d.selected is not False]
        if not usable and listed is not None and listed.problem is None:
            return _host_cpu("default", "llama.cpp lists no device: everything runs on the host CPU")
        chosen = usable[0] if usable else None
        name = chosen.name if chosen else None
        if chosen is not None:
            own_device_env = backend_named(chosen.backend).own_device_env
            if request.openvino_device and own_device_env:
                requested_by = own_device_env
            offload = ", ".join(d.name for d in usable)
            notes.append(f"no --device: llama.cpp offloads to {offload}; {chosen.name} is the first")
    if chosen is not None:
        if chosen.selected is False:  # a backend's own device other than the one its variable selects
            selected = next((d.openvino_device for d in devices if d.selected), "another")
            warnings.append(
                f"{chosen.name} is GGML_OPENVINO_DEVICE={chosen.openvino_device}, but the selected OpenVINO "
                f"device is {selected}: llama.cpp aborts ('not the selected OpenVINO device'); "
                f"set GGML_OPENVINO_DEVICE={chosen.openvino_device}"
            )
        return Choice(
            llama=chosen,
            llama_name=chosen.name,
            backend=chosen.backend,
            backend_device=chosen.openvino_device,
            description=chosen.hardware_name,
            requested_by=requested_by,
            notes=tuple(notes),
            warnings=tuple(warnings),
        )
    # No listing to go by: what the request and the profile say.
    ov = request.openvino_device
    said = {"notes": tuple(notes), "warnings": tuple(warnings)}
    if name is not None:
        backend = backend_of(name)
        own_device = ov if backend_named(backend).own_device_env else None
        return Choice(None, name, backend, own_device, name, requested_by, **said)
    if ov:
        return Choice(None, None, openvino.BACKEND.name, ov, f"OpenVINO {ov}", openvino.DEVICE_ENV, **said)
    if profile is not None and profile.backend:
        ov_default = "GPU" if backend_named(profile.backend).own_device_env else None
        return Choice(None, None, profile.backend, ov_default, profile.name, "profile", **said)
    return Choice(None, None, "unknown", None, "unknown", "default", **said)


def _opencl_cap(cl_device: OpenCLDevice | None, vulkan: VulkanLimits | None) -> Sourced[int] | None:
    if cl_device is None:
        return None
    detail = f"OpenCL CL_DEVICE_MAX_MEM_ALLOC_SIZE of '{cl_device.name}' ({cl_device.platform})"
    return Sourced(cl_device.max_mem_alloc_size, "probed", detail)


def _vulkan_cap(cl_device: OpenCLDevice | None, vulkan: VulkanLimits | None) -> Sourced[int] | None:
    if vulkan is None:
        return None
    # one buffer: at most the max buffer size (ggml_vk_create_buffer) and the driver's max allocation
    return min(vulkan.max_buffer, vulkan.driver_allocation, key=lambda s: s.value)


# How each AllocRule.alloc_limit is read from the probes ("unprobed": by none of them).
_PROBED_CAPS: dict[str, Callable[[OpenCLDevice | None, VulkanLimits | None], Sourced[int] | None]] = {
    "opencl": _opencl_cap,
    "vulkan": _vulkan_cap,
}


def _max_alloc(
    rule: AllocRule | None,
    cl_device: OpenCLDevice | None,
    declared: DeclaredLimits,
    profile: DeviceProfile | None,
    matched: DeviceProfile | None,
    vulkan: VulkanLimits | None = None,
    caps: Sequence[EnvCap] = (),
) -> tuple[bool, Sourced[int] | None]:
    """Whether a per-allocation limit applies, and its value (`caps`: the backend's ceilings that apply
    in llama.cpp's environment, over a probed figure)."""
    if declared.max_alloc_bytes is not None:
        return True, Sourced(declared.max_alloc_bytes, "declared", declared.origin("max_alloc", "--max-alloc"))
    if profile is not None and profile.max_alloc_bytes is not None:
        return True, Sourced(profile.max_alloc_bytes, "profile", profile.path)
    if rule is None or rule.alloc_limit == "none":
        return False, None
    read = _PROBED_CAPS.get(rule.alloc_limit)
    probed = read(cl_device, vulkan) if read is not None else None
    if probed is not None:
        for cap in caps:
            if cap.cap_bytes < probed.value:
                probed = Sourced(cap.cap_bytes, "probed", f"{cap.why} ({cap.variable} is set; {probed.detail})")
        return True, probed
    if matched is not None and matched.max_alloc_bytes is not None:
        return True, Sourced(matched.max_alloc_bytes, "profile", f"{matched.path} (matched by name)")
    return True, None


def _memory(
    choice: Choice,
    on_host: bool,
    host_total: int | None,
    cl_device: OpenCLDevice | None,
    pci: PciGpu | None,
    declared: DeclaredLimits,
    profile: DeviceProfile | None,
    matched: DeviceProfile | None,
) -> Sourced[int] | None:
    if declared.memory_bytes is not None:
        return Sourced(declared.memory_bytes, "declared", declared.origin("device_memory", "--device-memory"))
    if profile is not None and profile.memory_bytes is not None:
        return Sourced(profile.memory_bytes, "profile", profile.path)
    if on_host and declared.host_memory_bytes is not None:
        return Sourced(
            declared.host_memory_bytes,
            "declared",
            f"{declared.origin('host_memory', '--host-memory')} (the device is the host)",
        )
    if choice.llama is not None:
        detail = f"llama.cpp --list-devices total of {choice.llama.name}"
        return Sourced(choice.llama.total_bytes, "probed", detail)
    if on_host and host_total is not None:
        return Sourced(host_total, "probed", "physical RAM (MemTotal; the device is the host)")
    if cl_device is not None:
        detail = f"OpenCL CL_DEVICE_GLOBAL_MEM_SIZE of '{cl_device.name}'"
        return Sourced(cl_device.global_mem_size, "probed", detail)
    if pci is not None and pci.vram_bytes is not None:
        return Sourced(pci.vram_bytes, "probed", f"sysfs mem_info_vram_total of {pci.bdf}")
    if matched is not None and matched.memory_bytes is not None:
        return Sourced(matched.memory_bytes, "profile", f"{matched.path} (matched by name)")
    return None


def _integrated(
    choice: Choice,
    on_host: bool,
    cl_device: OpenCLDevice | None,
    pci: PciGpu | None,
    declared: DeclaredLimits,
    profile: DeviceProfile | None,
    matched: DeviceProfile | None,
) -> Sourced[bool] | None:
    """Integrated or discrete; None for the host CPU itself, or when nothing says."""
    if declared.integrated is not None:
        return Sourced(declared.integrated, "declared", declared.origin("integrated", "--integrated/--discrete"))
    if profile is not None and profile.integrated is not None:
        return Sourced(profile.integrated, "profile", profile.path)
    if on_host:
        return None
    if cl_device is not None and cl_device.host_unified_memory is not None:
        return Sourced(cl_device.host_unified_memory, "probed", "OpenCL CL_DEVICE_HOST_UNIFIED_MEMORY")
    kind_pattern = backend_named(choice.backend).integrated_in_description
    kind = re.search(kind_pattern, choice.description) if kind_pattern else None
    if kind:
        return Sourced(kind.group("integrated") == "i", "probed", "OpenVINO's device name (iGPU/dGPU)")
    if pci is not None and pci.integrated is not None:
        return Sourced(pci.integrated, "probed", f"sysfs: Intel GPU at {pci.bdf}")
    if matched is not None and matched.integrated is not None:
        return Sourced(matched.integrated, "profile", f"{matched.path} (matched by name)")
    return None


def resolve_target(
    *,
    request: DeviceRequest,
    listed: ListedDevices | None,
    opencl: OpenCLReport,
    sysfs: SysfsReport,
    host_total: int | None,
    declared: DeclaredLimits = NOTHING_DECLARED,
    profile: DeviceProfile | None = None,
    profiles: Sequence[DeviceProfile] = (),
    env: Mapping[str, str],
    rules: Mapping[str, AllocRule] = ALLOC_RULES,
    free_now: Sequence[FreeReading] = (),
    listing_age: float | None = None,
    vulkan: VulkanReport | None = None,
    vulkan_now: bool = False,
) -> TargetDevice:
    """The device a request lands on and its limits: declared > profile given by name > probed > a profile
    matched by device name. Pure: every fact comes in as a value (`rules`: the backends' rules with a user's
    [backends] over them, as `profiles.backend_rules` reads them). `vulkan_now`: the Vulkan report was read now,
    so its VK_EXT_memory_budget figure is the free memory of a GPU no vendor interface reads."""
    choice = _choose_llama_device(request, listed, profile)
    backend = backend_named(choice.backend)
    kind = backend.kind(choice.backend_device)
    rule = rule_for(rules, choice.backend, choice.backend_device)
    notes = list(choice.notes)
    warnings = list(choice.warnings)
    cl_device, how = _match_opencl(choice, rule, opencl, env)
    pci, pci_how = _match_pci(cl_device, choice, rule, sysfs, profile)
    notes.extend(note for note in (how, pci_how) if note)
    bdf = cl_device.pci_bdf if cl_device is not None and cl_device.pci_bdf else pci.bdf if pci else None
    on_host = kind in backend.host_kinds
    if rule is not None:
        notes.append(rule.why)
    elif choice.backend != "unknown":
        notes.append(f"no rule for backend '{choice.backend}': its limits are unknown")
    matched = None
    if profile is None:
        matched = _profile_for(choice.description, profiles)
        if matched is None and cl_device is not None:
            matched = _profile_for(cl_device.name, profiles)
    else:
        notes.append(f"profile {profile.key} ({profile.path}) given by name")

    vk_limits = None
    if backend.vulkan_limits and vulkan is not None:
        from safe_llama.device.vulkan_limits import match_vulkan, vulkan_limits

        listed_names = [d.hardware_name for d in listed.devices if d.backend == choice.backend] if listed else []
        vk_device, vk_how = match_vulkan(choice.llama_name, choice.description, listed_names, vulkan, env)
        notes.append(vk_how)
        if vk_device is not None:
            vk_limits = vulkan_limits(vk_device, env)
            warnings.extend(vk_limits.warnings)
    caps = [cap for cap in backend.env_caps if cap.applies(env)]
    limits_alloc, max_alloc = _max_alloc(rule, cl_device, declared, profile, matched, vk_limits, caps)
    if limits_alloc and max_alloc is None:
        warnings.append("the per-allocation limit of this device is unknown: declare --max-alloc or --profile")
    integrated = _integrated(choice, on_host, cl_device, pci, declared, profile, matched)
    if integrated is None and vk_limits is not None:
        # an integrated GPU, or a CPU driver (lavapipe): its heaps are host RAM
        kind = vk_limits.device.device_type
        integrated = Sourced(kind in ("integrated-gpu", "cpu"), "probed", f"Vulkan deviceType {kind}")
    neo, neo_note, neo_warnings = _neo_filter(choice.backend, cl_device, pci, bdf, sysfs, opencl, env)
    if neo_note:
        notes.append(neo_note)
    warnings.extend(neo_warnings)
    reading, free_how = match_reading(choice.llama, pci, free_now, env)
    if free_how and reading is None:
        notes.append(f"free memory: {free_how}")
    own_memory = not on_host and not (integrated is not None and integrated.value)
    budget = vk_limits.free_bytes if vk_limits is not None and vulkan_now and own_memory else None
    free = free_figure(choice.llama, reading, listing_age=listing_age, vulkan_budget=budget)
    return TargetDevice(
        llama_name=choice.llama_name,
        backend=choice.backend,
        backend_device=choice.backend_device,
        description=choice.description,
        requested_by=choice.requested_by,
        opencl=cl_device,
        pci=pci,
        pci_bdf=bdf,
        limits_alloc=limits_alloc,
        max_alloc_bytes=max_alloc,
        memory_bytes=_memory(choice, on_host, host_total, cl_device, pci, declared, profile, matched),
        memory_free_bytes=free,
        integrated=integrated,
        on_host=on_host,
        shares_host_memory=on_host
        or kind in backend.host_memory_kinds
        or (integrated is not None and integrated.value),
        neo_filter=neo,
        mapping_note="; ".join(notes),
        warnings=tuple(warnings),
        listed=choice.llama,
        free_is_vendor=reading is not None or budget is not None,
        free_reading=reading,
        vulkan=vk_limits,
    )
