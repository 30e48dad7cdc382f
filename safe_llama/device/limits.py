"""The vocabulary of device/: a value with its source (probed, declared, profile, learned), the limits a user
declares, a device profile, the llama.cpp device chosen for a command line, and the vendor constants.

Owns those types; must not probe nor decide anything."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Generic, Literal, TypeVar

from safe_llama.device.llama_listing import LlamaDevice

T = TypeVar("T")


Source = Literal["probed", "declared", "profile", "learned"]  # learned: read from a failed start's message


INTEL = 0x8086
NVIDIA = 0x10DE


INTEL_PLATFORM_VENDOR = "Intel(R) Corporation"  # OpenVINO's GPU plugin puts this platform first


@dataclass(frozen=True)
class Sourced(Generic[T]):
    """A value and where it came from: probed on this machine, declared on the command line, or a profile."""

    value: T
    source: Source
    detail: str


@dataclass(frozen=True)
class DeclaredLimits:
    """Limits the user states instead of (or over) what the probes see. Declared values always win."""

    profile: str | None = None  # a name in configs/devices/ (or ~/.config/safe-llama/devices/), or a path
    max_alloc_bytes: int | None = None
    memory_bytes: int | None = None
    integrated: bool | None = None
    host_memory_bytes: int | None = None  # the host budget, e.g. when planning for another machine
    # what each RPC worker (host:port) may hold: its cgroup cap or GPU memory, which rpc-server does not report
    rpc_memory: tuple[tuple[str, int], ...] = ()
    origins: tuple[tuple[str, str], ...] = ()  # (setting, where it was set) when not its own option

    def origin(self, setting: str, option: str) -> str:
        return dict(self.origins).get(setting, option)


NOTHING_DECLARED = DeclaredLimits()


@dataclass(frozen=True)
class DeviceProfile:
    """A device profile (configs/devices/*.toml): the devices it describes and the limits it declares."""

    key: str  # file name without .toml
    path: str
    name: str
    match: tuple[str, ...]  # substrings of a device name this profile describes
    vendor_id: int | None
    backend: str | None
    integrated: bool | None
    max_alloc_bytes: int | None
    memory_bytes: int | None


@dataclass(frozen=True)
class Choice:
    """The llama.cpp device a command line runs on, and how it was chosen."""

    llama: LlamaDevice | None
    llama_name: str | None
    backend: str
    backend_device: str | None
    description: str
    requested_by: str
    notes: tuple[str, ...] = ()
    warnings: tuple[str, ...] = ()
