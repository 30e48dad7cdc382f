"""The one list of backends safe-llama knows, and what every other module asks of it: which backend a device
name belongs to, the log marks of each, the packaged allocation rules, the variables that renumber devices.

Owns that registry; must not describe a backend itself (its own module does) nor probe."""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType

from safe_llama.backends import blas, cann, cpu, cuda, hip, metal, musa, opencl, openvino, rpc, sycl, vulkan, webgpu
from safe_llama.backends.backend import AllocRule, Backend

# Most specific device-name prefix first; the CPU last, as the one a log names beside every other.
_MODULES = (openvino, cuda, hip, musa, vulkan, sycl, metal, opencl, cann, webgpu, rpc, blas, cpu)
BACKENDS: tuple[Backend, ...] = tuple(m.BACKEND for m in _MODULES)
_BY_NAME = {b.name: b for b in BACKENDS}

# Every backend's rules under their user-facing keys ("cuda", "openvino:GPU"): a user's [backends] replaces them.
ALLOC_RULES: MappingProxyType[str, AllocRule] = MappingProxyType(
    {b.rule_key(kind): rule for b in BACKENDS for kind, rule in b.rules.items()}
)
# Variables that renumber one backend's devices, so that position no longer says which device is which.
RENUMBERING_ENV: tuple[str, ...] = tuple(v for b in BACKENDS for v in b.renumbering_env)


def backend_named(name: str) -> Backend:
    """The backend of that name; one with no rule and no quirk for a name safe-llama does not know."""
    return _BY_NAME.get(name) or Backend(name)


def backend_of(device_name: str) -> str:
    """The backend of a llama.cpp device name (as `--list-devices` prints it); "other" for an unknown one."""
    return next((b.name for b in BACKENDS if b.owns(device_name)), "other")


def rule_for(rules: Mapping[str, AllocRule], backend: str, backend_device: str | None) -> AllocRule | None:
    """The rule that applies to a backend driving `backend_device` (OpenVINO's own id), from `rules`."""
    found = _BY_NAME.get(backend)
    if found is None:
        return rules.get(backend)
    return rules.get(found.rule_key(found.kind(backend_device)))


def log_marks() -> tuple[tuple[str, str], ...]:
    """(backend, regex) of every backend whose lines a log shows, in the registry's order."""
    return tuple((b.name, b.log_marks) for b in BACKENDS if b.log_marks)


def gpu_marks() -> str:
    """One regex: a log line that puts work on a GPU device of any backend."""
    return "|".join(b.gpu_marks for b in BACKENDS if b.gpu_marks)
