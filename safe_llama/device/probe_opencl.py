"""OpenCL devices through pyopencl: the limits a GPU's driver enforces (CL_DEVICE_MAX_MEM_ALLOC_SIZE, ...).

Owns the only pyopencl import (lazy: it costs a quarter of a second), the ctypes call for
cl_khr_pci_bus_info, and running the probe in a child Python (a crashing ICD must not take safe-llama
down). Must not raise when OpenCL is missing or broken: the report says what it saw and why it saw
nothing. Must not decide which device llama.cpp uses (target_device does).
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from safe_llama import state
from safe_llama.cmdline import env_scan
from safe_llama.errors import SafeLlamaError

if TYPE_CHECKING:
    import ctypes  # imported where a probe runs: a cached launch never loads it

CL_DEVICE_PCI_BUS_INFO_KHR = 0x410F  # cl_khr_pci_bus_info: struct { cl_uint domain, bus, device, function; }
RESULT_MARK = "safe-llama-opencl-report "  # drivers may print on stdout too; our line is marked
CL_DEVICE_TYPES = ((2, "CPU"), (4, "GPU"), (8, "ACCELERATOR"), (16, "CUSTOM"))
DEFAULT_VENDOR_DIRS = ("/etc/OpenCL/vendors",)

# Environment variables that change which OpenCL devices exist or what they report. A cached probe is
# only valid for the same values (POCL_MEMORY_LIMIT, for one, changes pocl's limits).
ENV_PREFIXES = (
    "OCL_ICD",
    "OPENCL_",
    "POCL_",
    "NEOReadDebugKeys",
    "FilterBdfPath",
    "ZE_",
    "CUDA_VISIBLE",
    "ROC",
    "HIP_VISIBLE",
    "GPU_DEVICE_ORDINAL",
    "RUSTICL_",
    "CLOVER_",
)


@dataclass(frozen=True)
class OpenCLDevice:
    """One OpenCL device as its ICD reports it: names, type and memory limits."""

    platform: str  # platform name
    platform_vendor: str
    name: str
    vendor: str
    vendor_id: int
    device_type: str  # GPU, CPU, ACCELERATOR, CUSTOM (joined with "|" when several)
    max_mem_alloc_size: int  # CL_DEVICE_MAX_MEM_ALLOC_SIZE: the largest single buffer
    global_mem_size: int
    host_unified_memory: bool | None  # True = integrated (shares host RAM); None = the driver would not say
    driver_version: str
    device_version: str
    pci_bdf: str | None  # from cl_khr_pci_bus_info; None = unknown
    pci_note: str  # how the address was found, or why it is unknown


@dataclass(frozen=True)
class OpenCLReport:
    """The OpenCL devices found, or why none were."""

    devices: tuple[OpenCLDevice, ...]
    status: str  # "ok", "no-pyopencl", "no-platforms", "no-devices", "error"
    note: str  # what was seen; when nothing, why


def _type_name(mask: int) -> str:
    names = [name for bit, name in CL_DEVICE_TYPES if mask & bit]
    return "|".join(names) or f"0x{mask:x}"


def _vendor_dirs(env: Mapping[str, str]) -> list[Path]:
    """Where an ICD loader looks for *.icd files (ocl-icd and the Khronos loader honour these)."""
    for name in ("OCL_ICD_VENDORS", "OPENCL_VENDOR_PATH"):
        if env.get(name):
            return [Path(env[name])]
    return [Path(d) for d in DEFAULT_VENDOR_DIRS] + [Path(sys.prefix) / "etc" / "OpenCL" / "vendors"]


def _icd_files(env: Mapping[str, str]) -> list[Path]:
    files: list[Path] = []
    for directory in _vendor_dirs(env):
        if directory.is_file():
            files.append(directory)
        elif directory.is_dir():
            files.extend(sorted(p for p in directory.iterdir() if p.suffix == ".icd"))
    return files


def _stat_text(path: Path) -> str:
    try:
        st = path.stat()
    except OSError:
        return f"{path}:missing"
    return f"{path}:{st.st_size}:{st.st_mtime_ns}"


def fingerprint(env: Mapping[str, str]) -> str:
    """A key that changes when the OpenCL set-up may have changed: the ICD files and the libraries they
    name, the dynamic linker cache (rewritten whenever a package installs a library), pyopencl itself, the
    boot (a kernel driver update needs one) and the environment variables ICDs read. Costs a few stats."""
    parts = [_stat_text(Path("/etc/ld.so.cache"))]
    boot_id = Path("/proc/sys/kernel/random/boot_id")
    parts.append(boot_id.read_text().strip() if boot_id.is_file() else "no-boot-id")
    for icd in _icd_files(env):
        parts.append(_stat_text(icd))
        try:
            library = icd.read_text().strip()
        except OSError:
            continue
        if library.startswith("/"):
            parts.append(_stat_text(Path(library)))
    import importlib.util  # a fingerprint is taken only where a GPU is listed or seen

    spec = importlib.util.find_spec("pyopencl")
    if spec is not None and spec.origin:
        package = Path(spec.origin).parent
        parts.extend(_stat_text(p) for p in sorted(package.glob("_cl*.so")))
    parts.extend(f"{k}={v}" for k, v in sorted(env_scan.prefixed(env, ENV_PREFIXES).items()))
    return state.digest("\n".join(parts))


def opencl_library() -> ctypes.CDLL | None:
    """The ICD loader pyopencl itself loaded (a wheel bundles its own), so handles are the same loader's."""
    import ctypes

    try:
        with Path("/proc/self/maps").open() as maps:
            loaded = sorted({line.split()[-1] for line in maps if "libOpenCL" in line and "/" in line})
    except OSError:
        loaded = []
    for candidate in [*loaded, "libOpenCL.so.1"]:
        try:
            return ctypes.CDLL(candidate)
        except OSError:
            continue
    return None


