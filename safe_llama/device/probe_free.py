"""Free device memory now, from each vendor's own interface: NVIDIA's NVML (libnvidia-ml through ctypes) and
amdgpu's sysfs counters. Read at every launch and again before a retry: another program's memory comes and goes.

Owns those reads and their raw values (one FreeReading per GPU, with its PCI address and source); must not
decide which GPU llama.cpp uses (target_device matches a reading to the target) nor cache anything."""

from __future__ import annotations

import json
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from safe_llama.backends.registry import backend_named
from safe_llama.device.limits import NVIDIA
from safe_llama.device.llama_listing import ListedDevices
from safe_llama.device.probe_sysfs import SysfsReport
from safe_llama.device.vendor_free import NVML_LIBRARY, NVML_TIMEOUT


@dataclass(frozen=True)
class FreeReading:
    """One GPU's memory as its driver reports it now."""

    source: str  # "nvml" or "amdgpu sysfs"
    index: int  # the vendor's own index: NVML's (PCI order), or the position among amdgpu devices
    name: str  # NVML's device name; amdgpu: the PCI address
    pci_bdf: str | None  # 0000:00:06.0, lower case, 4-digit domain (sysfs' form)
    uuid: str | None  # NVML's GPU-... (CUDA_VISIBLE_DEVICES may name it)
    total_bytes: int
    free_bytes: int
    # what each process holds on it (pid, bytes), as NVML reports them; None: no per-process figure
    processes: tuple[tuple[int, int], ...] | None = None

    def to_dict(self) -> dict[str, object]:
        extra = {} if self.processes is None else {"processes": [list(p) for p in self.processes]}
        return extra | {
            "source": self.source,
            "index": self.index,
            "name": self.name,
            "pci_bdf": self.pci_bdf,
            "uuid": self.uuid,
            "total_bytes": self.total_bytes,
            "free_bytes": self.free_bytes,
        }


@dataclass(frozen=True)
class FreeReport:
    """The vendors' free-memory readings taken now, and what answered."""

    readings: tuple[FreeReading, ...]
    driver: str | None  # NVML's driver version, when NVML answered
    note: str  # what was asked and what answered, for `devices`


NO_READINGS = FreeReport((), None, "")


def reading_from_dict(data: Mapping[str, object]) -> FreeReading:
    def text(key: str) -> str | None:
        value = data.get(key)
        return str(value) if value is not None else None

    return FreeReading(
        source=str(data["source"]),
        index=int(str(data["index"])),
        name=str(data["name"]),
        pci_bdf=text("pci_bdf"),
        uuid=text("uuid"),
        total_bytes=int(str(data["total_bytes"])),
        free_bytes=int(str(data["free_bytes"])),
        processes=_processes(data.get("processes")),
    )


MOST_PROCESSES = 1024  # per GPU: more are not read


def _processes(value: object) -> tuple[tuple[int, int], ...] | None:
    if not isinstance(value, list):
        return None
    out = []
    for item in value[:MOST_PROCESSES]:
        if not (isinstance(item, list) and len(item) == 2 and all(isinstance(x, int) and x >= 0 for x in item)):
            return None
        out.append((int(item[0]), int(item[1])))
    return tuple(out)


NOT_AVAILABLE = 0xFFFFFFFFFFFFFFFF  # NVML_VALUE_NOT_AVAILABLE: a process whose use NVML cannot tell


def _nvml_processes(nvml: Any, handle: Any) -> tuple[tuple[int, int], ...] | None:
    """What each process holds on the GPU (CUDA's and graphics', Vulkan's, added up by pid); None when NVML
    cannot say (an old driver, a process whose use is not available). ctypes is imported here, as in read_nvml."""
    import ctypes

    class ProcessInfo(ctypes.Structure):  # nvmlProcessInfo_t (nvml.h, the _v3 queries)
        _fields_ = [
            ("pid", ctypes.c_uint),
            ("usedGpuMemory", ctypes.c_ulonglong),
            ("gpuInstanceId", ctypes.c_uint),
            ("computeInstanceId", ctypes.c_uint),
        ]

    held: dict[int, int] = {}
    for name in ("nvmlDeviceGetComputeRunningProcesses_v3", "nvmlDeviceGetGraphicsRunningProcesses_v3"):
        query = getattr(nvml, name, None)
        if query is None:
            return None
        infos = (ProcessInfo * 64)()
        count = ctypes.c_uint(64)
        if query(handle, ctypes.byref(count), infos) != 0:
            return None
        for info in infos[: min(count.value, 64)]:
            if info.usedGpuMemory == NOT_AVAILABLE:
                return None
            held[int(info.pid)] = held.get(int(info.pid), 0) + int(info.usedGpuMemory)
    return tuple(sorted(held.items()))


