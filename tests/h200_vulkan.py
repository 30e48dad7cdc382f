"""The H200's recorded probes under Vulkan (tests/fixtures/nvidia-h200-vulkan/) replayed as a launch maps them:
the device and the host, for the tests that plan against that machine."""

from __future__ import annotations

import json
from typing import Any

from safe_llama.device.host_budget import HostBudget
from safe_llama.device.limits import Sourced
from safe_llama.device.llama_listing import DeviceRequest, parse_list_devices
from safe_llama.device.probe_free import FreeReading, reading_from_dict
from safe_llama.device.probe_opencl import report_from_dict as opencl_from_dict
from safe_llama.device.probe_sysfs import SysfsReport
from safe_llama.device.probe_vulkan import report_from_dict as vulkan_from_dict
from safe_llama.device.target_device import TargetDevice, resolve_target
from tests import FIXTURES

FOLDER = FIXTURES / "nvidia-h200-vulkan"


def recorded_probes() -> dict[str, Any]:
    """safe-llama-devices.json: what `safe-llama devices --json` probed there."""
    data: dict[str, Any] = json.loads((FOLDER / "safe-llama-devices.json").read_text())
    return data


def replayed(recorded: dict[str, Any], free: list[FreeReading] | None = None) -> tuple[TargetDevice, HostBudget]:
    """Vulkan0 as the default request maps it from the recorded listing and probes (free: the vendor readings,
    the recorded ones unless given), and the host budget of MemAvailable."""
    device = resolve_target(
        request=DeviceRequest(None, "default", None),
        listed=parse_list_devices((FOLDER / "list-devices.txt").read_text()),
        opencl=opencl_from_dict(recorded["opencl"]), sysfs=SysfsReport((), (), "not replayed"),
        host_total=recorded["host"]["total"]["value"], env={},
        free_now=[reading_from_dict(r) for r in recorded["free"]["readings"]] if free is None else free,
        vulkan=vulkan_from_dict(recorded["vulkan"]),
    )  # fmt: skip
    available = Sourced(int(recorded["host"]["available"]["value"]), "probed", "/proc/meminfo: MemAvailable")
    host = HostBudget(total=Sourced(int(recorded["host"]["total"]["value"]), "probed", "MemTotal"),
                      available=available, cgroup_max=None, cgroup_current=None, rlimit_as=None,
                      budget_bytes=available, note="replayed")  # fmt: skip
    return device, host
