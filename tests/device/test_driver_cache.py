"""The cached `--list-devices` of the real pinned CPU build is run again when what decides the devices llama.cpp
sees changes: a GPU driver's module loaded, NVIDIA's driver version, an ICD file, a device node, or an environment
variable that hides or orders devices. Anything else keeps it."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from safe_llama.device.devices import probe_llama
from safe_llama.device.drivers import ProbeRoots, driver_state


@pytest.fixture
def roots(tmp_path: Path) -> ProbeRoots:
    sys_root, proc_root, dev_root = tmp_path / "sys", tmp_path / "proc", tmp_path / "dev"
    (sys_root / "module" / "ext4").mkdir(parents=True)
    (proc_root / "driver").mkdir(parents=True)
    (dev_root / "dri").mkdir(parents=True)
    icd = tmp_path / "etc" / "OpenCL" / "vendors"
    icd.mkdir(parents=True)
    (icd / "pocl.icd").write_text("libpocl.so.2\n")
    return ProbeRoots(sys_root=sys_root, dev_root=dev_root, proc_root=proc_root, icd_dirs=(icd, tmp_path / "none"))


def _probe(llama_bin: Path, env: dict[str, str], cache: Path, roots: ProbeRoots) -> bool:
    """Whether the listing came from the cache."""
    probe = probe_llama(llama_bin / "llama-server", env=env, cache=cache, drivers=driver_state(roots))
    assert probe.listed.problem is None and probe.version is not None
    return probe.cached


def _module(roots: ProbeRoots, name: str) -> None:
    (roots.sys_root / "module" / name).mkdir()


def _nvidia_version(roots: ProbeRoots) -> None:
    folder = roots.proc_root / "driver" / "nvidia"
    folder.mkdir()
    (folder / "version").write_text(
        "NVRM version: NVIDIA UNIX Open Kernel Module for x86_64  580.159.04  Release Build\n"
    )


def _icd(roots: ProbeRoots) -> None:
    (roots.icd_dirs[0] / "nvidia.icd").write_text("libnvidia-opencl.so.1\n")


def _device_node(roots: ProbeRoots) -> None:
    (roots.dev_root / "nvidia0").touch()


def _render_node(roots: ProbeRoots) -> None:
    (roots.dev_root / "dri" / "renderD128").touch()


@pytest.mark.slow
@pytest.mark.parametrize(
    "change",
    [
        pytest.param(lambda r: _module(r, "nvidia"), id="module-nvidia"),
        pytest.param(lambda r: _module(r, "amdgpu"), id="module-amdgpu"),
        pytest.param(_nvidia_version, id="proc-driver-nvidia-version"),
        pytest.param(_icd, id="icd-file"),
        pytest.param(_device_node, id="dev-nvidia0"),
        pytest.param(_render_node, id="dev-dri-render-node"),
    ],
)
def test_a_driver_appearing_runs_the_listing_again(
    change: Callable[[ProbeRoots], None], llama_bin: Path, clean_env: dict[str, str], roots: ProbeRoots, tmp_path: Path
) -> None:
    cache = tmp_path / "cache"
    assert not _probe(llama_bin, clean_env, cache, roots)
    assert _probe(llama_bin, clean_env, cache, roots)
    change(roots)
    assert not _probe(llama_bin, clean_env, cache, roots)  # listed afresh: the driver may show a GPU now
    assert _probe(llama_bin, clean_env, cache, roots)  # and cached under the new state


@pytest.mark.slow
def test_other_modules_keep_the_cache(
    llama_bin: Path, clean_env: dict[str, str], roots: ProbeRoots, tmp_path: Path
) -> None:
    cache = tmp_path / "cache"
    assert not _probe(llama_bin, clean_env, cache, roots)
    _module(roots, "btrfs")
    (roots.dev_root / "null").touch()
    assert _probe(llama_bin, clean_env, cache, roots)


@pytest.mark.slow
def test_a_driver_going_away_runs_it_again(
    llama_bin: Path, clean_env: dict[str, str], roots: ProbeRoots, tmp_path: Path
) -> None:
    cache = tmp_path / "cache"
    _module(roots, "nvidia")
    assert not _probe(llama_bin, clean_env, cache, roots)
    (roots.sys_root / "module" / "nvidia").rmdir()
    assert not _probe(llama_bin, clean_env, cache, roots)


@pytest.mark.slow
@pytest.mark.parametrize("variable", ["CUDA_VISIBLE_DEVICES", "GGML_VK_VISIBLE_DEVICES"])
def test_the_listing_is_keyed_by_the_visible_devices(
    variable: str, llama_bin: Path, clean_env: dict[str, str], roots: ProbeRoots, tmp_path: Path
) -> None:
    cache = tmp_path / "cache"
    env = {k: v for k, v in clean_env.items() if k != variable}
    assert not _probe(llama_bin, env, cache, roots)
    assert not _probe(llama_bin, {**env, variable: "1"}, cache, roots)
    assert _probe(llama_bin, {**env, variable: "1"}, cache, roots)
    assert not _probe(llama_bin, {**env, variable: "0,1"}, cache, roots)
    assert _probe(llama_bin, env, cache, roots)  # each setting keeps its own listing
