"""Which vendor reading is the device llama.cpp uses, and the free figure the plan takes (pure): CUDA's numbering
under CUDA_VISIBLE_DEVICES, GPU UUIDs, MIG, names, PCI addresses; replayed with the readings recorded on an H200
while another process held 80 GiB of it (tests/fixtures/nvidia-h200-cuda/shared-gpu/)."""

from __future__ import annotations

import json
import tomllib
from dataclasses import replace

import pytest

from safe_llama.device.free_memory import free_figure, match_reading
from safe_llama.device.limits import Sourced
from safe_llama.device.llama_listing import LlamaDevice, parse_list_devices
from safe_llama.device.probe_free import FreeReading, reading_from_dict
from safe_llama.device.probe_sysfs import PciGpu
from safe_llama.paths import packaged_configs
from safe_llama.plan.target import Target
from safe_llama.units import human
from tests import FIXTURES

SHARED = FIXTURES / "nvidia-h200-cuda" / "shared-gpu"
MIB = 1 << 20
GIB = 1 << 30
UUID1 = "GPU-7f3e0c55-0d1a-4b2e-9a61-2c4d8e9f1a03"


def _nvml(label: str) -> tuple[FreeReading, ...]:
    data = json.loads((SHARED / f"nvml-{label}.json").read_text())
    return tuple(reading_from_dict(r) for r in data["readings"])


def _listed(label: str) -> tuple[LlamaDevice, ...]:
    listed = parse_list_devices((SHARED / f"list-devices-{label}.txt").read_text(), "")
    assert listed.problem is None
    return listed.devices


def _cuda(index: int, name: str = "NVIDIA H200") -> LlamaDevice:
    """A CUDA device as `--list-devices` gives it."""
    return LlamaDevice(f"CUDA{index}", name, "cuda", index, 143155 * MIB, 60093 * MIB, name)


def _two_h200s() -> tuple[FreeReading, ...]:
    """GPU 0 idle, GPU 1 with 80 GiB held by another program (NVML numbers them in PCI order)."""
    idle, held = _nvml("idle")[0], _nvml("held80")[0]
    return (idle, replace(held, index=1, pci_bdf="0000:00:07.0", uuid=UUID1))


@pytest.mark.parametrize(
    ("device", "visible", "nvml_index"),
    [
        pytest.param(0, None, 0, id="CUDA0-is-GPU0"),
        pytest.param(1, None, 1, id="CUDA1-is-GPU1"),
        pytest.param(0, "1", 1, id="visible-1-makes-CUDA0-GPU1"),
        pytest.param(1, "1,0", 0, id="visible-reordered"),
        pytest.param(0, UUID1[:12], 1, id="uuid-prefix"),
        pytest.param(0, f" {UUID1} ", 1, id="whole-uuid-spaces"),
    ],
)
def test_cuda_device_to_nvml_gpu(device: int, visible: str | None, nvml_index: int) -> None:
    env = {} if visible is None else {"CUDA_VISIBLE_DEVICES": visible}
    found, how = match_reading(_cuda(device), None, _two_h200s(), env)
    assert found is not None, how
    assert found.index == nvml_index
    assert how == f"CUDA{device} is NVML's GPU {nvml_index} ({found.pci_bdf})"


@pytest.mark.parametrize(
    ("device", "visible", "note"),
    [
        pytest.param(0, "MIG-4f9e2a10-7c3b-5d8e-b1a2-3c4d5e6f7a8b", "MIG instance", id="mig"),
        pytest.param(1, "1", "NVML shows no GPU 1 under CUDA_VISIBLE_DEVICES", id="hidden"),
        pytest.param(1, "0,7,1", "NVML shows no GPU 1", id="stops-at-an-unknown-index"),
        pytest.param(0, "GPU-00000000", "NVML shows no GPU 0", id="unknown-uuid"),
        pytest.param(0, "", "NVML shows no GPU 0", id="empty-hides-all"),
    ],
)
def test_cuda_device_without_a_reading(device: int, visible: str, note: str) -> None:
    found, how = match_reading(_cuda(device), None, _two_h200s(), {"CUDA_VISIBLE_DEVICES": visible})
    assert found is None
    assert note in how


