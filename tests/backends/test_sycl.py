"""backends.sycl: what the pinned ggml-sycl source says, as the generic code reads it: its device names, the
2 GiB cap of GGML_SYCL_HOST_PINNED_MEM_2G on the probed max allocation, and its allocation failure in a log."""

from __future__ import annotations

import pytest

from safe_llama.backends.registry import backend_of
from safe_llama.backends.sycl import PINNED_2G_ENV
from safe_llama.device.llama_listing import DeviceRequest, parse_list_devices
from safe_llama.device.probe_sysfs import SysfsReport
from safe_llama.device.target_device import TargetDevice, resolve_target
from safe_llama.diagnosis.log_reading import read_log
from safe_llama.diagnosis.signatures import load_table
from tests.device.test_target_device import ARC_A770, ARC_PCI, GIB, opencl

LISTING = "Available devices:\n  SYCL0: Intel(R) Arc(TM) A770 Graphics (15930 MiB, 15000 MiB free)\n"
# ggml-sycl.cpp ggml_backend_sycl_buffer_type_alloc_buffer, as GGML_LOG_ERROR prints it
FAILED = "ggml_backend_sycl_buffer_type_alloc_buffer: can't allocate 8589934592 Bytes of memory on device\n"


def _target(env: dict[str, str]) -> TargetDevice:
    return resolve_target(
        request=DeviceRequest(devices=("SYCL0",), devices_from="--device", openvino_device=None),
        listed=parse_list_devices(LISTING),
        opencl=opencl(ARC_A770),
        sysfs=SysfsReport(gpus=(ARC_PCI,), render_nodes=(), note="one"),
        host_total=32 * GIB,
        env=env,
    )


@pytest.mark.parametrize(("name", "backend"), [("SYCL0", "sycl"), ("SYCL_Split", "sycl"), ("SYCL_Host", "sycl")])
def test_its_device_and_buffer_names(name: str, backend: str) -> None:
    assert backend_of(name) == backend


@pytest.mark.parametrize(
    ("value", "capped"),
    [
        pytest.param(None, False, id="unset"),
        pytest.param("0", False, id="off"),
        pytest.param("1", True, id="on"),
    ],
)
def test_pinned_memory_caps_one_buffer_at_2_gib(value: str | None, capped: bool) -> None:
    target = _target({} if value is None else {PINNED_2G_ENV: value})
    assert target.backend == "sycl" and target.limits_alloc and target.max_alloc_bytes is not None
    assert target.max_alloc_bytes.value == (2 * GIB if capped else ARC_A770.max_mem_alloc_size)
    assert (PINNED_2G_ENV in target.max_alloc_bytes.detail) is capped


def test_a_failed_device_allocation_is_read_as_sycls_on_the_gpu() -> None:
    reading = read_log(FAILED, load_table())
    assert (reading.facts.backend, reading.facts.on_gpu) == ("sycl", True)
    assert reading.failure is not None and reading.failure.memory
