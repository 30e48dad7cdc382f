"""The protocol every backend module fills in: a Backend value (from the pinned ggml source), its AllocRule
(how one allocation is capped there), and the check of a user's [backends] entries that replace rules.

Owns those values and that check; must not probe (target_device applies the rules) nor name a backend itself."""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

from safe_llama.errors import ExitStatus, SafeLlamaError

# How one allocation is capped: at the device's CL_DEVICE_MAX_MEM_ALLOC_SIZE (probed with pyopencl), at the
# limits ggml-vulkan derives from the Vulkan properties (probed through libvulkan), not at all, or at a figure
# no probe here reads.
AllocLimit = Literal["opencl", "vulkan", "none", "unprobed"]
ALLOC_LIMITS = ("opencl", "vulkan", "none", "unprobed")


@dataclass(frozen=True)
class AllocRule:
    """How a backend meets a device's limits (from the pinned ggml source, ggml_backend_*_get_max_size)."""

    vendor_ids: tuple[int, ...]  # PCI vendors its devices come from (empty: any)
    alloc_limit: AllocLimit
    why: str  # in words the plan shows


@dataclass(frozen=True)
class EnvCap:
    """A ceiling the backend puts on one allocation when a variable of llama.cpp's environment is set to a
    number other than 0 (read as the backend reads it: leading digits)."""

    variable: str
    cap_bytes: int
    why: str

    def applies(self, env: Mapping[str, str]) -> bool:
        found = re.match(r"\s*(\d+)", env.get(self.variable, ""))
        return found is not None and int(found.group(1)) != 0


@dataclass(frozen=True)
class Backend:
    """One ggml backend as safe-llama knows it. `name` is the key of its rules (a user's [backends]) and of
    its policy numbers (configs/planner.toml's per-backend tables: max_alloc_margin_bytes, ladder, ...)."""

    name: str
    prefixes: tuple[str, ...] = ()  # how `--list-devices` starts its device names (GGML_*_NAME, get_name)
    whole_names: tuple[str, ...] = ()  # device names it prints whole (the CPU's "CPU")
    log_marks: str | None = None  # regex: a log line its code wrote (ggml_*) or that names one of its devices
    gpu_marks: str | None = None  # regex: a log line that puts work on one of its GPU devices
    # how one allocation is capped, by the kind of device it drives ("" when the kind does not matter)
    rules: Mapping[str, AllocRule] = field(default_factory=dict)
    env_caps: tuple[EnvCap, ...] = ()  # ceilings its environment switches put on the probed cap
    default_kind: str = ""  # the kind of device it drives when none is named ("": one kind)
    host_kinds: frozenset[str] = frozenset()  # kinds that are the host CPU itself
    host_memory_kinds: frozenset[str] = frozenset()  # other kinds whose memory is the host's RAM
    renumbering_env: tuple[str, ...] = ()  # variables that renumber its devices
    intel_runtime: bool = False  # on an Intel GPU it runs on Intel's compute runtime (NEO's FilterBdfPath)
    stateful_env: str | None = None  # the variable that keeps the KV in host RAM (a ladder step)
    buffers_on_host_first: bool = False  # every buffer is allocated in host memory first
    q8_kv_verified: bool = True  # a q8_0 KV cache is known to work there
    # without flash attention, a quantized K's KQ product runs on the CPU (its view of the cache is not one it
    # multiplies): the host's compute buffer holds the attention's part of the graph too
    quantized_k_attention_on_host: bool = False
    free_source: str | None = None  # the vendor's free-memory reading (device/probe_free) numbered as it numbers
    own_device_env: str | None = None  # the variable that picks which of its own devices it drives
    # regex over its `--list-devices` description: its own device id (ov), " (selected)" (selected), the
    # hardware's name (full)
    own_device_in_description: str | None = None
    integrated_in_description: str | None = None  # regex: "i" (integrated) or "d" (discrete) in the description
    igpu_first: bool = False  # its own GPU ids count an Intel iGPU first (GPU.0), then the others in OpenCL's order

    @property
    def vulkan_limits(self) -> bool:
        """Its allocations are capped by ggml-vulkan's limits (device/probe_vulkan reads them)."""
        return any(rule.alloc_limit == "vulkan" for rule in self.rules.values())

    def kind(self, backend_device: str | None) -> str:
        """The kind of device a backend's own device id names (OpenVINO: GPU.1 -> GPU); "" for one kind."""
        if not self.default_kind:
            return ""
        found = re.match(r"[A-Z]+", backend_device or self.default_kind)
        return found.group(0) if found else self.default_kind

    def rule_key(self, kind: str) -> str:
        """The key of a rule in a user's [backends] table: the name, or "name:KIND"."""
        return f"{self.name}:{kind}" if kind else self.name

    def owns(self, device_name: str) -> bool:
        return device_name in self.whole_names or any(device_name.startswith(p) for p in self.prefixes)


def parse_alloc_rules(data: Mapping[str, Any], where: str) -> dict[str, AllocRule]:
    """A user's [backends] tables (keyed by backend, or "openvino:<device kind>") as rules; a bad entry is
    reported against `where` and its key."""
    rules: dict[str, AllocRule] = {}
    for key, entry in data.items():
        try:
            vendors = tuple(int(v) for v in entry.get("vendor_ids", []))
            limit = entry["alloc_limit"]
            why = str(entry["why"])
        except (AttributeError, KeyError, TypeError, ValueError) as err:
            raise SafeLlamaError(
                f"safe-llama: {where}: [{key}]: needs vendor_ids (numbers), alloc_limit and why ({err!r})",
                ExitStatus.BAD_CONFIG,
            ) from None
        if limit not in ALLOC_LIMITS:
            raise SafeLlamaError(
                f"safe-llama: {where}: [{key}] alloc_limit: {limit!r} is not one of {', '.join(ALLOC_LIMITS)}",
                ExitStatus.BAD_CONFIG,
            )
        rules[key] = AllocRule(vendors, limit, why)
    return rules