def normal_bdf(text: str) -> str:
    """NVML's "00000000:00:06.0" as sysfs writes it: "0000:00:06.0"."""
    domain, _, rest = text.strip().lower().rpartition(":")
    domain, _, bus = domain.rpartition(":") if domain.count(":") else ("", "", domain)
    return f"{int(domain or '0', 16):04x}:{bus}:{rest}" if bus else text.strip().lower()


def read_nvml(library: str = NVML_LIBRARY, *, shutdown: bool = True) -> FreeReport:
    """Every NVIDIA GPU's total and free memory through NVML. No NVIDIA driver: no readings, and why.
    shutdown False: leave NVML open (a process that exits right after: nvmlShutdown took 17 ms on an H200).
    ctypes is imported here: a machine without an NVIDIA GPU never reads NVML, and a plan goes without it."""
    import ctypes

    class Memory(ctypes.Structure):  # nvmlMemory_t
        _fields_ = [("total", ctypes.c_ulonglong), ("free", ctypes.c_ulonglong), ("used", ctypes.c_ulonglong)]

    class PciInfo(ctypes.Structure):  # nvmlPciInfo_t (nvml.h): the v3 query fills it
        _fields_ = [
            ("busIdLegacy", ctypes.c_char * 16),
            ("domain", ctypes.c_uint),
            ("bus", ctypes.c_uint),
            ("device", ctypes.c_uint),
            ("pciDeviceId", ctypes.c_uint),
            ("pciSubSystemId", ctypes.c_uint),
            ("busId", ctypes.c_char * 32),
        ]

    try:
        nvml = ctypes.CDLL(library)
    except OSError:
        return FreeReport((), None, f"NVML: {library} not found (no NVIDIA driver)")
    if nvml.nvmlInit_v2() != 0:
        return FreeReport((), None, "NVML: nvmlInit failed (the NVIDIA driver is not loaded)")
    try:
        version = ctypes.create_string_buffer(80)
        driver = version.value.decode() if nvml.nvmlSystemGetDriverVersion(version, 80) == 0 else None
        count = ctypes.c_uint(0)
        if nvml.nvmlDeviceGetCount_v2(ctypes.byref(count)) != 0:
            return FreeReport((), driver, "NVML: the device count could not be read")
        readings = []
        for index in range(count.value):
            handle = ctypes.c_void_p()
            memory = Memory()
            if nvml.nvmlDeviceGetHandleByIndex_v2(index, ctypes.byref(handle)) != 0:
                continue
            if nvml.nvmlDeviceGetMemoryInfo(handle, ctypes.byref(memory)) != 0:
                continue
            name = ctypes.create_string_buffer(96)
            uuid = ctypes.create_string_buffer(96)
            pci = PciInfo()
            readings.append(
                FreeReading(
                    source="nvml",
                    index=index,
                    name=name.value.decode(errors="replace") if nvml.nvmlDeviceGetName(handle, name, 96) == 0 else "",
                    pci_bdf=normal_bdf(pci.busId.decode())
                    if nvml.nvmlDeviceGetPciInfo_v3(handle, ctypes.byref(pci)) == 0
                    else None,
                    uuid=uuid.value.decode() if nvml.nvmlDeviceGetUUID(handle, uuid, 96) == 0 else None,
                    total_bytes=int(memory.total),
                    free_bytes=int(memory.free),
                    processes=_nvml_processes(nvml, handle),
                )
            )
        return FreeReport(tuple(readings), driver, f"NVML (driver {driver}): {len(readings)} GPU(s)")
    finally:
        if shutdown:
            nvml.nvmlShutdown()


