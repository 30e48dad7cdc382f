"""llama_listing: llama.cpp's --list-devices / --version text and the device a command line asks for."""

from __future__ import annotations

import pytest

from safe_llama.cmdline.llama_args import parse
from safe_llama.device.llama_listing import (
    MIB,
    DeviceRequest,
    parse_list_devices,
    parse_version,
    resolve_request,
)
from tests import FIXTURES


def _read(name: str) -> str:
    return (FIXTURES / name).read_text()


def test_h200_real_output() -> None:
    listed = parse_list_devices(_read("nvidia-h200-cuda/list-devices.txt"))
    assert listed.problem is None
    (device,) = listed.devices
    assert device.name == "CUDA0"
    assert device.backend == "cuda"
    assert device.index == 0
    assert device.description == device.hardware_name == "NVIDIA H200"
    assert device.total_bytes == 143155 * MIB
    assert device.free_bytes == 142629 * MIB
    assert device.openvino_device is None and device.selected is None


def test_cpu_build_lists_none() -> None:
    listed = parse_list_devices(_read("list-devices/cpu-build.txt"))
    assert listed.devices == ()
    assert listed.problem is None


def test_openvino_build_real_output() -> None:
    (device,) = parse_list_devices(_read("list-devices/openvino-cpu.txt")).devices
    assert (device.name, device.backend, device.openvino_device, device.selected) == (
        "OPENVINO0",
        "openvino",
        "CPU",
        True,
    )
    assert device.hardware_name == "AMD EPYC"
    assert device.total_bytes == 24105 * MIB


def test_openvino_build_real_refusal() -> None:
    """GGML_OPENVINO_DEVICE=GPU on a machine without one: llama.cpp aborts and names what it has."""
    listed = parse_list_devices("", _read("list-devices/openvino-gpu-refused.err"))
    assert listed.devices == ()
    assert listed.openvino_available == (("CPU", "AMD EPYC"),)
    assert listed.problem == (
        "refused GGML_OPENVINO_DEVICE=GPU: it is not an available OpenVINO device (available: CPU)"
    )


def test_openvino_igpu_dgpu() -> None:
    listed = parse_list_devices(_read("list-devices/openvino-igpu-dgpu.txt"))
    assert [(d.name, d.openvino_device, d.selected) for d in listed.devices] == [
        ("OPENVINO0", "CPU", False),
        ("OPENVINO1", "GPU.0", True),
        ("OPENVINO2", "GPU.1", False),
    ]
    igpu = listed.devices[1]
    assert igpu.hardware_name == "Intel(R) UHD Graphics 770 (iGPU)"
    assert igpu.backend == "openvino"
    assert igpu.total_bytes == 25548 * MIB


def test_parentheses_and_colons_in_descriptions() -> None:
    vulkan = parse_list_devices(_read("list-devices/vulkan-igpu-dgpu.txt")).devices
    assert [(d.name, d.description) for d in vulkan] == [
        ("Vulkan0", "NVIDIA GeForce RTX 4090"),
        ("Vulkan1", "Intel(R) UHD Graphics 770 (ADL-S GT1)"),
    ]
    sycl, rpc = parse_list_devices(_read("list-devices/sycl-rpc.txt")).devices
    assert (sycl.backend, sycl.description) == ("sycl", "Intel(R) Arc(TM) A770 Graphics")
    assert (rpc.name, rpc.backend, rpc.description) == ("RPC0", "rpc", "192.168.1.10:50052")
    (opencl,) = parse_list_devices(_read("list-devices/opencl.txt")).devices
    assert (opencl.name, opencl.backend, opencl.index) == ("GPUOpenCL", "opencl", None)


def test_no_header_is_a_problem_naming_the_last_error_line() -> None:
    listed = parse_list_devices("", "error while loading shared libraries: libopenvino.so.2540\n")
    assert listed.devices == ()
    assert listed.problem is not None
    assert "libopenvino" in listed.problem


