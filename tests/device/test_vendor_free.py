"""The early start's one vendor reading: amdgpu's counters under a fake sysfs root (no amdgpu GPU here), and
NVML's forked read, which answers None where no NVIDIA driver is (this machine, and a library not there)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from safe_llama.device import vendor_free

BDF = "0000:03:00.0"


def _amdgpu(root: Path, total: str, used: str) -> Path:
    folder = root / "bus" / "pci" / "devices" / BDF
    folder.mkdir(parents=True)
    (folder / "mem_info_vram_total").write_text(total)
    (folder / "mem_info_vram_used").write_text(used)
    return root


def test_amdgpu_free_is_total_less_used(tmp_path: Path) -> None:
    root = _amdgpu(tmp_path, "17163091968\n", "1073741824\n")
    assert vendor_free.begin(vendor_free.AMDGPU, BDF, sys_root=str(root)).result() == 17163091968 - 1073741824


@pytest.mark.parametrize(
    ("total", "used"), [pytest.param("x", "1", id="not-a-number"), pytest.param("", "", id="empty")]
)
def test_an_unreadable_amdgpu_counter_is_no_reading(tmp_path: Path, total: str, used: str) -> None:
    root = _amdgpu(tmp_path, total, used)
    assert vendor_free.begin(vendor_free.AMDGPU, BDF, sys_root=str(root)).result() is None


def test_a_device_not_there_is_no_reading(tmp_path: Path) -> None:
    assert vendor_free.begin(vendor_free.AMDGPU, BDF, sys_root=str(tmp_path)).result() is None
    assert vendor_free.begin("opencl", "0", sys_root=str(tmp_path)).result() is None  # no vendor reading of that source


def _children() -> set[str]:
    return set(Path(f"/proc/self/task/{os.getpid()}/children").read_text().split())


def test_a_reading_begun_then_not_wanted_leaves_no_child(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The early start begins NVML's read before its other checks; one of them failing cancels it: the forked
    child is killed and reaped (no zombie stays beside llama.cpp's supervisor)."""
    from tests.fakes.fake_cuda_llama import build_nvml

    library = str(build_nvml(tmp_path / "nvml"))
    (tmp_path / "free").write_text("60610")
    monkeypatch.setenv("FAKE_FREE_FILE", str(tmp_path / "free"))
    before = _children()
    reading = vendor_free.begin(vendor_free.NVML, "GPU-12c88ba7-4229-5615-d2f3-4c8f50f61e5b", library=library)
    forked = _children() - before
    assert len(forked) == 1
    reading.cancel()
    assert not forked & _children() and reading.result() is None
    reading.cancel()  # once is enough: a second does nothing


def test_nvml_without_its_library_is_no_reading() -> None:
    """The read runs in a forked child that answers nothing: the parent gets None, and the child is reaped."""
    assert vendor_free.begin(vendor_free.NVML, "GPU-0", library="libnvidia-ml-not-there.so.1").result() is None
    assert vendor_free.nvml_read("libnvidia-ml-not-there.so.1", "GPU-0") is None


def test_nvml_reads_the_gpu_of_the_uuid(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Through the fake H200 NVML (tests/fakes/fake_cuda_llama.py): its free figure is FAKE_FREE_FILE's MiB."""
    from tests.fakes.fake_cuda_llama import build_nvml

    library = str(build_nvml(tmp_path / "nvml"))
    (tmp_path / "free").write_text("60610")
    monkeypatch.setenv("FAKE_FREE_FILE", str(tmp_path / "free"))
    uuid = "GPU-12c88ba7-4229-5615-d2f3-4c8f50f61e5b"
    assert vendor_free.begin(vendor_free.NVML, uuid, library=library).result() == 60610 << 20
    assert vendor_free.begin(vendor_free.NVML, "GPU-another", library=library).result() is None
