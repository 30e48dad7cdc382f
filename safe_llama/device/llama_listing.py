"""Parsing of llama.cpp's `--list-devices` and `--version` output, and of the device a command line targets.

Owns those text formats, taken from the pinned source: common/arg.cpp (common_print_available_devices,
`-dev/--device`), each backend's device description (its names: backends/), common/build-info.cpp.in. Pure: takes
text and values, returns values; runs nothing and reads no files. Must not read a command line itself: the
device a command line asks for is read from its parse (cmdline/llama_args.parse).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

from safe_llama.backends.openvino import DEVICE_ENV
from safe_llama.backends.registry import backend_named, backend_of

if TYPE_CHECKING:
    from safe_llama.cmdline.llama_args import CommandLine

MIB = 1024 * 1024

# `  %s: %s (%zu MiB, %zu MiB free)`; the description may itself hold parentheses and colons, and RPC
# names hold a colon ("RPC0[host:port]") but never ": ", so the name ends at the first ": ".
_DEVICE_LINE = re.compile(r"^  (?P<name>\S+?): (?P<desc>.*) \((?P<total>\d+) MiB, (?P<free>\d+) MiB free\)\s*$")
# The OpenVINO backend aborts --list-devices when GGML_OPENVINO_DEVICE names a device it does not have.
_OPENVINO_UNAVAILABLE = re.compile(r"GGML_OPENVINO_DEVICE=(?P<req>\S+) is not available\.")
_OPENVINO_AVAILABLE_LINE = re.compile(r"^  (?P<ov>[A-Z][A-Z0-9.]*): (?P<full>.+)$")
_VERSION = re.compile(r"^version: (?P<version>\S+)(?: \(build (?P<build>\d+), commit (?P<commit>[^)]*)\))?")
_BUILT_WITH = re.compile(r"^built with (?P<compiler>.*) for (?P<target>.+?)\s*$")


@dataclass(frozen=True)
class LlamaDevice:
    """One line of `--list-devices`. Sizes are llama.cpp's whole MiB, converted back to bytes."""

    name: str  # OPENVINO0, CUDA0, Vulkan1, GPUOpenCL
    description: str  # as printed
    backend: str  # openvino, cuda, vulkan, sycl, ... ("other" for an unknown prefix)
    index: int | None  # the number at the end of the name
    total_bytes: int
    free_bytes: int
    hardware_name: str  # the description without OpenVINO's "GGML_OPENVINO_DEVICE=... - " wrapper
    openvino_device: str | None = None  # OpenVINO's own id: CPU, GPU, GPU.1, NPU
    selected: bool | None = None  # OpenVINO only: the device GGML_OPENVINO_DEVICE selects


@dataclass(frozen=True)
class ListedDevices:
    """What `--list-devices` said: the devices, or why none could be read."""

    devices: tuple[LlamaDevice, ...]
    problem: str | None = None  # why the output could not be read, or what llama.cpp refused
    # From an OpenVINO abort: the ids it offers instead, each with its full name.
    openvino_available: tuple[tuple[str, str], ...] = ()


@dataclass(frozen=True)
class LlamaVersion:
    """What `--version` said: the version, build, commit, compiler and target."""

    version: str  # "0.6.0-dev"
    build: int | None
    commit: str | None
    compiler: str | None
    target: str | None


@dataclass(frozen=True)
class DeviceRequest:
    """Which device a llama.cpp command line asks for (see resolve_request)."""

    devices: tuple[str, ...] | None  # -dev/--device list; None = not given (llama.cpp picks)
    devices_from: str  # "--device", "LLAMA_ARG_DEVICE" or "default"
    openvino_device: str | None  # GGML_OPENVINO_DEVICE; None = unset (OpenVINO then picks CPU)


def _index_of(name: str) -> int | None:
    match = re.search(r"(\d+)$", name.split("[", 1)[0])
    return int(match.group(1)) if match else None


