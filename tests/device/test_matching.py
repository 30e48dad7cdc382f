"""device.matching: which OpenCL device and which PCI GPU are llama.cpp's device, and the NEO filter that
pins Intel's runtime to it. Plain OpenCL devices, sysfs GPUs and environments in, the match and its reason out
(the devices are test_device_map's, written from real reports)."""

from __future__ import annotations

import pytest

from safe_llama.backends.backend import AllocRule
from safe_llama.device.limits import INTEL, NVIDIA, Choice
from safe_llama.device.llama_listing import LlamaDevice
from safe_llama.device.matching import (
    _match_by_name,
    _match_opencl,
    _match_pci,
    _neo_filter,
    _normal,
    _openvino_index,
    openvino_gpu_order,
)
from safe_llama.device.probe_opencl import OpenCLDevice
from safe_llama.device.probe_sysfs import SysfsReport
from tests.device.test_target_device import (
    ARC_A770,
    ARC_PCI,
    H200,
    IGPU_PCI,
    NO_SYSFS,
    ONLY_IGPU,
    POCL,
    TWO_INTEL,
    UHD770,
    UHD770_PROFILE,
    cl_device,
    gpu,
    opencl,
)

INTEL_GPUS = AllocRule((INTEL,), "opencl", "test")
ANY_VENDOR = AllocRule((), "opencl", "test")
OPENVINO_GPU = AllocRule((INTEL,), "opencl", "test")
OPENVINO_CPU = AllocRule((), "none", "test")


def choice(backend: str, description: str, *, device: str | None = None, index: int | None = None) -> Choice:
    """A choice; with an index, as if llama.cpp listed it (its `index`-th device of the backend)."""
    llama = None
    if index is not None:
        llama = LlamaDevice(f"{backend.upper()}{index}", description, backend, index, 0, 0, description)
    return Choice(
        llama=llama,
        llama_name=llama.name if llama else None,
        backend=backend,
        backend_device=device,
        description=description,
        requested_by="test",
    )


def twin(bdf: str | None) -> OpenCLDevice:
    return cl_device("Intel(R) Arc(TM) A770 Graphics", vendor_id=INTEL, max_alloc=1, memory=1, unified=False, bdf=bdf)


def test_names_are_compared_without_marks_case_or_spacing() -> None:
    assert _normal("Intel(R) Arc(TM)  A770   Graphics") == "intel arc a770 graphics"
    assert _normal("NVIDIA H200") == "nvidia h200"


def test_openvino_numbering_follows_its_gpu_plugin() -> None:
    """OpenVINO's own unit test (sort_order_two_vendors): Intel iGPU, Intel dGPU, then the rest in order."""
    other = ("Other", "Other Inc.")
    o1 = cl_device("o1", vendor_id=0x123, max_alloc=1, memory=1, unified=False, bdf=None, platform=other)
    o2 = cl_device("o2", vendor_id=0x123, max_alloc=1, memory=1, unified=False, bdf=None, platform=other)
    assert openvino_gpu_order([o1, ARC_A770, POCL, o2, UHD770]) == [UHD770, ARC_A770, o1, o2]


def test_openvino_puts_intels_platform_first_within_a_kind() -> None:
    """The same kind of Intel GPU seen through two platforms (pocl's level0 driver and Intel's): Intel's first."""
    pocl = ("Portable Computing Language", "The pocl project")
    arc_on_pocl = cl_device(
        ARC_A770.name, vendor_id=INTEL, max_alloc=1, memory=1, unified=False, bdf=None, platform=pocl
    )
    assert openvino_gpu_order([arc_on_pocl, ARC_A770]) == [ARC_A770, arc_on_pocl]


@pytest.mark.parametrize(
    ("device", "index"),
    [
        ("GPU", 0),
        ("GPU.0", 0),
        ("GPU.1", 1),
        ("GPU.1.0", 1),
        ("GPU.12", 12),
        ("CPU", None),
        ("NPU", None),
        ("GPU.", None),
    ],
)
def test_openvino_device_ids_give_a_gpu_index(device: str, index: int | None) -> None:
    assert _openvino_index(device) == index


def test_match_by_exact_name_then_by_prefix() -> None:
    found, how = _match_by_name("Intel(R) Arc(TM) A770 Graphics", None, [UHD770, ARC_A770], {})
    assert found == ARC_A770 and "same name" in how
    found, how = _match_by_name("Intel(R) UHD Graphics 770 (ADL-S GT1)", None, [UHD770, ARC_A770], {})
    assert found == UHD770 and "name prefix" in how
    found, how = _match_by_name("AMD Radeon", None, [UHD770, ARC_A770], {})
    assert found is None and "no OpenCL device is named like 'AMD Radeon'" in how