def pci_bus_info(library: ctypes.CDLL, device_ptr: int) -> tuple[str | None, str]:
    """clGetDeviceInfo(CL_DEVICE_PCI_BUS_INFO_KHR) through ctypes: pyopencl has no attribute for it."""
    import ctypes

    get_info = library.clGetDeviceInfo
    get_info.restype = ctypes.c_int32
    get_info.argtypes = [
        ctypes.c_void_p,
        ctypes.c_uint32,
        ctypes.c_size_t,
        ctypes.c_void_p,
        ctypes.POINTER(ctypes.c_size_t),
    ]
    info = (ctypes.c_uint32 * 4)()
    size = ctypes.c_size_t(0)
    err = get_info(
        ctypes.c_void_p(device_ptr),
        CL_DEVICE_PCI_BUS_INFO_KHR,
        ctypes.sizeof(info),
        ctypes.byref(info),
        ctypes.byref(size),
    )
    if err != 0 or size.value != ctypes.sizeof(info):
        return None, f"clGetDeviceInfo(CL_DEVICE_PCI_BUS_INFO_KHR) failed: error {err}"
    domain, bus, device, function = info
    return f"{domain:04x}:{bus:02x}:{device:02x}.{function:x}", "cl_khr_pci_bus_info"


def _why_no_platforms(env: Mapping[str, str]) -> str:
    import ctypes

    dirs = ", ".join(str(d) for d in _vendor_dirs(env))
    icds = _icd_files(env)
    if not icds:
        return f"no OpenCL platform: no *.icd file in {dirs} (no OpenCL driver installed)"
    reasons = []
    for icd in icds:
        try:
            library = icd.read_text().strip()
        except OSError as err:
            reasons.append(f"{icd.name}: unreadable ({err.strerror})")
            continue
        try:
            ctypes.CDLL(library)
        except OSError as err:
            reasons.append(f"{icd.name} names {library}, which does not load ({err})")
        else:
            reasons.append(f"{icd.name} ({library}) loads but offers no platform")
    return "no OpenCL platform: " + "; ".join(reasons)


