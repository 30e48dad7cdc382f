"""What decides which GPUs llama.cpp can see, as a fingerprint: the kernel drivers loaded, NVIDIA's driver
version, the device nodes, the ICD files naming the user-space drivers; and the roots of the file system the
probes read (tests point them at temporary trees).

Owns that fingerprint (part of the cached listing's key); must not run anything nor decide which device is used."""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

# What else decides which devices llama.cpp sees: the kernel drivers loaded, their device nodes, the ICD
# files that name the user-space drivers. A listing cached while no driver was loaded must not outlive it.
DRIVER_MODULES = frozenset({"nvidia", "nvidia_uvm", "amdgpu", "i915", "xe", "radeon", "nouveau"})
ICD_DIRS = (
    "/etc/OpenCL/vendors",
    "/usr/share/vulkan/icd.d",
    "/etc/vulkan/icd.d",
    "/usr/local/share/vulkan/icd.d",
)


@dataclass(frozen=True)
class ProbeRoots:
    """The parts of the file system the probes read; tests point them at temporary trees."""

    sys_root: Path = Path("/sys")
    dev_root: Path = Path("/dev")
    proc_cgroup: Path = Path("/proc/self/cgroup")
    cgroup_root: Path = Path("/sys/fs/cgroup")
    proc_root: Path = Path("/proc")
    icd_dirs: tuple[Path, ...] = tuple(Path(d) for d in ICD_DIRS)


def _listing(folder: Path, keep: Callable[[str], bool] = lambda name: True) -> str:
    try:
        return f"{folder}:{','.join(sorted(name for name in os.listdir(folder) if keep(name)))}"
    except OSError:
        return f"{folder}:-"


def driver_state(roots: ProbeRoots) -> str:
    """The GPU drivers as the system has them now: kernel modules loaded, NVIDIA's driver version, device
    nodes, ICD files. Part of the listing cache's key, so a listing made without a driver is not reused
    once the driver is there (and the other way round)."""
    try:
        nvidia = (roots.proc_root / "driver" / "nvidia" / "version").read_text()[:200]
    except OSError:
        nvidia = "-"
    return "\n".join(
        [
            _listing(roots.sys_root / "module", lambda name: name in DRIVER_MODULES),
            nvidia,
            _listing(roots.dev_root, lambda name: name.startswith("nvidia") or name == "kfd"),
            _listing(roots.dev_root / "dri"),
            *(_listing(folder) for folder in roots.icd_dirs),
        ]
    )


DEFAULT_ROOTS = ProbeRoots()