def test_identical_devices_are_told_apart_by_pci_order_only() -> None:
    first, second = twin("0000:03:00.0"), twin("0000:83:00.0")
    found, how = _match_by_name(ARC_A770.name, 1, [second, first], {})
    assert found == second and "position 1 among 2" in how
    found, _ = _match_by_name(ARC_A770.name, 0, [second, first], {})
    assert found == first
    for index, devices, env in [
        (1, [second, first], {"ZE_AFFINITY_MASK": "1"}),  # renumbered: position says nothing
        (None, [second, first], {}),  # no position
        (2, [second, first], {}),  # past the end
        (0, [twin(None), first], {}),  # a bus address unknown
    ]:
        found, how = _match_by_name(ARC_A770.name, index, devices, env)
        assert found is None and "cannot tell which one" in how
    _, how = _match_by_name(ARC_A770.name, 1, [second, first], {"ZE_AFFINITY_MASK": "1"})
    assert "ZE_AFFINITY_MASK renumbers" in how


def test_an_empty_renumbering_variable_is_not_a_renumbering() -> None:
    found, _ = _match_by_name(ARC_A770.name, 0, [twin("0000:83:00.0"), twin("0000:03:00.0")], {"ZE_AFFINITY_MASK": ""})
    assert found is not None and found.pci_bdf == "0000:03:00.0"


def test_no_opencl_match_for_the_cpu_or_openvino_without_a_limit() -> None:
    assert _match_opencl(choice("cpu", "CPU"), INTEL_GPUS, opencl(UHD770), {}) == (None, "")
    assert _match_opencl(choice("openvino", "CPU", device="CPU"), OPENVINO_CPU, opencl(UHD770), {}) == (None, "")
    assert _match_opencl(choice("vulkan", UHD770.name), None, opencl(UHD770), {}) == (None, "")


def test_opencl_without_devices_says_why() -> None:
    found, how = _match_opencl(choice("sycl", UHD770.name), INTEL_GPUS, opencl(), {})
    assert found is None and how == "OpenCL shows no device (test)"


def test_openvino_gpu_ids_follow_openvinos_order() -> None:
    report = opencl(ARC_A770, UHD770)
    found, how = _match_opencl(choice("openvino", UHD770.name, device="GPU.0", index=0), OPENVINO_GPU, report, {})
    assert found == UHD770 and "GPU #0" in how
    found, _ = _match_opencl(choice("openvino", ARC_A770.name, device="GPU.1", index=1), OPENVINO_GPU, report, {})
    assert found == ARC_A770
    found, how = _match_opencl(choice("openvino", "x", device="GPU.2"), OPENVINO_GPU, report, {})
    assert found is None and "no OpenCL counterpart: OpenCL shows 2 GPU(s)" in how


def test_openvino_refuses_a_gpu_whose_names_disagree() -> None:
    picked = choice("openvino", ARC_A770.name, device="GPU.0", index=0)
    found, how = _match_opencl(picked, OPENVINO_GPU, opencl(ARC_A770, UHD770), {})
    assert found is None and "not the same device" in how


def test_only_gpus_of_the_backends_vendor_are_candidates() -> None:
    found, how = _match_opencl(choice("sycl", H200.name), INTEL_GPUS, opencl(H200, POCL), {})
    assert found is None and how == "OpenCL shows no GPU from this backend's vendor"
    found, _ = _match_opencl(choice("cuda", H200.name), ANY_VENDOR, opencl(H200, POCL), {})
    assert found == H200


def test_the_only_gpu_of_the_vendor_is_taken_when_the_name_differs() -> None:
    found, how = _match_opencl(choice("sycl", "Intel Graphics [0x56a0]"), INTEL_GPUS, opencl(ARC_A770, H200), {})
    assert found == ARC_A770 and "took the only OpenCL GPU of the vendor" in how
    found, _ = _match_opencl(choice("opencl", "some GPU"), ANY_VENDOR, opencl(ARC_A770), {})
    assert found is None  # no vendor to speak of: a name that does not match stays unmatched


def test_pci_from_opencl_first() -> None:
    found, how = _match_pci(ARC_A770, choice("sycl", ARC_A770.name), INTEL_GPUS, TWO_INTEL, None)
    assert found == ARC_PCI and how == "PCI 0000:03:00.0 from OpenCL (cl_khr_pci_bus_info)"
    found, _ = _match_pci(ARC_A770, choice("sycl", ARC_A770.name), INTEL_GPUS, NO_SYSFS, None)
    assert found is None  # the address is known, sysfs just does not show it


def test_pci_for_the_host_is_nothing() -> None:
    assert _match_pci(None, choice("cpu", "CPU"), None, TWO_INTEL, None) == (None, "")
    assert _match_pci(None, choice("openvino", "CPU", device="CPU"), OPENVINO_CPU, TWO_INTEL, None) == (None, "")


