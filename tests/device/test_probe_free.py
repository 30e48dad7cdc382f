"""The vendors' free-memory reads: NVML through ctypes (a fake libnvidia-ml compiled here from
tests/fakes/fake_cuda_llama.py, serving the reading recorded on an H200), the forked child that keeps NVML's
thread out of the supervisor, and amdgpu's counters."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest

from safe_llama.device.probe_free import (
    NvmlRead,
    normal_bdf,
    nvidia_driver_loaded,
    read_amdgpu,
    read_free,
    read_nvml,
    read_nvml_isolated,
    reading_from_dict,
)
from safe_llama.device.probe_sysfs import PciGpu, SysfsReport
from tests import FIXTURES, ROOT
from tests.fakes.fake_cuda_llama import build_nvml

IDLE = json.loads((FIXTURES / "nvidia-h200-cuda" / "shared-gpu" / "nvml-idle.json").read_text())
H200 = IDLE["readings"][0]


@pytest.fixture(scope="module")
def fake_nvml(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_nvml(tmp_path_factory.mktemp("nvml"))


@pytest.mark.parametrize(
    ("nvml", "sysfs"),
    [
        pytest.param("00000000:00:06.0", "0000:00:06.0", id="nvml-8-digit-domain"),
        pytest.param("00000000:3B:00.0", "0000:3b:00.0", id="upper-case-bus"),
        pytest.param("0001:c1:00.0", "0001:c1:00.0", id="already-sysfs"),
    ],
)
def test_normal_bdf(nvml: str, sysfs: str) -> None:
    assert normal_bdf(nvml) == sysfs


def test_read_nvml_gives_the_recorded_h200_reading(fake_nvml: Path) -> None:
    report = read_nvml(str(fake_nvml))
    assert report.readings == (reading_from_dict(H200),)
    assert report.readings[0].pci_bdf == "0000:00:06.0"
    assert report.driver == "580.159.04"
    assert report.note == IDLE["note"]


# Run in a child interpreter: read_nvml's thread must not stay in the test process.
_THREADS = """
import json, os, sys
from safe_llama.device.probe_free import read_nvml, read_nvml_isolated
def threads(): return len(os.listdir("/proc/self/task"))
before = threads()
isolated = read_nvml_isolated(sys.argv[1])
after_isolated = threads()
direct = read_nvml(sys.argv[1])
after_direct = threads()
print(json.dumps({
    "before": before, "after_isolated": after_isolated, "after_direct": after_direct, "driver": isolated.driver,
    "isolated": [r.to_dict() for r in isolated.readings], "direct": [r.to_dict() for r in direct.readings],
}))
"""


def test_nvml_leaves_a_thread_and_the_forked_read_leaves_none(fake_nvml: Path) -> None:
    done = subprocess.run(
        [sys.executable, "-c", _THREADS, str(fake_nvml)], capture_output=True, text=True, check=True, cwd=ROOT
    )
    seen = json.loads(done.stdout)
    assert seen["after_isolated"] == seen["before"]  # the fork took NVML's thread with it
    assert seen["after_direct"] == seen["before"] + 1  # what the isolation is for
    assert seen["isolated"] == seen["direct"] == [H200]
    assert seen["driver"] == "580.159.04"


def test_every_read_is_a_new_one(fake_nvml: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Another program's memory comes and goes: nothing is kept between reads."""
    free_file = tmp_path / "free-mib"
    monkeypatch.setenv("FAKE_FREE_FILE", str(free_file))
    seen = []
    for mib in (60617, 4501):  # 80 GiB held, then 137.6 GiB
        free_file.write_text(str(mib))
        seen.append([r.free_bytes for r in read_nvml_isolated(str(fake_nvml)).readings])
    assert seen == [[60617 << 20], [4501 << 20]]


def test_a_missing_library_gives_no_readings_and_says_why(tmp_path: Path) -> None:
    for read in (read_nvml, read_nvml_isolated):
        report = read(str(tmp_path / "libnvidia-ml.so.1"))
        assert report.readings == ()
        assert report.driver is None
        assert "not found" in report.note and "libnvidia-ml.so.1" in report.note


