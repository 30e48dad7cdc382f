"""target_device: the pure mapping from a request to a device and its limits.

Plain values in, values out. The OpenCL devices are written from real reports (pocl here, the H200
fixture, the seed's UHD 770 figure); the iGPU+dGPU machines are the seed's situation.
"""

from __future__ import annotations

import pytest

from safe_llama.backends.backend import AllocRule, EnvCap
from safe_llama.device.limits import NOTHING_DECLARED, DeclaredLimits, DeviceProfile
from safe_llama.device.llama_listing import MIB, DeviceRequest, ListedDevices, parse_list_devices
from safe_llama.device.probe_opencl import OpenCLDevice, OpenCLReport
from safe_llama.device.probe_sysfs import PciGpu, SysfsReport
from safe_llama.device.target_device import _max_alloc, parse_profile, resolve_target
from safe_llama.errors import ExitStatus, SafeLlamaError
from tests import FIXTURES

GIB = 1 << 30
UHD770_MAX_ALLOC = 4294959104  # the seed: CL_DEVICE_MAX_MEM_ALLOC_SIZE of a UHD 770
INTEL_PLATFORM = ("Intel(R) OpenCL Graphics", "Intel(R) Corporation")


def cl_device(
    name: str,
    *,
    vendor_id: int,
    max_alloc: int,
    memory: int,
    unified: bool | None,
    bdf: str | None,
    platform: tuple[str, str] = INTEL_PLATFORM,
    device_type: str = "GPU",
) -> OpenCLDevice:
    return OpenCLDevice(
        platform=platform[0],
        platform_vendor=platform[1],
        name=name,
        vendor="Intel(R) Corporation" if vendor_id == 0x8086 else "NVIDIA Corporation",
        vendor_id=vendor_id,
        device_type=device_type,
        max_mem_alloc_size=max_alloc,
        global_mem_size=memory,
        host_unified_memory=unified,
        driver_version="1",
        device_version="OpenCL 3.0",
        pci_bdf=bdf,
        pci_note="cl_khr_pci_bus_info" if bdf else "the driver lacks cl_khr_pci_bus_info",
    )


UHD770 = cl_device(
    "Intel(R) UHD Graphics 770",
    vendor_id=0x8086,
    max_alloc=UHD770_MAX_ALLOC,
    memory=25548 * MIB,
    unified=True,
    bdf="0000:00:02.0",
)
ARC_A770 = cl_device(
    "Intel(R) Arc(TM) A770 Graphics",
    vendor_id=0x8086,
    max_alloc=4 * GIB - 8192 * 2,
    memory=15930 * MIB,
    unified=False,
    bdf="0000:03:00.0",
)
# The H200 fixture's OpenCL report (NVIDIA's driver, cl_khr_pci_bus_info present).
H200 = cl_device(
    "NVIDIA H200",
    vendor_id=0x10DE,
    max_alloc=37527470080,
    memory=150109880320,
    unified=False,
    bdf="0000:00:06.0",
    platform=("NVIDIA CUDA", "NVIDIA Corporation"),
)
POCL = cl_device(
    "pthread-skylake-avx512-AMD EPYC",
    vendor_id=0x8086,
    max_alloc=512 << 20,
    memory=2 * GIB,
    unified=True,
    bdf=None,
    platform=("Portable Computing Language", "The pocl project"),
    device_type="CPU",
)


def opencl(*devices: OpenCLDevice) -> OpenCLReport:
    return OpenCLReport(devices=devices, status="ok" if devices else "no-platforms", note="test")


def gpu(bdf: str, vendor_id: int, *, integrated: bool | None) -> PciGpu:
    vendor = {0x8086: "Intel", 0x10DE: "NVIDIA"}[vendor_id]
    return PciGpu(
        bdf=bdf,
        class_code=0x030000,
        vendor_id=vendor_id,
        device_id=0x1,
        vendor=vendor,
        compute=True,
        driver="i915",
        boot_vga=None,
        integrated=integrated,
        render_nodes=(),
    )


IGPU_PCI = gpu("0000:00:02.0", 0x8086, integrated=True)
ARC_PCI = gpu("0000:03:00.0", 0x8086, integrated=False)
NO_SYSFS = SysfsReport(gpus=(), render_nodes=(), note="none")
TWO_INTEL = SysfsReport(gpus=(IGPU_PCI, ARC_PCI), render_nodes=(), note="two")
ONLY_IGPU = SysfsReport(gpus=(IGPU_PCI,), render_nodes=(), note="one")

