"""probe_sysfs: display-class PCI devices and render nodes, from fixture trees and from this machine."""

from __future__ import annotations

from pathlib import Path

from safe_llama.device.probe_sysfs import probe_sysfs


def pci_device(
    sys_root: Path,
    bdf: str,
    *,
    class_code: str,
    vendor: str,
    device: str,
    driver: str | None = None,
    boot_vga: str | None = None,
    render: str | None = None,
    vram: int | None = None,
) -> None:
    """One /sys/bus/pci/devices/<bdf> entry as the kernel lays it out (driver is a symlink)."""
    entry = sys_root / "bus" / "pci" / "devices" / bdf
    entry.mkdir(parents=True)
    (entry / "class").write_text(class_code + "\n")
    (entry / "vendor").write_text(vendor + "\n")
    (entry / "device").write_text(device + "\n")
    if boot_vga is not None:
        (entry / "boot_vga").write_text(boot_vga + "\n")
    if driver is not None:
        drivers = sys_root / "bus" / "pci" / "drivers" / driver
        drivers.mkdir(parents=True, exist_ok=True)
        (entry / "driver").symlink_to(drivers)
    if render is not None:
        (entry / "drm" / render).mkdir(parents=True)
    if vram is not None:
        (entry / "mem_info_vram_total").write_text(f"{vram}\n")


def host_bridge(sys_root: Path) -> None:
    pci_device(sys_root, "0000:00:00.0", class_code="0x060000", vendor="0x8086", device="0x4668")


def igpu_only(root: Path) -> tuple[Path, Path]:
    sys_root, dev_root = root / "sys", root / "dev"
    host_bridge(sys_root)
    pci_device(
        sys_root,
        "0000:00:02.0",
        class_code="0x030000",
        vendor="0x8086",
        device="0x4680",
        driver="i915",
        boot_vga="1",
        render="renderD128",
    )
    (dev_root / "dri").mkdir(parents=True)
    (dev_root / "dri" / "renderD128").touch(mode=0o660)
    (dev_root / "dri" / "card0").touch()
    return sys_root, dev_root


def igpu_and_dgpu(root: Path) -> tuple[Path, Path]:
    sys_root, dev_root = igpu_only(root)
    pci_device(
        sys_root,
        "0000:03:00.0",
        class_code="0x030000",
        vendor="0x8086",
        device="0x56a0",
        driver="i915",
        boot_vga="0",
        render="renderD129",
    )
    (dev_root / "dri" / "renderD129").touch(mode=0o660)
    return sys_root, dev_root


def test_igpu_only(tmp_path: Path) -> None:
    sys_root, dev_root = igpu_only(tmp_path)
    report = probe_sysfs(sys_root=sys_root, dev_root=dev_root)
    (gpu,) = report.gpus
    assert gpu.bdf == "0000:00:02.0"
    assert (gpu.vendor, gpu.vendor_id, gpu.device_id, gpu.class_code) == ("Intel", 0x8086, 0x4680, 0x030000)
    assert (gpu.driver, gpu.boot_vga, gpu.integrated, gpu.compute) == ("i915", True, True, True)
    assert gpu.render_nodes == (str(dev_root / "dri" / "renderD128"),)
    (node,) = report.render_nodes
    assert (node.path, node.pci_bdf, node.accessible) == (str(dev_root / "dri" / "renderD128"), gpu.bdf, True)


def test_igpu_and_dgpu_are_two_gpus(tmp_path: Path) -> None:
    sys_root, dev_root = igpu_and_dgpu(tmp_path)
    report = probe_sysfs(sys_root=sys_root, dev_root=dev_root)
    assert [(g.bdf, g.integrated, g.boot_vga) for g in report.gpus] == [
        ("0000:00:02.0", True, True),
        ("0000:03:00.0", False, False),
    ]
    assert [n.pci_bdf for n in report.render_nodes] == ["0000:00:02.0", "0000:03:00.0"]
    assert "2 display-class PCI device(s)" in report.note


def test_server_bmc_vga_is_not_a_compute_gpu(tmp_path: Path) -> None:
    sys_root = tmp_path / "sys"
    pci_device(sys_root, "0000:02:00.0", class_code="0x030000", vendor="0x1a03", device="0x2000", boot_vga="1")
    pci_device(
        sys_root,
        "0000:41:00.0",
        class_code="0x030200",
        vendor="0x10de",
        device="0x2335",
        driver="nvidia",
        render="renderD128",
    )
    pci_device(sys_root, "0000:c1:00.0", class_code="0x030000", vendor="0x1002", device="0x744c", vram=24 << 30)
    report = probe_sysfs(sys_root=sys_root, dev_root=tmp_path / "dev")
    assert [(g.vendor, g.compute, g.integrated, g.driver) for g in report.gpus] == [
        ("ASPEED", False, None, None),
        ("NVIDIA", True, None, "nvidia"),
        ("AMD", True, None, None),
    ]
    assert report.gpus[2].vram_bytes == 24 << 30
    assert "container may not have been given /dev/dri" in report.note


def test_a_node_that_cannot_be_opened_is_reported(tmp_path: Path) -> None:
    sys_root, dev_root = igpu_only(tmp_path)
    # A node this user cannot open; a dangling link stands in for it, since root may open any real file.
    (dev_root / "dri" / "renderD128").unlink()
    (dev_root / "dri" / "renderD128").symlink_to(tmp_path / "gone")
    report = probe_sysfs(sys_root=sys_root, dev_root=dev_root)
    assert [n.accessible for n in report.render_nodes] == [False]
    assert "not open-able by this user" in report.note


def test_no_sysfs_is_said_not_raised(tmp_path: Path) -> None:
    report = probe_sysfs(sys_root=tmp_path / "nothing", dev_root=tmp_path / "nothing")
    assert report.gpus == () and report.render_nodes == ()
    assert "sysfs is not mounted" in report.note


def test_this_machine() -> None:
    report = probe_sysfs()
    assert all(g.class_code >> 16 == 0x03 for g in report.gpus)
    assert report.note