class NvmlRead:
    """read_nvml running in a forked child, started early and collected when the plan needs it: NVML's own
    start (nvmlInit, about 20 ms on an H200) then overlaps safe-llama's imports and probes instead of adding
    to them. NVML starts threads of its own that outlive nvmlShutdown; in the supervisor they would take
    signals meant for its signalfd (a SIGCHLD lost there leaves a dead child unreaped): the child keeps them."""

    def __init__(self, library: str = NVML_LIBRARY) -> None:
        self._read_end, write_end = os.pipe()
        self.pid = os.fork()  # the child's
        self._open = True  # until its result is taken or it is cancelled
        if self.pid == 0:  # the child: read, write the report, leave at once (no atexit, no parent buffers)
            try:
                os.close(self._read_end)
                report = read_nvml(library, shutdown=False)
                data = {
                    "readings": [r.to_dict() for r in report.readings],
                    "driver": report.driver,
                    "note": report.note,
                }
                os.write(write_end, json.dumps(data).encode())
            finally:
                os._exit(0)
        os.close(write_end)

    def result(self, timeout: float = NVML_TIMEOUT) -> FreeReport:
        """The child's report (waiting at most timeout seconds for it); the child is reaped."""
        import select
        import signal

        if not self._open:
            return FreeReport((), None, "NVML: the reading was already taken")
        pid, self._open = self.pid, False
        chunks = []
        try:
            while select.select([self._read_end], [], [], timeout)[0]:
                chunk = os.read(self._read_end, 65536)
                if not chunk:
                    break
                chunks.append(chunk)
            else:
                os.kill(pid, signal.SIGKILL)
                return FreeReport((), None, f"NVML: no answer within {timeout:.0f} s")
        finally:
            os.close(self._read_end)
            os.waitpid(pid, 0)
        try:
            data = json.loads(b"".join(chunks))
            readings = tuple(reading_from_dict(r) for r in data["readings"])
            return FreeReport(readings, data["driver"], str(data["note"]))
        except (ValueError, KeyError, TypeError):
            return FreeReport((), None, "NVML: the reading could not be read back")

    def cancel(self) -> None:
        """Not needed after all (or the launch failed before using it): the child is stopped and reaped."""
        import signal

        if self._open:
            pid, self._open = self.pid, False
            os.close(self._read_end)
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)


def read_nvml_isolated(library: str = NVML_LIBRARY, timeout: float = NVML_TIMEOUT) -> FreeReport:
    """read_nvml in a forked child, waited for at once (see NvmlRead)."""
    return NvmlRead(library).result(timeout)


def nvidia_driver_loaded(proc_root: Path = Path("/proc")) -> bool:
    """Whether NVIDIA's kernel driver is loaded (its /proc folder): the one case where NVML can answer."""
    return (proc_root / "driver" / "nvidia").is_dir()


def read_amdgpu(sys_root: Path, bdfs: Sequence[str]) -> FreeReport:
    """amdgpu's VRAM counters (mem_info_vram_total, mem_info_vram_used) of the given PCI devices."""
    readings = []
    for index, bdf in enumerate(bdfs):
        folder = sys_root / "bus" / "pci" / "devices" / bdf
        try:
            total = int((folder / "mem_info_vram_total").read_text())
            used = int((folder / "mem_info_vram_used").read_text())
        except (OSError, ValueError):
            continue
        readings.append(FreeReading("amdgpu sysfs", index, bdf, bdf, None, total, max(total - used, 0)))
    return FreeReport(tuple(readings), None, f"amdgpu sysfs: {len(readings)} GPU(s)")


def read_free(
    sysfs: SysfsReport, listed: ListedDevices | None, sys_root: Path = Path("/sys"), nvml: NvmlRead | None = None
) -> FreeReport:
    """Free memory now from the vendors' interfaces of the GPUs present: NVML where an NVIDIA GPU is (sysfs
    shows one, or llama.cpp lists a CUDA device), amdgpu's counters for each amdgpu device. nvml: a read
    started earlier (NvmlRead), used instead of starting one now; cancelled when no NVIDIA GPU is seen."""
    readings: list[FreeReading] = []
    notes = []
    driver = None
    nvml_listed = listed is not None and any(backend_named(d.backend).free_source == "nvml" for d in listed.devices)
    if nvml_listed or any(g.vendor_id == NVIDIA and g.driver == "nvidia" for g in sysfs.gpus):
        report = nvml.result() if nvml is not None else read_nvml_isolated()
        driver = report.driver
        readings.extend(report.readings)
        notes.append(report.note)
    elif nvml is not None:
        nvml.cancel()
    amd = [g.bdf for g in sysfs.gpus if g.driver == "amdgpu"]
    if amd:
        amdgpu = read_amdgpu(sys_root, amd)
        readings.extend(amdgpu.readings)
        notes.append(amdgpu.note)
    return FreeReport(tuple(readings), driver, "; ".join(notes) or "no NVIDIA or amdgpu GPU: no vendor reading")