UHD770_PROFILE = DeviceProfile(
    key="intel-uhd-770",
    path="configs/devices/intel-uhd-770.toml",
    name="Intel UHD Graphics 770",
    match=("UHD Graphics 770",),
    vendor_id=0x8086,
    backend="openvino",
    integrated=True,
    max_alloc_bytes=UHD770_MAX_ALLOC,
    memory_bytes=None,
)


def listed(name: str) -> ListedDevices:
    return parse_list_devices((FIXTURES / name).read_text())


def request(devices: tuple[str, ...] | None = None, openvino: str | None = None) -> DeviceRequest:
    return DeviceRequest(devices=devices, devices_from="--device" if devices else "default", openvino_device=openvino)


def test_seed_igpu_behind_openvino_with_a_second_gpu() -> None:
    """The seed: OpenVINO on a UHD 770 next to another GPU. Its limit, and the filter that pins it."""
    target = resolve_target(
        request=request(openvino="GPU.0"),
        listed=listed("list-devices/openvino-igpu-dgpu.txt"),
        opencl=opencl(ARC_A770, UHD770),  # the ICD loader's order is not OpenVINO's
        sysfs=TWO_INTEL,
        host_total=32 * GIB,
        env={},
    )
    assert (target.llama_name, target.backend, target.backend_device) == ("OPENVINO1", "openvino", "GPU.0")
    assert target.requested_by == "GGML_OPENVINO_DEVICE"
    assert target.opencl == UHD770
    assert target.limits_alloc
    assert target.max_alloc_bytes is not None
    assert (target.max_alloc_bytes.value, target.max_alloc_bytes.source) == (UHD770_MAX_ALLOC, "probed")
    assert target.memory_bytes is not None and target.memory_bytes.value == 25548 * MIB
    assert target.integrated is not None and target.integrated.value is True
    assert target.shares_host_memory and not target.on_host
    assert target.pci_bdf == "0000:00:02.0"
    assert target.neo_filter == {
        "NEOReadDebugKeys": "1",
        "FilterBdfPath": "0000:00:02.0",
        "GGML_OPENVINO_DEVICE": "GPU",
    }
    assert target.warnings == ()


def test_the_discrete_gpu_gets_its_own_filter() -> None:
    target = resolve_target(
        request=request(("OPENVINO2",), openvino="GPU.1"),
        listed=parse_list_devices(
            (FIXTURES / "list-devices/openvino-igpu-dgpu.txt")
            .read_text()
            .replace("GPU.0 (selected)", "GPU.0")
            .replace("GPU.1 -", "GPU.1 (selected) -")
        ),
        opencl=opencl(UHD770, ARC_A770),
        sysfs=TWO_INTEL,
        host_total=32 * GIB,
        env={},
    )
    assert target.opencl == ARC_A770
    assert target.integrated is not None and target.integrated.value is False
    assert not target.shares_host_memory
    assert target.neo_filter["FilterBdfPath"] == "0000:03:00.0"


def test_a_non_selected_openvino_device_is_a_warning() -> None:
    target = resolve_target(
        request=request(("OPENVINO2",)),
        listed=listed("list-devices/openvino-igpu-dgpu.txt"),
        opencl=opencl(UHD770, ARC_A770),
        sysfs=TWO_INTEL,
        host_total=32 * GIB,
        env={},
    )
    assert any("set GGML_OPENVINO_DEVICE=GPU.1" in w for w in target.warnings)


def test_filter_already_set_elsewhere_is_a_warning() -> None:
    target = resolve_target(
        request=request(openvino="GPU.0"),
        listed=listed("list-devices/openvino-igpu-dgpu.txt"),
        opencl=opencl(UHD770, ARC_A770),
        sysfs=TWO_INTEL,
        host_total=32 * GIB,
        env={"NEOReadDebugKeys": "1", "FilterBdfPath": "0000:03:00.0"},
    )
    assert target.warnings == ("FilterBdfPath=0000:03:00.0 is set and hides the target 0000:00:02.0",)