def parse_list_devices(stdout: str, stderr: str = "") -> ListedDevices:
    """Read `<tool> --list-devices` output. A missing header or an OpenVINO abort becomes `problem`."""
    lines = stdout.splitlines()
    if "Available devices:" not in (line.strip() for line in lines):
        unavailable = _OPENVINO_UNAVAILABLE.search(stderr)
        if unavailable:
            offered = tuple(
                (m.group("ov"), m.group("full"))
                for m in map(_OPENVINO_AVAILABLE_LINE.match, stderr.splitlines()[1:])
                if m
            )
            ids = ", ".join(ov for ov, _ in offered) or "none listed"
            return ListedDevices(
                devices=(),
                problem=f"refused GGML_OPENVINO_DEVICE={unavailable.group('req')}: "
                f"it is not an available OpenVINO device (available: {ids})",
                openvino_available=offered,
            )
        last = next((line for line in reversed(stderr.splitlines()) if line.strip()), "")
        return ListedDevices(devices=(), problem=f"no 'Available devices:' in the output{': ' + last if last else ''}")
    devices = []
    for line in lines:
        match = _DEVICE_LINE.match(line)
        if not match:
            continue
        name, description = match.group("name"), match.group("desc")
        device = LlamaDevice(
            name=name,
            description=description,
            backend=backend_of(name),
            index=_index_of(name),
            total_bytes=int(match.group("total")) * MIB,
            free_bytes=int(match.group("free")) * MIB,
            hardware_name=description,
        )
        own_device = backend_named(device.backend).own_device_in_description
        wrapped = re.match(own_device, description) if own_device else None
        if wrapped:
            device = replace(
                device,
                hardware_name=wrapped.group("full"),
                openvino_device=wrapped.group("ov"),
                selected=wrapped.group("selected") is not None,
            )
        devices.append(device)
    return ListedDevices(devices=tuple(devices))


def parse_version(text: str) -> LlamaVersion | None:
    """Read `<tool> --version` (on stderr): `version: V (build N, commit C)`, `built with X for T`."""
    version = build = commit = compiler = target = None
    for line in text.splitlines():
        line = line.strip()
        if (match := _VERSION.match(line)) is not None:
            version = match.group("version")
            build = int(match.group("build")) if match.group("build") else None
            commit = match.group("commit")
        elif (match := _BUILT_WITH.match(line)) is not None:
            compiler, target = match.group("compiler"), match.group("target")
    if version is None:
        return None
    return LlamaVersion(version=version, build=build, commit=commit, compiler=compiler, target=target)


def resolve_request(cmd: CommandLine, env: Mapping[str, str]) -> DeviceRequest:
    """The device list a parsed llama.cpp command line asks for. The parse reads it as llama.cpp does: the
    last `-dev`/`--device` wins, a flag beats LLAMA_ARG_DEVICE, and a word that is another option's value
    (`-p -dev`: a prompt) is no device choice. `none` means no offload (CPU only).

    `--device=NAME` is read too, as it always was here, though llama.cpp rejects it (`invalid argument`, a
    usage error): a word the parse rejects, later than any -dev/--device.
    """
    value: str | None = None
    source, at = "default", -1
    setting = cmd.get("--device")
    if setting is not None and isinstance(setting.value, str):
        if setting.source == "argv":
            value, source, at = setting.value, "--device", setting.argv_index or 0
        elif setting.value:  # an empty LLAMA_ARG_DEVICE asks for nothing
            value, source = setting.value, setting.source
    for i in cmd.rejected_at:
        if i > at and cmd.argv[i].startswith("--device="):
            value, source, at = cmd.argv[i].split("=", 1)[1], "--device", i
    openvino = env.get(DEVICE_ENV) or None
    if value is None:
        return DeviceRequest(devices=None, devices_from="default", openvino_device=openvino)
    names = tuple(part.strip() for part in value.split(",") if part.strip())
    return DeviceRequest(devices=names, devices_from=source, openvino_device=openvino)