def test_pci_by_vendor_from_the_rule_then_the_profile() -> None:
    nvidia = gpu("0000:00:06.0", NVIDIA, integrated=None)
    sysfs = SysfsReport(gpus=(nvidia, IGPU_PCI), render_nodes=(), note="two")
    found, how = _match_pci(None, choice("sycl", "x"), INTEL_GPUS, sysfs, None)
    assert found == IGPU_PCI and "the only Intel GPU in sysfs" in how
    found, _ = _match_pci(None, choice("vulkan", "x"), AllocRule((NVIDIA,), "vulkan", "t"), sysfs, None)
    assert found == nvidia
    found, _ = _match_pci(None, choice("vulkan", "x"), ANY_VENDOR, sysfs, UHD770_PROFILE)
    assert found == IGPU_PCI
    found, how = _match_pci(None, choice("vulkan", "x"), ANY_VENDOR, sysfs, None)
    assert found is None and how == "PCI address unknown (2 candidate GPU(s) in sysfs)"


def test_openvino_gpu0_is_the_intel_igpu_in_sysfs() -> None:
    found, how = _match_pci(None, choice("openvino", "x", device="GPU"), OPENVINO_GPU, TWO_INTEL, None)
    assert found == IGPU_PCI and "GPU.0" in how
    found, _ = _match_pci(None, choice("openvino", "x", device="GPU.1"), OPENVINO_GPU, TWO_INTEL, None)
    assert found is None


def test_neo_filter_only_for_intels_runtime() -> None:
    assert _neo_filter("vulkan", UHD770, IGPU_PCI, IGPU_PCI.bdf, TWO_INTEL, opencl(UHD770, ARC_A770), {}) == (
        {},
        "",
        (),
    )
    assert _neo_filter("sycl", H200, None, "0000:00:06.0", TWO_INTEL, opencl(H200), {}) == ({}, "", ())


def test_neo_filter_not_needed_for_the_only_gpu() -> None:
    suggestion, note, warnings = _neo_filter("sycl", UHD770, IGPU_PCI, IGPU_PCI.bdf, ONLY_IGPU, opencl(UHD770), {})
    assert (suggestion, warnings) == ({}, ()) and "only GPU" in note


def test_neo_filter_pins_the_target() -> None:
    report = opencl(UHD770, ARC_A770)
    suggestion, note, warnings = _neo_filter("sycl", ARC_A770, ARC_PCI, ARC_PCI.bdf, TWO_INTEL, report, {})
    assert suggestion == {"NEOReadDebugKeys": "1", "FilterBdfPath": "0000:03:00.0"}
    assert note == "NEO filter: only 0000:03:00.0 stays visible to Intel's runtime" and warnings == ()


def test_neo_filter_names_openvinos_device_when_it_is_then_the_only_gpu() -> None:
    suggestion, note, _ = _neo_filter(
        "openvino", ARC_A770, ARC_PCI, ARC_PCI.bdf, TWO_INTEL, opencl(UHD770, ARC_A770), {}
    )
    assert suggestion["GGML_OPENVINO_DEVICE"] == "GPU" and "named GPU" in note
    suggestion, note, _ = _neo_filter("openvino", ARC_A770, ARC_PCI, ARC_PCI.bdf, TWO_INTEL, opencl(H200, ARC_A770), {})
    assert "GGML_OPENVINO_DEVICE" not in suggestion and "another vendor's GPU" in note


def test_neo_filter_without_an_address_warns() -> None:
    suggestion, _, warnings = _neo_filter("sycl", ARC_A770, None, None, TWO_INTEL, opencl(UHD770, ARC_A770), {})
    assert suggestion == {} and "cannot suggest FilterBdfPath" in warnings[0]


def test_neo_filter_set_in_the_environment() -> None:
    report = opencl(UHD770, ARC_A770)
    hiding = {"NEOReadDebugKeys": "1", "FilterBdfPath": "0000:00:02.0"}
    _, _, warnings = _neo_filter("sycl", ARC_A770, ARC_PCI, ARC_PCI.bdf, TWO_INTEL, report, hiding)
    assert warnings == ("FilterBdfPath=0000:00:02.0 is set and hides the target 0000:03:00.0",)
    _, _, warnings = _neo_filter(
        "sycl", ARC_A770, ARC_PCI, ARC_PCI.bdf, TWO_INTEL, report, {**hiding, "NEOReadDebugKeys": "0"}
    )
    assert warnings == ()  # without NEOReadDebugKeys=1 the runtime ignores it
    _, note, warnings = _neo_filter(
        "sycl", ARC_A770, ARC_PCI, ARC_PCI.bdf, TWO_INTEL, report, {"FilterBdfPath": "03:00.0"}
    )
    assert warnings == () and note.endswith("(already set in the environment)")