def test_igpu_alone_needs_no_filter() -> None:
    target = resolve_target(
        request=request(openvino="GPU"),
        listed=None,
        opencl=opencl(UHD770),
        sysfs=ONLY_IGPU,
        host_total=32 * GIB,
        env={},
    )
    assert target.neo_filter == {}
    assert target.max_alloc_bytes is not None and target.max_alloc_bytes.value == UHD770_MAX_ALLOC
    assert "NEO filter not needed" in target.mapping_note


def test_no_opencl_falls_back_to_sysfs_and_a_profile_matched_by_name() -> None:
    """A container with /dev/dri but no OpenCL ICD: OpenVINO still names the GPU."""
    target = resolve_target(
        request=request(openvino="GPU.0"),
        listed=listed("list-devices/openvino-igpu-dgpu.txt"),
        opencl=opencl(),
        sysfs=TWO_INTEL,
        host_total=32 * GIB,
        profiles=(UHD770_PROFILE,),
        env={},
    )
    assert target.opencl is None
    assert target.max_alloc_bytes is not None
    assert target.max_alloc_bytes.source == "profile"
    assert target.max_alloc_bytes.value == UHD770_MAX_ALLOC
    assert target.pci_bdf == "0000:00:02.0"  # OpenVINO numbers the Intel iGPU GPU.0
    assert target.neo_filter["FilterBdfPath"] == "0000:00:02.0"


def test_unknown_limit_is_said() -> None:
    target = resolve_target(
        request=request(openvino="GPU.0"),
        listed=listed("list-devices/openvino-igpu-dgpu.txt"),
        opencl=opencl(),
        sysfs=NO_SYSFS,
        host_total=32 * GIB,
        env={},
    )
    assert target.limits_alloc and target.max_alloc_bytes is None
    assert any("--max-alloc" in w for w in target.warnings)


def test_declared_beats_probed_and_says_so() -> None:
    target = resolve_target(
        request=request(openvino="GPU.0"),
        listed=listed("list-devices/openvino-igpu-dgpu.txt"),
        opencl=opencl(UHD770),
        sysfs=ONLY_IGPU,
        host_total=32 * GIB,
        declared=DeclaredLimits(max_alloc_bytes=2 * GIB, memory_bytes=8 * GIB, integrated=False),
        env={},
    )
    assert target.max_alloc_bytes is not None and target.memory_bytes is not None
    assert (target.max_alloc_bytes.value, target.max_alloc_bytes.source) == (2 * GIB, "declared")
    assert (target.memory_bytes.value, target.memory_bytes.source) == (8 * GIB, "declared")
    assert target.integrated is not None and target.integrated.source == "declared"


def test_profile_alone_plans_for_another_machine() -> None:
    target = resolve_target(
        request=request(),
        listed=None,
        opencl=opencl(POCL),
        sysfs=NO_SYSFS,
        host_total=32 * GIB,
        profile=UHD770_PROFILE,
        env={},
    )
    assert (target.backend, target.backend_device, target.requested_by) == ("openvino", "GPU", "profile")
    assert target.max_alloc_bytes is not None
    assert (target.max_alloc_bytes.value, target.max_alloc_bytes.source) == (UHD770_MAX_ALLOC, "profile")
    assert target.integrated is not None and target.integrated.source == "profile"
    assert target.opencl is None  # pocl is a CPU device: never mistaken for the iGPU


def test_h200_cuda_has_no_allocation_cap() -> None:
    target = resolve_target(
        request=request(),
        listed=listed("nvidia-h200-cuda/list-devices.txt"),
        opencl=opencl(H200),
        sysfs=NO_SYSFS,
        host_total=128 * 10**9,
        env={},
    )
    assert (target.llama_name, target.backend) == ("CUDA0", "cuda")
    assert target.opencl == H200
    assert target.pci_bdf == "0000:00:06.0"
    assert not target.limits_alloc and target.max_alloc_bytes is None  # OpenCL's quarter does not apply
    assert target.memory_bytes is not None and target.memory_bytes.value == 143155 * MIB
    assert target.memory_free_bytes is not None and target.memory_free_bytes.value == 142629 * MIB
    assert target.integrated is not None and target.integrated.value is False
    assert target.neo_filter == {}


