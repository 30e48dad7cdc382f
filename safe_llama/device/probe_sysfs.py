"""GPUs as Linux sees them: display-class PCI devices in sysfs and their /dev/dri render nodes.

Owns reading /sys/bus/pci/devices and /dev/dri (roots are parameters, so tests pass fixture trees); must
not open the devices or load drivers, and must not decide which device llama.cpp uses (target_device does).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

DISPLAY_CLASS = 0x03  # PCI base class "display controller": 0x0300 VGA, 0x0302 3D, 0x0380 other

# Vendors seen on display-class PCI devices: (name, can run compute). BMC and emulated VGA cannot.
PCI_VENDORS: dict[int, tuple[str, bool]] = {
    0x8086: ("Intel", True),
    0x10DE: ("NVIDIA", True),
    0x1002: ("AMD", True),
    0x1A03: ("ASPEED", False),  # server BMC video
    0x102B: ("Matrox", False),
    0x1234: ("QEMU", False),  # Bochs/std VGA
    0x15AD: ("VMware", False),
    0x1AF4: ("virtio", False),
    0x1B36: ("Red Hat QXL", False),
    0x1414: ("Microsoft", True),  # WSL2's dxg adapter
}

# An Intel iGPU sits at bus 0, device 2 (the seed's FilterBdfPath example is 0000:00:02.0).
INTEL_IGPU_SLOT = "00:02.0"


@dataclass(frozen=True)
class RenderNode:
    """A DRM render node (/dev/dri/renderD*), its GPU and whether this user may open it."""

    path: str  # /dev/dri/renderD128
    pci_bdf: str | None  # the GPU it belongs to, when sysfs says
    accessible: bool  # this user may open it read-write


@dataclass(frozen=True)
class PciGpu:
    """A display-class PCI device from sysfs: its ids, vendor, driver and render nodes."""

    bdf: str  # 0000:00:02.0
    class_code: int  # 0x030000
    vendor_id: int
    device_id: int
    vendor: str
    compute: bool  # a vendor whose GPUs run compute (not a BMC or emulated VGA)
    driver: str | None  # i915, xe, nvidia, amdgpu; None = no driver bound
    boot_vga: bool | None
    integrated: bool | None  # Intel at 00:02.0 -> True, other Intel -> False, else unknown
    render_nodes: tuple[str, ...]  # /dev/dri/renderD* paths sysfs lists for it
    vram_bytes: int | None = None  # amdgpu's mem_info_vram_total


@dataclass(frozen=True)
class SysfsReport:
    """The GPUs and render nodes sysfs shows."""

    gpus: tuple[PciGpu, ...]
    render_nodes: tuple[RenderNode, ...]
    note: str  # what was looked at, and why nothing was found


def _read(path: Path) -> str | None:
    try:
        return path.read_text().strip()
    except OSError:
        return None


def _hex(text: str | None) -> int | None:
    try:
        return int(text, 16) if text else None
    except ValueError:
        return None


def _gpu(device_dir: Path, dev_root: Path) -> PciGpu | None:
    class_code = _hex(_read(device_dir / "class"))
    if class_code is None or class_code >> 16 != DISPLAY_CLASS:
        return None
    vendor_id = _hex(_read(device_dir / "vendor")) or 0
    vendor, compute = PCI_VENDORS.get(vendor_id, (f"0x{vendor_id:04x}", True))
    driver_link = device_dir / "driver"
    driver = driver_link.readlink().name if driver_link.is_symlink() else None
    boot_vga_text = _read(device_dir / "boot_vga")
    bdf = device_dir.name
    integrated = (bdf.endswith(":" + INTEL_IGPU_SLOT)) if vendor_id == 0x8086 else None
    try:
        drm = sorted(p.name for p in (device_dir / "drm").iterdir() if p.name.startswith("renderD"))
    except OSError:
        drm = []
    vram = _read(device_dir / "mem_info_vram_total")
    return PciGpu(
        bdf=bdf,
        class_code=class_code,
        vendor_id=vendor_id,
        device_id=_hex(_read(device_dir / "device")) or 0,
        vendor=vendor,
        compute=compute,
        driver=driver,
        boot_vga=None if boot_vga_text is None else boot_vga_text == "1",
        integrated=integrated,
        render_nodes=tuple(str(dev_root / "dri" / name) for name in drm),
        vram_bytes=int(vram) if vram and vram.isdigit() else None,
    )


def probe_sysfs(*, sys_root: Path = Path("/sys"), dev_root: Path = Path("/dev")) -> SysfsReport:
    """Display-class PCI devices and render nodes. Missing sysfs or /dev/dri is reported, not raised."""
    pci = sys_root / "bus" / "pci" / "devices"
    try:
        entries = sorted(pci.iterdir())
    except OSError:
        return SysfsReport(gpus=(), render_nodes=(), note=f"no {pci}: not Linux, or sysfs is not mounted")
    gpus = tuple(gpu for gpu in (_gpu(entry, dev_root) for entry in entries) if gpu is not None)
    owner = {node: gpu.bdf for gpu in gpus for node in gpu.render_nodes}
    dri = dev_root / "dri"
    try:
        node_paths = sorted(str(p) for p in dri.iterdir() if p.name.startswith("renderD"))
    except OSError:
        node_paths = []
    nodes = tuple(
        RenderNode(path=path, pci_bdf=owner.get(path), accessible=os.access(path, os.R_OK | os.W_OK))
        for path in node_paths
    )
    notes = [f"{len(gpus)} display-class PCI device(s) in {pci}"]
    if not node_paths:
        notes.append(f"no render node in {dri}" + (" (a container may not have been given /dev/dri)" if gpus else ""))
    denied = [node.path for node in nodes if not node.accessible]
    if denied:
        notes.append(f"not open-able by this user: {', '.join(denied)} (the 'render' group usually grants it)")
    return SysfsReport(gpus=gpus, render_nodes=nodes, note="; ".join(notes))