@pytest.mark.slow
def test_a_wedged_driver_is_given_up_on_within_the_timeout(tmp_path: Path) -> None:
    hanging = build_nvml(tmp_path / "hang", "-DHANG_IN_INIT")
    started = time.monotonic()
    report = read_nvml_isolated(str(hanging), timeout=1)
    took = time.monotonic() - started
    assert took < 3.0
    assert report.readings == ()
    assert report.note == "NVML: no answer within 1 s"


def test_amdgpu_free_is_total_less_used(tmp_path: Path) -> None:
    total, used = 25_753_026_560, 4_203_196_416  # a 24 GiB card with 3.9 GiB held by another program
    folder = tmp_path / "bus" / "pci" / "devices" / "0000:03:00.0"
    folder.mkdir(parents=True)
    (folder / "mem_info_vram_total").write_text(f"{total}\n")
    (folder / "mem_info_vram_used").write_text(f"{used}\n")
    report = read_amdgpu(tmp_path, ["0000:03:00.0", "0000:04:00.0"])  # the second has no counters: skipped
    assert len(report.readings) == 1
    reading = report.readings[0]
    assert (reading.source, reading.pci_bdf, reading.index) == ("amdgpu sysfs", "0000:03:00.0", 0)
    assert reading.total_bytes == total
    assert reading.free_bytes == total - used
    assert report.note == "amdgpu sysfs: 1 GPU(s)"


def _reaped(pid: int) -> bool:
    import os

    try:
        os.waitpid(pid, os.WNOHANG)
    except ChildProcessError:
        return True
    return False


H200_PCI = PciGpu("0000:00:06.0", 0x030200, 0x10DE, 0x2335, "NVIDIA", True, "nvidia", None, None, ())
NVIDIA_SYSFS = SysfsReport((H200_PCI,), (), "one NVIDIA GPU")


def test_a_read_started_early_gives_the_same_reading_once(fake_nvml: Path) -> None:
    started = NvmlRead(str(fake_nvml))
    report = started.result()
    assert [r.to_dict() for r in report.readings] == [H200] and _reaped(started.pid)
    assert started.result().readings == () and "already taken" in started.result().note


def test_read_free_collects_the_read_started_before(fake_nvml: Path) -> None:
    """The launch starts NVML's read before its imports and probes; read_free takes that one (the default
    library is not on this machine: without it there would be no reading)."""
    started = NvmlRead(str(fake_nvml))
    report = read_free(NVIDIA_SYSFS, None, Path("/nonexistent"), started)
    assert [r.to_dict() for r in report.readings] == [H200] and _reaped(started.pid)


def test_a_read_not_needed_is_stopped_and_reaped(fake_nvml: Path) -> None:
    started = NvmlRead(str(fake_nvml))
    report = read_free(SysfsReport((), (), "no GPU"), None, Path("/nonexistent"), started)
    assert report.readings == () and _reaped(started.pid)
    started.cancel()  # twice: nothing left to do


def test_nvidia_driver_loaded_is_its_proc_folder(tmp_path: Path) -> None:
    assert not nvidia_driver_loaded(tmp_path)
    (tmp_path / "driver" / "nvidia").mkdir(parents=True)
    assert nvidia_driver_loaded(tmp_path)


def test_nvml_reports_what_each_process_holds(fake_nvml: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Where the driver answers per process (the fake with FAKE_PROCESSES_FILE), each pid's bytes come with the
    reading and survive the forked read's JSON; where it does not, there is no per-process figure (None)."""
    assert read_nvml(str(fake_nvml)).readings[0].processes is None
    (tmp_path / "processes").write_text("1234 66676850688\n5678 1048576\n")
    monkeypatch.setenv("FAKE_PROCESSES_FILE", str(tmp_path / "processes"))
    reading = read_nvml(str(fake_nvml)).readings[0]
    assert reading.processes == ((1234, 66_676_850_688), (5678, 1_048_576))
    assert read_nvml_isolated(str(fake_nvml)).readings[0] == reading
    assert reading_from_dict(reading.to_dict()) == reading
    (tmp_path / "processes").write_text("")
    assert read_nvml(str(fake_nvml)).readings[0].processes == ()


@pytest.mark.parametrize("bad", [[[1]], [[1, -2]], [["1", 2]], "1 2", [[1, 2.5]]])
def test_a_bad_process_list_reads_as_no_figure(bad: object) -> None:
    assert reading_from_dict({**H200, "processes": bad}).processes is None