def test_identical_gpus_map_by_pci_order_unless_renumbered() -> None:
    second = cl_device(
        "NVIDIA H200",
        vendor_id=0x10DE,
        max_alloc=1,
        memory=1,
        unified=False,
        bdf="0000:00:07.0",
        platform=("NVIDIA CUDA", "NVIDIA Corporation"),
    )
    listing = parse_list_devices(
        "Available devices:\n  CUDA0: NVIDIA H200 (1 MiB, 1 MiB free)\n  CUDA1: NVIDIA H200 (1 MiB, 1 MiB free)\n"
    )
    target = resolve_target(
        request=request(("CUDA1",)),
        listed=listing,
        opencl=opencl(second, H200),
        sysfs=NO_SYSFS,
        host_total=None,
        env={},
    )
    assert target.pci_bdf == "0000:00:07.0"
    assert "position 1" in target.mapping_note
    renumbered = resolve_target(
        request=request(("CUDA1",)),
        listed=listing,
        opencl=opencl(second, H200),
        sysfs=NO_SYSFS,
        host_total=None,
        env={"CUDA_VISIBLE_DEVICES": "1,0"},
    )
    assert renumbered.opencl is None
    assert "CUDA_VISIBLE_DEVICES" in renumbered.mapping_note


def test_device_none_is_the_host() -> None:
    target = resolve_target(
        request=request(("none",)),
        listed=listed("nvidia-h200-cuda/list-devices.txt"),
        opencl=opencl(H200),
        sysfs=NO_SYSFS,
        host_total=24 * GIB,
        env={},
    )
    assert (target.backend, target.llama_name, target.limits_alloc) == ("cpu", None, False)
    assert target.memory_bytes is not None and target.memory_bytes.value == 24 * GIB
    assert target.on_host and target.shares_host_memory and target.integrated is None


def test_a_device_llama_cpp_does_not_have() -> None:
    target = resolve_target(
        request=request(("CUDA3",)),
        listed=listed("nvidia-h200-cuda/list-devices.txt"),
        opencl=opencl(H200),
        sysfs=NO_SYSFS,
        host_total=None,
        env={},
    )
    assert any("CUDA3 is not among llama.cpp's devices (CUDA0)" in w for w in target.warnings)


def test_vulkan_limit_is_not_guessed_from_opencl() -> None:
    target = resolve_target(
        request=request(("Vulkan1",)),
        listed=listed("list-devices/vulkan-igpu-dgpu.txt"),
        opencl=opencl(UHD770),
        sysfs=ONLY_IGPU,
        host_total=None,
        env={},
    )
    assert target.opencl == UHD770  # "Intel(R) UHD Graphics 770 (ADL-S GT1)" by name prefix
    assert target.limits_alloc and target.max_alloc_bytes is None
    assert target.neo_filter == {}  # Vulkan does not go through Intel's compute runtime


def test_parse_profile_checks_types() -> None:
    profile = parse_profile("x", "x.toml", {"max_alloc_bytes": 5, "integrated": True, "match": ["X"]})
    assert (profile.max_alloc_bytes, profile.integrated, profile.name) == (5, True, "x")
    for bad in (
        {"max_alloc_bytes": "4G"},
        {"integrated": 1},
        {"max_alloc_bytes": True},
        {"match": [3]},
        {"memory_bytes": -1},
    ):
        with pytest.raises(SafeLlamaError) as err:
            parse_profile("x", "x.toml", bad)
        assert err.value.status == ExitStatus.BAD_CONFIG
        assert "x.toml" in err.value.message


def test_an_environment_cap_lowers_a_probed_limit_only() -> None:
    rule = AllocRule((), "opencl", "test")
    small = EnvCap("SMALL", 1 << 20, "a switch caps one buffer at 1 MiB")
    applies, limit = _max_alloc(rule, UHD770, NOTHING_DECLARED, None, None, caps=[small])
    assert applies and limit is not None and limit.value == 1 << 20 and limit.source == "probed"
    assert limit.detail.startswith("a switch caps one buffer at 1 MiB (SMALL is set; OpenCL CL_DEVICE_MAX")
    declared = DeclaredLimits(max_alloc_bytes=1 << 30)
    assert _max_alloc(rule, UHD770, declared, None, None, caps=[small])[1].value == 1 << 30  # type: ignore[union-attr]
    huge = EnvCap("HUGE", UHD770.max_mem_alloc_size * 2, "above the probe")
    assert _max_alloc(rule, UHD770, NOTHING_DECLARED, None, None, caps=[huge])[1].value == UHD770.max_mem_alloc_size  # type: ignore[union-attr]
