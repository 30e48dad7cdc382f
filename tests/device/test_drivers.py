"""device.drivers: the fingerprint of what decides which GPUs llama.cpp sees (driver modules, NVIDIA's driver
version, device nodes, ICD files), read from fake /sys, /proc and /dev trees in tmp_path. test_driver_cache
checks that the cached --list-devices follows it."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from safe_llama.device.drivers import DEFAULT_ROOTS, DRIVER_MODULES, ICD_DIRS, ProbeRoots, driver_state


def fake_roots(tmp_path: Path) -> ProbeRoots:
    """A machine with no GPU driver: one unrelated module, an empty /dev/dri, pocl's ICD file."""
    sys_root, proc_root, dev_root = tmp_path / "sys", tmp_path / "proc", tmp_path / "dev"
    (sys_root / "module" / "ext4").mkdir(parents=True)
    (proc_root / "driver").mkdir(parents=True)
    (dev_root / "dri").mkdir(parents=True)
    icd = tmp_path / "etc" / "OpenCL" / "vendors"
    icd.mkdir(parents=True)
    (icd / "pocl.icd").write_text("libpocl.so.2\n")
    return ProbeRoots(sys_root=sys_root, dev_root=dev_root, proc_root=proc_root, icd_dirs=(icd, tmp_path / "none"))


def add_module(roots: ProbeRoots, name: str) -> None:
    (roots.sys_root / "module" / name).mkdir()


def add_nvidia_version(roots: ProbeRoots) -> None:
    folder = roots.proc_root / "driver" / "nvidia"
    folder.mkdir()
    (folder / "version").write_text(
        "NVRM version: NVIDIA UNIX Open Kernel Module for x86_64  580.159.04  Release Build\n"
    )


def add_icd(roots: ProbeRoots) -> None:
    (roots.icd_dirs[0] / "nvidia.icd").write_text("libnvidia-opencl.so.1\n")


def add_device_node(roots: ProbeRoots) -> None:
    (roots.dev_root / "nvidia0").touch()


def add_render_node(roots: ProbeRoots) -> None:
    (roots.dev_root / "dri" / "renderD128").touch()


DRIVER_CHANGES = [
    pytest.param(lambda r: add_module(r, "nvidia"), id="module-nvidia"),
    pytest.param(lambda r: add_module(r, "amdgpu"), id="module-amdgpu"),
    pytest.param(add_nvidia_version, id="proc-driver-nvidia-version"),
    pytest.param(add_icd, id="icd-file"),
    pytest.param(add_device_node, id="dev-nvidia0"),
    pytest.param(add_render_node, id="dev-dri-render-node"),
]


@pytest.mark.parametrize("change", DRIVER_CHANGES)
def test_a_driver_appearing_changes_the_state(change: Callable[[ProbeRoots], None], tmp_path: Path) -> None:
    roots = fake_roots(tmp_path)
    before = driver_state(roots)
    assert driver_state(roots) == before  # the same machine reads the same
    change(roots)
    assert driver_state(roots) != before


def test_other_modules_and_nodes_keep_the_state(tmp_path: Path) -> None:
    roots = fake_roots(tmp_path)
    before = driver_state(roots)
    add_module(roots, "btrfs")
    (roots.dev_root / "null").touch()
    (roots.dev_root / "tty0").touch()
    assert driver_state(roots) == before


def test_the_state_lists_what_it_saw(tmp_path: Path) -> None:
    roots = fake_roots(tmp_path)
    add_module(roots, "i915")
    add_module(roots, "xe")
    add_render_node(roots)
    (roots.dev_root / "kfd").touch()
    add_nvidia_version(roots)
    icd = roots.icd_dirs[0]
    assert driver_state(roots) == "\n".join(
        [
            f"{roots.sys_root / 'module'}:i915,xe",
            "NVRM version: NVIDIA UNIX Open Kernel Module for x86_64  580.159.04  Release Build\n",
            f"{roots.dev_root}:kfd",
            f"{roots.dev_root / 'dri'}:renderD128",
            f"{icd}:pocl.icd",
            f"{tmp_path / 'none'}:-",
        ]
    )


def test_missing_folders_read_as_absent(tmp_path: Path) -> None:
    empty = ProbeRoots(sys_root=tmp_path / "s", dev_root=tmp_path / "d", proc_root=tmp_path / "p", icd_dirs=())
    assert driver_state(empty).split("\n") == [
        f"{tmp_path / 's' / 'module'}:-",
        "-",
        f"{tmp_path / 'd'}:-",
        f"{tmp_path / 'd' / 'dri'}:-",
    ]


def test_the_real_roots_and_driver_names() -> None:
    assert DEFAULT_ROOTS.sys_root == Path("/sys") and DEFAULT_ROOTS.proc_cgroup == Path("/proc/self/cgroup")
    assert DEFAULT_ROOTS.icd_dirs == tuple(Path(d) for d in ICD_DIRS)
    assert {"nvidia", "amdgpu", "i915", "xe"} <= DRIVER_MODULES and "ext4" not in DRIVER_MODULES
