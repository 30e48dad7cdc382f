"""Which OpenCL device and which PCI GPU are the one llama.cpp will use (by name, by OpenVINO's GPU order, by
bus address), and the NEO filter variables that make only that Intel GPU visible.

Owns that matching of probed facts; must not probe nor decide limits (target_device does)."""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence

from safe_llama.backends.backend import AllocRule
from safe_llama.backends.registry import RENUMBERING_ENV, backend_named
from safe_llama.device.limits import INTEL, INTEL_PLATFORM_VENDOR, Choice, DeviceProfile
from safe_llama.device.probe_opencl import OpenCLDevice, OpenCLReport
from safe_llama.device.probe_sysfs import PciGpu, SysfsReport


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


def _no_gpu(choice: Choice, rule: AllocRule | None) -> bool:
    """The device is no GPU to look for: the host itself, or a kind of device an uncapped backend that drives
    several kinds has no GPU behind (OpenVINO's CPU, its NPU)."""
    backend = backend_named(choice.backend)
    kind = backend.kind(choice.backend_device)
    uncapped_kind = bool(kind) and rule is not None and rule.alloc_limit == "none"
    return kind in backend.host_kinds or uncapped_kind


def _match_opencl(
    choice: Choice, rule: AllocRule | None, opencl: OpenCLReport, env: Mapping[str, str]
) -> tuple[OpenCLDevice | None, str]:
    if rule is None or _no_gpu(choice, rule):
        return None, ""
    if not opencl.devices:
        return None, f"OpenCL shows no device ({opencl.note})"
    gpus = [d for d in opencl.devices if _is_gpu(d) and (not rule.vendor_ids or d.vendor_id in rule.vendor_ids)]
    if backend_named(choice.backend).igpu_first:
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
    choice: Choice,
    rule: AllocRule | None,
    sysfs: SysfsReport,
    profile: DeviceProfile | None,
) -> tuple[PciGpu | None, str]:
    compute = [g for g in sysfs.gpus if g.compute]
    if opencl is not None and opencl.pci_bdf is not None:
        found = next((g for g in sysfs.gpus if g.bdf == opencl.pci_bdf), None)
        return found, f"PCI {opencl.pci_bdf} from OpenCL (cl_khr_pci_bus_info)"
    if choice.backend == "unknown" or _no_gpu(choice, rule):
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
    if backend_named(choice.backend).igpu_first and _openvino_index(choice.backend_device or "") == 0:
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
    if not backend_named(backend).intel_runtime or not intel:
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
    own_device_env = backend_named(backend).own_device_env
    if own_device_env:
        if any(d.vendor_id != INTEL for d in opencl_gpus):
            note += (
                "; OpenVINO may still list another vendor's GPU, so check --list-devices for the "
                "GGML_OPENVINO_DEVICE id the target gets"
            )
        else:
            suggestion[own_device_env] = "GPU"
            note += "; it is then OpenVINO's only GPU, named GPU"
    warnings: tuple[str, ...] = ()
    current = env.get("FilterBdfPath")
    if current and env.get("NEOReadDebugKeys") == "1" and current not in bdf:
        warnings = (f"FilterBdfPath={current} is set and hides the target {bdf}",)
    elif current and current in bdf:
        note += " (already set in the environment)"
    return suggestion, note, warnings