def probe_opencl(env: Mapping[str, str]) -> OpenCLReport:
    """Every platform and device pyopencl sees. Never raises: failures are in status and note.

    `env` only explains failures (which vendor directories were read); the ICD loader and the drivers
    read this process's real environment.
    """
    try:
        import pyopencl as cl
    except ImportError as err:
        return OpenCLReport(devices=(), status="no-pyopencl", note=f"pyopencl is not importable: {err}")
    try:
        platforms = cl.get_platforms()
    except cl.Error as err:
        if getattr(err, "code", None) == -1001:  # CL_PLATFORM_NOT_FOUND_KHR: the loader found no ICD
            return OpenCLReport(devices=(), status="no-platforms", note=_why_no_platforms(env))
        return OpenCLReport(devices=(), status="error", note=f"clGetPlatformIDs failed: {err}")
    library = opencl_library()
    devices: list[OpenCLDevice] = []
    problems: list[str] = []
    for platform in platforms:
        try:
            platform_devices = platform.get_devices()
        except cl.Error as err:  # CL_DEVICE_NOT_FOUND and broken drivers alike: skip this platform only
            problems.append(f"{platform.name}: {err}")
            continue
        for device in platform_devices:
            try:
                devices.append(_device(cl, platform, device, library))
            except cl.Error as err:
                problems.append(f"{platform.name}/{device.name}: {err}")
    names = ", ".join(sorted({p.name for p in platforms}))
    note = f"{len(devices)} device(s) on {len(platforms)} platform(s): {names}"
    if problems:
        note += "; skipped: " + "; ".join(problems)
    return OpenCLReport(devices=tuple(devices), status="ok" if devices else "no-devices", note=note)


def _device(cl: Any, platform: Any, device: Any, library: ctypes.CDLL | None) -> OpenCLDevice:
    try:
        unified: bool | None = bool(device.host_unified_memory)
    except cl.Error:  # deprecated since OpenCL 2.0; some drivers refuse it
        unified = None
    if "cl_khr_pci_bus_info" not in device.extensions.split():
        bdf, pci_note = None, "the driver lacks cl_khr_pci_bus_info"
    elif library is None:
        bdf, pci_note = None, "no libOpenCL to call clGetDeviceInfo through"
    else:
        bdf, pci_note = pci_bus_info(library, device.int_ptr)
    return OpenCLDevice(
        platform=platform.name,
        platform_vendor=platform.vendor,
        name=device.name.strip(),
        vendor=device.vendor.strip(),
        vendor_id=int(device.vendor_id),
        device_type=_type_name(int(device.type)),
        max_mem_alloc_size=int(device.max_mem_alloc_size),
        global_mem_size=int(device.global_mem_size),
        host_unified_memory=unified,
        driver_version=device.driver_version.strip(),
        device_version=device.version.strip(),
        pci_bdf=bdf,
        pci_note=pci_note,
    )


def report_to_dict(report: OpenCLReport) -> dict[str, Any]:
    return asdict(report)


def report_from_dict(data: Mapping[str, Any]) -> OpenCLReport:
    return OpenCLReport(
        devices=tuple(OpenCLDevice(**d) for d in data["devices"]),
        status=str(data["status"]),
        note=str(data["note"]),
    )


def probe_opencl_isolated(env: Mapping[str, str], *, timeout: float = 60.0) -> OpenCLReport:
    """probe_opencl in a child Python. A broken driver that crashes or hangs cannot take safe-llama with
    it, and the ICDs read `env` (pocl reads POCL_MEMORY_LIMIT when it loads, NEO its debug keys)."""
    try:
        from safe_llama.device.proc import run_module  # only a probe that runs (a cache miss) needs it

        captured = run_module("safe_llama.device.probe_opencl", env_scan.whole(env), timeout=timeout)
    except SafeLlamaError as err:
        return OpenCLReport(devices=(), status="error", note=f"could not start the OpenCL probe: {err}")
    if captured.timed_out:
        return OpenCLReport(
            devices=(), status="error", note=f"the OpenCL probe hung for {timeout:.0f} s (a stuck driver?)"
        )
    if captured.returncode < 0:
        return OpenCLReport(
            devices=(),
            status="error",
            note=f"the OpenCL probe died of signal {-captured.returncode} (a broken OpenCL driver?)",
        )
    marked = [line for line in captured.stdout.splitlines() if line.startswith(RESULT_MARK)]
    try:
        return report_from_dict(json.loads(marked[-1][len(RESULT_MARK) :]))
    except (IndexError, ValueError, KeyError, TypeError):
        last = (captured.stderr.strip().splitlines() or ["no output"])[-1]
        return OpenCLReport(
            devices=(),
            status="error",
            note=f"the OpenCL probe exited {captured.returncode} without a report: {last}",
        )


def main(env: Mapping[str, str]) -> int:
    """`python -m safe_llama.device.probe_opencl`: print one marked JSON line (what probe_opencl_isolated reads)."""
    sys.stdout.write(RESULT_MARK + json.dumps(report_to_dict(probe_opencl(env))) + "\n")
    return 0


if __name__ == "__main__":  # the probe's own process: its environment is its input
    sys.exit(main(os.environ))