def test_openvino_refusal_lists_what_it_offers() -> None:
    stderr = (
        "/src/ggml-openvino-extra.cpp:84: GGML OpenVINO Backend: "
        "GGML_OPENVINO_DEVICE=GPU.1 is not available. "
        "Set it to one of the available OpenVINO devices:\n"
        "  CPU: 12th Gen Intel(R) Core(TM) i7-12700K\n"
        "  GPU: Intel(R) UHD Graphics 770 (iGPU)\n"
    )
    listed = parse_list_devices("", stderr)
    assert listed.openvino_available == (
        ("CPU", "12th Gen Intel(R) Core(TM) i7-12700K"),
        ("GPU", "Intel(R) UHD Graphics 770 (iGPU)"),
    )
    assert listed.problem is not None
    assert "GGML_OPENVINO_DEVICE=GPU.1" in listed.problem
    assert "CPU, GPU" in listed.problem


def test_version_of_the_pinned_build() -> None:
    version = parse_version(_read("list-devices/cpu-build-version.txt"))
    assert version is not None
    assert (version.version, version.build, version.commit) == ("0.6.0-dev", 0, "unknown")
    assert (version.compiler, version.target) == ("GNU 12.2.0", "Linux x86_64")


def test_version_absent() -> None:
    assert parse_version("error: unknown argument: --version\n") is None


@pytest.mark.parametrize(
    ("args", "env", "expected"),
    [
        pytest.param([], {}, DeviceRequest(None, "default", None), id="nothing"),
        pytest.param(["-dev", "CUDA0"], {}, DeviceRequest(("CUDA0",), "--device", None), id="short"),
        pytest.param(
            ["--device", "CUDA0,CUDA1", "-c", "4096"],
            {},
            DeviceRequest(("CUDA0", "CUDA1"), "--device", None),
            id="list",
        ),
        pytest.param(["--device=Vulkan1"], {}, DeviceRequest(("Vulkan1",), "--device", None), id="equals"),
        pytest.param(
            ["-dev", "CUDA0", "-dev", "CUDA1"],
            {},
            DeviceRequest(("CUDA1",), "--device", None),
            id="last-wins",
        ),
        pytest.param([], {"LLAMA_ARG_DEVICE": "SYCL0"}, DeviceRequest(("SYCL0",), "LLAMA_ARG_DEVICE", None), id="env"),
        pytest.param(
            ["-dev", "none"],
            {"LLAMA_ARG_DEVICE": "SYCL0"},
            DeviceRequest(("none",), "--device", None),
            id="flag-beats-env",
        ),
        pytest.param([], {"GGML_OPENVINO_DEVICE": "GPU.1"}, DeviceRequest(None, "default", "GPU.1"), id="openvino"),
        pytest.param(
            ["-p", "-dev", "-c", "512"], {}, DeviceRequest(None, "default", None), id="a prompt that reads -dev"
        ),
        pytest.param(
            ["-p", "-dev", "-dev", "Vulkan0"], {}, DeviceRequest(("Vulkan0",), "--device", None), id="prompt, then -dev"
        ),
        pytest.param(
            ["-dev", "Vulkan0", "-p", "-dev", "-n", "4"],
            {},
            DeviceRequest(("Vulkan0",), "--device", None),
            id="-dev, then prompt",
        ),
        pytest.param(["-p", "--device=Vulkan0"], {}, DeviceRequest(None, "default", None), id="a prompt with ="),
        pytest.param(["-dev", "Vulkan0"], {}, DeviceRequest(("Vulkan0",), "--device", None), id="-dev Vulkan0"),
        pytest.param(["--device=Vulkan0"], {}, DeviceRequest(("Vulkan0",), "--device", None), id="--device=Vulkan0"),
        pytest.param(
            ["--device=Vulkan0", "-dev", "CUDA0"], {}, DeviceRequest(("CUDA0",), "--device", None), id="= then -dev"
        ),
        pytest.param(
            ["-dev", "CUDA0", "--device=Vulkan0"], {}, DeviceRequest(("Vulkan0",), "--device", None), id="-dev then ="
        ),
        pytest.param(["-c", "512", "-dev"], {}, DeviceRequest(None, "default", None), id="-dev without its value"),
        pytest.param([], {"LLAMA_ARG_DEVICE": ""}, DeviceRequest(None, "default", None), id="empty env"),
        pytest.param(
            ["--device=Vulkan0"],
            {"LLAMA_ARG_DEVICE": "SYCL0"},
            DeviceRequest(("Vulkan0",), "--device", None),
            id="= beats env",
        ),
    ],
)
def test_resolve_request(args: list[str], env: dict[str, str], expected: DeviceRequest) -> None:
    """Read from the command line as llama-completion parses it (-p is one of its options)."""
    assert resolve_request(parse("completion", args, env), env) == expected
