"""The pure core of device knowledge: which device a llama.cpp request lands on, the limits that apply
to it, and the host's memory budget, each value marked probed, declared or profile.

Owns the mapping from llama.cpp device names to OpenCL/PCI devices, the per-backend allocation rules and
the precedence declared > named profile > probed > profile matched by name. Pure: every fact comes in
as a value (probe results, profiles, environment); it reads no files and runs nothing.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Generic, Literal, TypeVar

from safe_llama.device.backends import BackendRule, backend_rules
from safe_llama.device.list_devices import DeviceRequest, ListedDevices, LlamaDevice, backend_of
from safe_llama.device.probe_host import HostMemory
from safe_llama.device.probe_opencl import OpenCLDevice, OpenCLReport
from safe_llama.device.probe_sysfs import PciGpu, SysfsReport
from safe_llama.errors import ExitStatus, SafeLlamaError
from safe_llama.units import human

T = TypeVar("T")
Source = Literal["probed", "declared", "profile", "learned"]  # learned: read from a failed start's message
INTEL = 0x8086
INTEL_PLATFORM_VENDOR = "Intel(R) Corporation"  # OpenVINO's GPU plugin puts this platform first

# Variables that renumber one backend's devices, so that position no longer says which device is which.
RENUMBERING_ENV = (
    "CUDA_VISIBLE_DEVICES",
    "HIP_VISIBLE_DEVICES",
    "ROCR_VISIBLE_DEVICES",
    "GGML_VK_VISIBLE_DEVICES",
    "ONEAPI_DEVICE_SELECTOR",
    "ZE_AFFINITY_MASK",
)


@dataclass(frozen=True)
class Sourced(Generic[T]):
    """A value and where it came from: probed on this machine, declared on the command line, or a profile."""

    value: T
    source: Source
    detail: str


@dataclass(frozen=True)
class DeclaredLimits:
    """Limits the user states instead of (or over) what the probes see. Declared values always win."""

    profile: str | None = None  # a name in configs/devices/ (or ~/.config/safe-llama/devices/), or a path
    max_alloc_bytes: int | None = None
    memory_bytes: int | None = None
    integrated: bool | None = None
    host_memory_bytes: int | None = None  # the host budget, e.g. when planning for another machine
    origins: tuple[tuple[str, str], ...] = ()  # (setting, where it was set) when not its own option

    def origin(self, setting: str, option: str) -> str:
        return dict(self.origins).get(setting, option)


NOTHING_DECLARED = DeclaredLimits()


@dataclass(frozen=True)
class DeviceProfile:
    key: str  # file name without .toml
    path: str
    name: str
    match: tuple[str, ...]  # substrings of a device name this profile describes
    vendor_id: int | None
    backend: str | None
    integrated: bool | None
    max_alloc_bytes: int | None
    memory_bytes: int | None


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


HOST_LIMIT_KINDS = ("ram", "cgroup", "address space")


@dataclass(frozen=True)
class HostLimit:
    """One limit on the host side, and what it counts: "ram" (free RAM: what must stay resident),
    "cgroup" (what the kernel charges and cannot reclaim: anonymous and locked memory, not the page cache of
    mapped weights), "address space" (RLIMIT_AS: every mapping, the whole model file and untouched reserves)."""

    kind: str  # one of HOST_LIMIT_KINDS
    budget: Sourced[int]


@dataclass(frozen=True)
class HostBudget:
    total: Sourced[int]
    available: Sourced[int]
    cgroup_max: Sourced[int] | None  # None = no cgroup limit
    cgroup_current: Sourced[int] | None
    rlimit_as: Sourced[int] | None  # None = unlimited
    budget_bytes: Sourced[int]  # the smallest applicable figure; detail names it
    note: str
    limits: tuple[HostLimit, ...] = ()  # every limit that applies, each checked with its own accounting


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


def host_budget(host: HostMemory, declared: DeclaredLimits = NOTHING_DECLARED) -> HostBudget:
    """The memory a launched llama.cpp may use: available RAM, the cgroup's headroom and RLIMIT_AS, each a
    limit of its own kind (they count different things), the smallest shown as the budget; or the budget
    the user declared. Page cache the cgroup may reclaim counts as free, as the kernel drops it before an
    OOM kill (the working set, as kubelet counts it). Swap is not counted: a KV cache paged out to swap is
    read back for every token."""
    total = Sourced(host.total_bytes, "probed", f"{host.ram_source}: physical RAM (MemTotal)")
    available = Sourced(host.available_bytes, "probed", f"{host.ram_source}: MemAvailable")
    cgroup = host.cgroup
    cg_max = cg_cur = None
    limits = [HostLimit("ram", available)]
    if cgroup is not None:
        label = f"cgroup v{cgroup.version}"
        if cgroup.max_bytes is not None:
            file = "memory.max" if cgroup.version == 2 else "memory.limit_in_bytes"
            cg_max = Sourced(cgroup.max_bytes, "probed", f"{label} {file} in {cgroup.limit_dir}")
        if cgroup.current_bytes is not None:
            file = "memory.current" if cgroup.version == 2 else "memory.usage_in_bytes"
            cg_cur = Sourced(cgroup.current_bytes, "probed", f"{label} {file} in {cgroup.current_dir}")
        ceilings = []
        if cgroup.max_bytes is not None:
            ceilings.append((cgroup.max_bytes, "memory.max" if cgroup.version == 2 else "memory.limit_in_bytes"))
        if cgroup.high_bytes is not None:  # above memory.high the kernel reclaims and throttles hard
            ceilings.append((cgroup.high_bytes, "memory.high"))
        if ceilings:
            ceiling, file = min(ceilings)
            used = cgroup.current_bytes or 0
            reclaimable = min(cgroup.inactive_file_bytes or 0, used)
            limits.append(
                HostLimit(
                    "cgroup",
                    Sourced(
                        max(ceiling - (used - reclaimable), 0),
                        "probed",
                        f"{label} headroom: {file} - (usage - {human(reclaimable)} reclaimable page cache)",
                    ),
                )
            )
    rlimit = None
    if host.rlimit_as is not None:
        rlimit = Sourced(host.rlimit_as, "probed", "RLIMIT_AS (ulimit -v) of the whole llama.cpp process")
        limits.append(HostLimit("address space", rlimit))
    if declared.host_memory_bytes is not None:
        budget = Sourced(declared.host_memory_bytes, "declared", declared.origin("host_memory", "--host-memory"))
        limits = [HostLimit("ram", budget)]
    else:
        budget = min((limit.budget for limit in limits), key=lambda s: s.value)
    return HostBudget(
        total=total,
        available=available,
        cgroup_max=cg_max,
        cgroup_current=cg_cur,
        rlimit_as=rlimit,
        budget_bytes=budget,
        note=host.cgroup_note,
        limits=tuple(limits),
    )


# ------------------------------------------------------------------------------------- target mapping


def _normal(name: str) -> str:
    name = re.sub(r"\((r|tm)\)", "", name.lower())
    return " ".join(name.split())


def _is_gpu(device: OpenCLDevice) -> bool:
    return "GPU" in device.device_type.split("|")


def openvino_gpu_order(devices: Sequence[OpenCLDevice]) -> list[OpenCLDevice]:
    """OpenCL GPUs in the order OpenVINO's GPU plugin numbers them GPU.0, GPU.1, ...: the Intel platform
    first, then a stable sort putting Intel iGPUs, then Intel dGPUs, then other vendors' GPUs first
    (intel_gpu ocl_device_detector sort_platforms/sort_devices)."""
    gpus = [d for d in devices if _is_gpu(d)]
    gpus.sort(key=lambda d: d.platform_vendor != INTEL_PLATFORM_VENDOR)
    gpus.sort(key=lambda d: 0 if d.vendor_id == INTEL and d.host_unified_memory else 1 if d.vendor_id == INTEL else 2)
    return gpus


def _openvino_index(ov_device: str) -> int | None:
    """GPU -> 0 (OpenVINO's alias of GPU.0), GPU.1 -> 1, GPU.1.0 (a tile) -> 1."""
    match = re.fullmatch(r"GPU(?:\.(\d+)(?:\.\d+)?)?", ov_device)
    if not match:
        return None
    return int(match.group(1) or 0)


def _match_by_name(
    hardware_name: str, index: int | None, candidates: Sequence[OpenCLDevice], env: Mapping[str, str]
) -> tuple[OpenCLDevice | None, str]:
    wanted = _normal(hardware_name)
    exact = [d for d in candidates if _normal(d.name) == wanted]
    similar = exact or [
        d for d in candidates if wanted.startswith(_normal(d.name)) or _normal(d.name).startswith(wanted)
    ]
    if len(similar) == 1:
        how = "same name" if exact else "name prefix"
        return similar[0], f"matched the OpenCL device '{similar[0].name}' by {how}"
    if not similar:
        return None, f"no OpenCL device is named like '{hardware_name}'"
    renumbered = [name for name in RENUMBERING_ENV if env.get(name)]
    if renumbered:
        return None, (
            f"{len(similar)} OpenCL devices are named '{similar[0].name}' and {', '.join(renumbered)} "
            "renumbers the backend's devices: cannot tell which one"
        )
    if index is None or index >= len(similar) or any(d.pci_bdf is None for d in similar):
        return None, f"{len(similar)} OpenCL devices are named '{similar[0].name}': cannot tell which one"
    chosen = sorted(similar, key=lambda d: d.pci_bdf or "")[index]
    return chosen, (
        f"matched by position {index} among {len(similar)} identical devices in PCI order "
        "(assumes the backend numbers them in PCI order too)"
    )


def _profile_for(name: str, profiles: Sequence[DeviceProfile]) -> DeviceProfile | None:
    wanted = _normal(name)
    for profile in profiles:
        if any(_normal(m) in wanted for m in profile.match):
            return profile
    return None


@dataclass(frozen=True)
class _Choice:
    llama: LlamaDevice | None
    llama_name: str | None
    backend: str
    backend_device: str | None
    description: str
    requested_by: str
    notes: tuple[str, ...] = ()
    warnings: tuple[str, ...] = ()


def _host_cpu(requested_by: str, why: str) -> _Choice:
    return _Choice(None, None, "cpu", None, "host CPU", requested_by, notes=(why,))


def _choose_llama_device(
    request: DeviceRequest, listed: ListedDevices | None, profile: DeviceProfile | None
) -> _Choice:
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
            if request.openvino_device and chosen.backend == "openvino":
                requested_by = "GGML_OPENVINO_DEVICE"
            offload = ", ".join(d.name for d in usable)
            notes.append(f"no --device: llama.cpp offloads to {offload}; {chosen.name} is the first")
    if chosen is not None:
        if chosen.backend == "openvino" and chosen.selected is False:
            selected = next((d.openvino_device for d in devices if d.selected), "another")
            warnings.append(
                f"{chosen.name} is GGML_OPENVINO_DEVICE={chosen.openvino_device}, but the selected OpenVINO "
                f"device is {selected}: llama.cpp aborts ('not the selected OpenVINO device'); "
                f"set GGML_OPENVINO_DEVICE={chosen.openvino_device}"
            )
        return _Choice(
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
        return _Choice(None, name, backend, ov if backend == "openvino" else None, name, requested_by, **said)
    if ov:
        return _Choice(None, None, "openvino", ov, f"OpenVINO {ov}", "GGML_OPENVINO_DEVICE", **said)
    if profile is not None and profile.backend:
        ov_default = "GPU" if profile.backend == "openvino" else None
        return _Choice(None, None, profile.backend, ov_default, profile.name, "profile", **said)
    return _Choice(None, None, "unknown", None, "unknown", "default", **said)


def _rule_for(rules: Mapping[str, BackendRule], backend: str, backend_device: str | None) -> BackendRule | None:
    if backend == "openvino":
        kind = re.match(r"[A-Z]+", backend_device or "CPU")
        return rules.get(f"openvino:{kind.group(0) if kind else 'CPU'}")
    return rules.get(backend)


def _match_opencl(
    choice: _Choice, rule: BackendRule | None, opencl: OpenCLReport, env: Mapping[str, str]
) -> tuple[OpenCLDevice | None, str]:
    if rule is None or choice.backend == "cpu" or (choice.backend == "openvino" and rule.alloc_limit == "none"):
        return None, ""
    if not opencl.devices:
        return None, f"OpenCL shows no device ({opencl.note})"
    gpus = [d for d in opencl.devices if _is_gpu(d) and (not rule.vendor_ids or d.vendor_id in rule.vendor_ids)]
    if choice.backend == "openvino":
        index = _openvino_index(choice.backend_device or "GPU")
        order = openvino_gpu_order(opencl.devices)
        if index is None or index >= len(order):
            return None, (
                f"OpenVINO {choice.backend_device} has no OpenCL counterpart: OpenCL shows {len(order)} GPU(s)"
            )
        by_order = order[index]
        how = f"OpenVINO {choice.backend_device} is OpenCL GPU #{index} in OpenVINO's order (Intel iGPU first)"
        if choice.llama is not None and not _normal(choice.description).startswith(_normal(by_order.name)):
            return None, (
                f"{how}, '{by_order.name}', but OpenVINO calls it '{choice.description}': "
                "not the same device, no mapping"
            )
        return by_order, how
    if not gpus:
        return None, "OpenCL shows no GPU from this backend's vendor"
    index = choice.llama.index if choice.llama is not None else None
    device, how = _match_by_name(choice.description, index, gpus, env)
    if device is None and len(gpus) == 1 and rule.vendor_ids:
        return gpus[0], f"{how}; took the only OpenCL GPU of the vendor, '{gpus[0].name}'"
    return device, how


def _match_pci(
    opencl: OpenCLDevice | None,
    choice: _Choice,
    rule: BackendRule | None,
    sysfs: SysfsReport,
    profile: DeviceProfile | None,
) -> tuple[PciGpu | None, str]:
    compute = [g for g in sysfs.gpus if g.compute]
    if opencl is not None and opencl.pci_bdf is not None:
        found = next((g for g in sysfs.gpus if g.bdf == opencl.pci_bdf), None)
        return found, f"PCI {opencl.pci_bdf} from OpenCL (cl_khr_pci_bus_info)"
    if choice.backend in ("cpu", "unknown") or (
        rule is not None and rule.alloc_limit == "none" and choice.backend == "openvino"
    ):
        return None, ""
    vendor = (
        opencl.vendor_id
        if opencl is not None
        else rule.vendor_ids[0]
        if rule is not None and rule.vendor_ids
        else profile.vendor_id
        if profile is not None
        else None
    )
    same_vendor = [g for g in compute if vendor is None or g.vendor_id == vendor]
    if len(same_vendor) == 1:
        return same_vendor[0], f"PCI {same_vendor[0].bdf}: the only {same_vendor[0].vendor} GPU in sysfs"
    if choice.backend == "openvino" and _openvino_index(choice.backend_device or "") == 0:
        igpu = next((g for g in same_vendor if g.integrated), None)
        if igpu is not None:
            return igpu, f"PCI {igpu.bdf}: OpenVINO numbers an Intel iGPU GPU.0"
    return None, f"PCI address unknown ({len(same_vendor)} candidate GPU(s) in sysfs)"


def _neo_filter(
    backend: str,
    opencl: OpenCLDevice | None,
    pci: PciGpu | None,
    bdf: str | None,
    sysfs: SysfsReport,
    opencl_report: OpenCLReport,
    env: Mapping[str, str],
) -> tuple[dict[str, str], str, tuple[str, ...]]:
    """Intel's compute runtime shows only the GPU whose /dev/dri/by-path name contains FilterBdfPath
    (with NEOReadDebugKeys=1). With another GPU present, that is what pins llama.cpp to the target."""
    intel = (opencl is not None and opencl.vendor_id == INTEL) or (pci is not None and pci.vendor_id == INTEL)
    if backend not in ("openvino", "sycl", "opencl") or not intel:
        return {}, "", ()
    others = [g for g in sysfs.gpus if g.compute and g.bdf != bdf]
    opencl_gpus = [d for d in opencl_report.devices if _is_gpu(d)]
    if not others and len(opencl_gpus) <= 1:
        return {}, "NEO filter not needed: this is the only GPU", ()
    if bdf is None:
        return (
            {},
            "",
            ("several GPUs, but the target's PCI address is unknown: cannot suggest FilterBdfPath",),
        )
    suggestion = {"NEOReadDebugKeys": "1", "FilterBdfPath": bdf}
    note = f"NEO filter: only {bdf} stays visible to Intel's runtime"
    if backend == "openvino":
        if any(d.vendor_id != INTEL for d in opencl_gpus):
            note += (
                "; OpenVINO may still list another vendor's GPU, so check --list-devices for the "
                "GGML_OPENVINO_DEVICE id the target gets"
            )
        else:
            suggestion["GGML_OPENVINO_DEVICE"] = "GPU"
            note += "; it is then OpenVINO's only GPU, named GPU"
    warnings: tuple[str, ...] = ()
    current = env.get("FilterBdfPath")
    if current and env.get("NEOReadDebugKeys") == "1" and current not in bdf:
        warnings = (f"FilterBdfPath={current} is set and hides the target {bdf}",)
    elif current and current in bdf:
        note += " (already set in the environment)"
    return suggestion, note, warnings


def _max_alloc(
    rule: BackendRule | None,
    cl_device: OpenCLDevice | None,
    declared: DeclaredLimits,
    profile: DeviceProfile | None,
    matched: DeviceProfile | None,
) -> tuple[bool, Sourced[int] | None]:
    """Whether a per-allocation limit applies, and its value."""
    if declared.max_alloc_bytes is not None:
        return True, Sourced(declared.max_alloc_bytes, "declared", declared.origin("max_alloc", "--max-alloc"))
    if profile is not None and profile.max_alloc_bytes is not None:
        return True, Sourced(profile.max_alloc_bytes, "profile", profile.path)
    if rule is None or rule.alloc_limit == "none":
        return False, None
    if rule.alloc_limit == "opencl" and cl_device is not None:
        detail = f"OpenCL CL_DEVICE_MAX_MEM_ALLOC_SIZE of '{cl_device.name}' ({cl_device.platform})"
        return True, Sourced(cl_device.max_mem_alloc_size, "probed", detail)
    if matched is not None and matched.max_alloc_bytes is not None:
        return True, Sourced(matched.max_alloc_bytes, "profile", f"{matched.path} (matched by name)")
    return True, None


def _memory(
    choice: _Choice,
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
    choice: _Choice,
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
    openvino_kind = re.search(r"\((i|d)GPU\)\s*$", choice.description) if choice.backend == "openvino" else None
    if openvino_kind:
        return Sourced(openvino_kind.group(1) == "i", "probed", "OpenVINO's device name (iGPU/dGPU)")
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
    env: Mapping[str, str] = os.environ,
    rules: Mapping[str, BackendRule] | None = None,
) -> TargetDevice:
    """The device a request lands on and its limits: declared > profile given by name > probed > a profile
    matched by device name. Pure: every fact comes in as a value (`rules`: configs/backends.toml as
    `devices.backend_rules` reads it; None reads the packaged file)."""
    if rules is None:
        rules = backend_rules({})
    choice = _choose_llama_device(request, listed, profile)
    rule = _rule_for(rules, choice.backend, choice.backend_device)
    notes = list(choice.notes)
    warnings = list(choice.warnings)
    cl_device, how = _match_opencl(choice, rule, opencl, env)
    pci, pci_how = _match_pci(cl_device, choice, rule, sysfs, profile)
    notes.extend(note for note in (how, pci_how) if note)
    bdf = cl_device.pci_bdf if cl_device is not None and cl_device.pci_bdf else pci.bdf if pci else None
    on_host = choice.backend == "cpu" or (choice.backend == "openvino" and (choice.backend_device or "CPU") == "CPU")
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

    limits_alloc, max_alloc = _max_alloc(rule, cl_device, declared, profile, matched)
    if limits_alloc and max_alloc is None:
        warnings.append("the per-allocation limit of this device is unknown: declare --max-alloc or --profile")
    integrated = _integrated(choice, on_host, cl_device, pci, declared, profile, matched)
    npu = choice.backend == "openvino" and (choice.backend_device or "").startswith("NPU")
    neo, neo_note, neo_warnings = _neo_filter(choice.backend, cl_device, pci, bdf, sysfs, opencl, env)
    if neo_note:
        notes.append(neo_note)
    warnings.extend(neo_warnings)
    free = None
    if choice.llama is not None:
        free = Sourced(choice.llama.free_bytes, "probed", "llama.cpp --list-devices free, when it was run")
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
        shares_host_memory=on_host or npu or (integrated is not None and integrated.value),
        neo_filter=neo,
        mapping_note="; ".join(notes),
        warnings=tuple(warnings),
    )