def test_a_name_that_differs_is_not_matched() -> None:
    found, how = match_reading(_cuda(0, "NVIDIA A100-SXM4-80GB"), None, _nvml("idle"), {})
    assert found is None
    assert how == "NVML's GPU 0 is 'NVIDIA H200', not 'NVIDIA A100-SXM4-80GB'"


def test_amdgpu_reading_matched_by_pci_address() -> None:
    total = 25_753_026_560
    readings = (
        FreeReading("amdgpu sysfs", 0, "0000:03:00.0", "0000:03:00.0", None, total, 20 * GIB),
        FreeReading("amdgpu sysfs", 1, "0000:08:00.0", "0000:08:00.0", None, total, 5 * GIB),
    )
    device = LlamaDevice("ROCm0", "AMD Radeon RX 7900 XTX", "hip", 0, total, 24 * GIB, "AMD Radeon RX 7900 XTX")
    pci = PciGpu(
        bdf="0000:08:00.0", class_code=0x030000, vendor_id=0x1002, device_id=0x744C, vendor="AMD", compute=True,
        driver="amdgpu", boot_vga=False, integrated=False, render_nodes=("/dev/dri/renderD129",), vram_bytes=total,
    )  # fmt: skip
    found, how = match_reading(device, pci, readings, {})
    assert found is readings[1]
    assert how == "PCI 0000:08:00.0"
    assert match_reading(device, None, readings, {}) == (None, "")  # no address, no NVIDIA name: no guess
    figure = free_figure(device, found, listing_age=None)
    assert figure == Sourced(5 * GIB, "probed", "free now (amdgpu sysfs, 0000:08:00.0)")


@pytest.mark.parametrize(
    ("age", "detail"),
    [
        pytest.param(None, "free now (llama.cpp --list-devices)", id="no-age"),
        pytest.param(0.4, "free now (llama.cpp --list-devices)", id="just-run"),
        pytest.param(42.4, "free 42 s ago (llama.cpp --list-devices)", id="cached"),
    ],
)
def test_the_listing_is_the_fallback_said_with_its_age(age: float | None, detail: str) -> None:
    device = _listed("held80")[0]
    assert free_figure(device, None, listing_age=age) == Sourced(60093 * MIB, "probed", detail)


def test_no_device_no_figure() -> None:
    assert free_figure(None, None, listing_age=3.0) is None
    assert match_reading(None, None, _nvml("idle"), {}) == (None, "")


def _h200(free: Sourced[int] | None, runtime: int) -> Target:
    return Target(
        backend="cuda", device="CUDA0", on_gpu=True, device_free=free, device_runtime=runtime,
        device_memory=Sourced(143155 * MIB, "probed", "llama.cpp --list-devices total of CUDA0"),
        host_budget=Sourced(134_463_045_632, "probed", "psutil: MemAvailable"),
    )  # fmt: skip


def test_held80_replayed_the_budget_is_nvml_free_less_the_runtime() -> None:
    """Another process held 80 GiB: NVML's free figure for CUDA0, less what CUDA's runtime takes, is the budget."""
    device = _listed("held80")[0]
    found, how = match_reading(device, None, _nvml("held80"), {})
    assert found is not None and how == "CUDA0 is NVML's GPU 0 (0000:00:06.0)"
    figure = free_figure(device, found, listing_age=None)
    assert figure == Sourced(63_561_662_464, "probed", "free now (nvml, 0000:00:06.0)")
    # NVML's figure is read without a CUDA context; llama.cpp's listing after making its own (524 MiB there)
    assert (figure.value - device.free_bytes) // MIB == 524
    runtime = tomllib.loads((packaged_configs() / "planner.toml").read_text())["device_runtime_bytes"]["cuda"]
    budget = _h200(figure, runtime).device_budget
    assert budget is not None
    assert budget.value == 63_561_662_464 - runtime
    assert (
        budget.detail == f"{human(63_561_662_464)} free now (nvml, 0000:00:06.0) less {human(runtime)} for its runtime"
    )


def test_a_declared_size_is_not_lowered_by_free_memory() -> None:
    """--device-memory is the user's word: what another program holds now does not lower it."""
    held = free_figure(_listed("held80")[0], _nvml("held80")[0], listing_age=None)
    target = replace(_h200(held, 671_088_640), device_memory=Sourced(100 * GIB, "declared", "--device-memory 100G"))
    assert target.device_budget == Sourced(100 * GIB, "declared", "--device-memory 100G")
