"""probe_opencl against the real pocl ICD (POCL_MEMORY_LIMIT=2: 2 GiB global, 512 MiB max allocation),
and against ICD set-ups that offer nothing."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from safe_llama.device.probe_opencl import (
    fingerprint,
    pci_bus_info,
    probe_opencl_isolated,
    report_from_dict,
    report_to_dict,
)

GIB = 1 << 30


def pocl_env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("POCL_", "OCL_ICD", "OPENCL_"))}
    return {**env, **extra}


@pytest.mark.slow
def test_pocl_limits_through_pyopencl() -> None:
    # pocl reads POCL_MEMORY_LIMIT when the ICD loads, so the probe runs in a child with that environment.
    report = probe_opencl_isolated(pocl_env(POCL_MEMORY_LIMIT="2"))
    assert report.status == "ok", report.note
    (device,) = [d for d in report.devices if d.platform == "Portable Computing Language"]
    assert device.global_mem_size == 2 * GIB
    assert device.max_mem_alloc_size == 512 << 20
    assert device.device_type == "CPU"
    assert device.host_unified_memory is True
    assert device.platform_vendor == "The pocl project"
    assert device.driver_version
    assert device.pci_bdf is None
    assert device.pci_note == "the driver lacks cl_khr_pci_bus_info"
    assert report_from_dict(report_to_dict(report)) == report


@pytest.mark.slow
def test_no_icd_is_a_reason_not_an_error(tmp_path: Path) -> None:
    report = probe_opencl_isolated(pocl_env(OCL_ICD_VENDORS=str(tmp_path)))
    assert (report.status, report.devices) == ("no-platforms", ())
    assert "no *.icd file" in report.note


@pytest.mark.slow
def test_broken_icd_is_named(tmp_path: Path) -> None:
    (tmp_path / "vendor.icd").write_text("/nonexistent/libvendor-opencl.so\n")
    report = probe_opencl_isolated(pocl_env(OCL_ICD_VENDORS=str(tmp_path)))
    assert report.status == "no-platforms"
    assert "vendor.icd names /nonexistent/libvendor-opencl.so, which does not load" in report.note


@pytest.mark.slow
def test_pci_bus_info_reaches_the_driver() -> None:
    """The ctypes call goes through the loader pyopencl uses; pocl answers CL_INVALID_VALUE (-30)."""
    import ctypes

    import pyopencl as cl

    from safe_llama.device.probe_opencl import opencl_library

    device = next(d for p in cl.get_platforms() for d in p.get_devices())
    library = opencl_library()
    assert isinstance(library, ctypes.CDLL)
    assert pci_bus_info(library, device.int_ptr) == (
        None,
        "clGetDeviceInfo(CL_DEVICE_PCI_BUS_INFO_KHR) failed: error -30",
    )


def test_fingerprint_follows_icds_and_environment(tmp_path: Path) -> None:
    env = pocl_env(OCL_ICD_VENDORS=str(tmp_path))
    empty = fingerprint(env)
    icd = tmp_path / "pocl.icd"
    icd.write_text("libpocl.so.2\n")
    with_icd = fingerprint(env)
    assert with_icd != empty
    icd.write_text("libpocl.so.2.10.0\n")
    os.utime(icd, ns=(1, 1))
    assert fingerprint(env) != with_icd
    assert fingerprint({**env, "POCL_MEMORY_LIMIT": "2"}) != fingerprint(env)
    assert fingerprint({**env, "UNRELATED": "1"}) == fingerprint(env)
