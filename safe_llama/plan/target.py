"""The target of a plan: where llama.cpp will run and the limits that apply there (device memory, the
per-allocation cap, every host limit), in three parts: what the probes saw (Probed), the policy's values for
it (TargetPolicy) and what failed starts taught (Lessons); whether this binary splits its KV at the device's
max allocation.

Owns that view of the machine for the planner; must not probe (device/ does) nor size anything (plan.memory)."""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, fields, replace
from typing import Any

from safe_llama.device.host_budget import HostBudget, HostLimit
from safe_llama.device.limits import DeviceProfile, Sourced
from safe_llama.device.llama_listing import LlamaDevice
from safe_llama.device.reservations import shared_device
from safe_llama.device.target_device import TargetDevice
from safe_llama.plan.lessons import Lessons
from safe_llama.plan.policy import ComputeCosts, Policy
from safe_llama.units import human


@dataclass(frozen=True)
class RemoteDevice:
    """A device on an RPC worker (`--rpc host:port`), as llama.cpp lists it, and what it may hold."""

    name: str  # llama.cpp's device name: RPC0, RPC1, ... (in --rpc order)
    endpoint: str  # host:port
    free_bytes: int  # what the worker reports free: llama.cpp's default split weighs devices by it
    memory: Sourced[int]  # what the plan may use there: declared (a cgroup cap, a GPU), learned, or reported

    @property
    def label(self) -> str:
        return f"{self.name} ({self.endpoint})"


@dataclass(frozen=True)
class Probed:
    """What the probes saw, or the user declared in their place: the backend and device, its memory and limits,
    the host's limits, the RPC workers' devices, the binary's version."""

    backend: str  # cpu | openvino | cuda | vulkan | sycl | opencl | metal | hip
    host_budget: Sourced[int]  # bytes the process may use on the host (RAM, cgroup, rlimit: the smallest)
    address_space_budget: bool = False  # the budget is RLIMIT_AS: reserved-but-untouched memory counts too
    malloc_arena_max_set: bool = False  # the user's environment already sets MALLOC_ARENA_MAX
    on_gpu: bool = False  # KV and offloaded layers go to a device's memory
    integrated: bool = False  # the device's memory is the host's RAM
    device: str | None = None  # llama.cpp's name for it (OPENVINO0, CUDA0, ...)
    max_alloc: Sourced[int] | None = None
    # the largest tensor the device's operations take (Vulkan: maxStorageBufferRange or the max buffer size):
    # a larger weight stays on the host, a larger KV tensor aborts the start
    max_tensor: Sourced[int] | None = None
    alloc_block: int | None = None  # buffers are packed up to this (Vulkan's suballocation block); None: max_alloc
    device_memory: Sourced[int] | None = None
    kv_split: bool | None = None  # None: decided from the backend and the binary's version
    binary_version: str | None = None
    neo_filter: Mapping[str, str] = field(default_factory=dict)
    # every host limit, each checked with its own accounting; empty: host_budget alone, as RAM (or as
    # address space when address_space_budget)
    host_limits: tuple[HostLimit, ...] = ()
    # devices on RPC workers: llama.cpp puts them before the local GPUs and splits layers over all of them
    remote: tuple[RemoteDevice, ...] = ()
    # the local GPU's free memory now (NVML, amdgpu's counters, llama.cpp's listing): what another program holds
    # is not ours to plan with
    device_free: Sourced[int] | None = None
    device_free_listed: bool = False  # device_free is llama.cpp's listing (read after it made its context)
    # what other safe-llama launches reserved on this device and its free figure does not show yet (the ledger)
    device_reserved: Sourced[int] | None = None
    share: float | None = None  # --share: at most this part of the device's memory (and the host's, see pipeline)
    share_why: str = ""  # whose share: "--share", or the launches that start together
    # a launch that hands its supervision off as it starts llama-server (attempts/at_spawn.py): this process's own
    # charge (its anonymous memory) when it probed, which the exec gives back; 0: the full supervisor stays
    own_charge: int = 0


@dataclass(frozen=True)
class TargetPolicy:
    """The policy's values for this target (configs/planner.toml, see target_policy): copies, so that the
    allocation model reads one value."""

    # the backend's flash attention reads no quantized K/V: its graph holds f16 copies of one layer's K and V
    # for the whole context (policy: [compute] kv_f16_copies in configs/planner.toml)
    kv_f16_copies: bool = False
    # weight types the host CPU's backend copies into its own repacked buffers (anonymous memory beside the
    # mapped file) for the layers it runs (policy: cpu_repack_types)
    cpu_repack_types: frozenset[str] = frozenset()
    compute_costs: ComputeCosts | None = None  # [compute] of the policy in use (None: the packaged file's)
    worker_overhead: int = 0  # policy: what an rpc-server keeps resident beside the buffers it holds
    pipeline_copies: int = 1  # policy: graph-input copies when layers are pipelined over several devices
    device_runtime: int = 0  # policy: what the backend's runtime takes on the device at start (its context)


@dataclass(frozen=True)
class Target(Lessons, TargetPolicy, Probed):
    """Where llama.cpp will run, and the limits that apply there: the probed facts, the policy's values for
    them and the lessons, as one value the allocation model reads (Target.of puts the three together; the
    fields stay flat, so a test or tool may also name them one by one)."""

    @classmethod
    def of(cls, probed: Probed, policy: TargetPolicy, lessons: Lessons) -> Target:
        """The three together, the probed limits lowered to what the lessons showed (a max allocation the
        device named, RPC workers' caps)."""
        lowered = _with_worker_caps(_with_learned(probed, lessons.learned_max_alloc), lessons.worker_caps)
        return cls(**_values(lowered, Probed), **_values(policy, TargetPolicy), **_values(lessons, Lessons))

    @property
    def probed(self) -> Probed:
        return Probed(**_values(self, Probed))

    @property
    def lessons(self) -> Lessons:
        return Lessons(**_values(self, Lessons))

    @property
    def device_budget(self) -> Sourced[int] | None:
        """What the plan may put on the local GPU: its memory, or less where another program holds some now
        (free now less the runtime's own part), or less where a failed start showed it; never above the total.
        A declared or profile size is the user's word: free memory does not lower it."""
        memory = self.device_memory
        if memory is None:
            return None
        best = memory
        if self.device_free is not None and memory.source == "probed":
            reserved = self.device_reserved.value if self.device_reserved is not None else 0
            usable = max(self.device_free.value - self.device_runtime - reserved, 0)
            if usable < best.value:
                runtime = f" less {human(self.device_runtime)} for its runtime" if self.device_runtime else ""
                if self.device_reserved is not None:
                    runtime += f", less {human(reserved)} {self.device_reserved.detail}"
                best = Sourced(usable, "probed", f"{human(self.device_free.value)} {self.device_free.detail}{runtime}")
        if self.share is not None:
            shared = shared_device(memory.value, self.share, self.device_runtime, self.share_why)
            if shared.value < best.value:
                best = shared
        if self.device_cap is not None and self.device_cap < best.value:
            best = Sourced(self.device_cap, "learned", f"a start that failed on {self.device or 'the device'}")
        return best

    @property
    def limits_on_host(self) -> tuple[HostLimit, ...]:
        if self.host_limits:
            return self.host_limits
        return (HostLimit("address space" if self.address_space_budget else "ram", self.host_budget),)


def _values(value: Probed | TargetPolicy | Lessons, part: type) -> dict[str, Any]:
    """The fields of `part` (one of the three) as they are in `value` (not copied: dataclasses.asdict would
    turn the Sourced values into dicts)."""
    return {f.name: getattr(value, f.name) for f in fields(part)}


def target_policy(policy: Policy, probed: Probed) -> TargetPolicy:
    """The policy's values for this target."""
    runtime = int(policy.per_backend(policy.device_runtime, probed.backend) or 0)
    if probed.device_free_listed:  # a listing's free figure already lacks the runtime's context
        runtime -= int(policy.per_backend(policy.device_context, probed.backend) or 0)
    return TargetPolicy(
        kv_f16_copies=probed.on_gpu and probed.backend in policy.kv_f16_copy_backends,
        cpu_repack_types=policy.cpu_repack_types,
        compute_costs=policy.compute,
        worker_overhead=policy.rpc_worker_overhead,
        pipeline_copies=policy.pipeline_copies,
        device_runtime=max(runtime, 0),
    )


def atoi(text: str) -> int:
    """C's atoi (how ggml-openvino reads its switches): leading whitespace, sign, digits; 0 otherwise."""
    found = re.match(r"[ \t\n\v\f\r]*([+-]?[0-9]+)", text)
    return int(found.group(1)) if found else 0


def _version_tuple(text: str) -> tuple[int, ...]:
    parts = []
    for piece in text.split("-")[0].split("."):
        if not piece.isdigit():
            break
        parts.append(int(piece))
    return tuple(parts)


def kv_splits(target: Probed, policy: Policy) -> bool:
    """Whether this binary packs the KV into buffers of at most the device's max allocation."""
    if target.kv_split is not None:
        return target.kv_split
    rule = policy.kv_split.get(target.backend, "never")
    if isinstance(rule, Mapping):
        if target.binary_version is None:
            return False  # unknown build: assume the old single allocation (the safe side)
        return _version_tuple(target.binary_version) >= _version_tuple(str(rule["since"]))
    return bool(rule == "always")


def target_from(
    device: TargetDevice,
    host: HostBudget,
    *,
    binary_version: str | None,
    profile: DeviceProfile | None = None,
    kv_split: bool | None = None,
    malloc_arena_max_set: bool = False,
) -> Target:
    """The planner's view of a probed (or declared) device.

    A profile named on the command line describes the machine being planned for: when the probe only
    sees this host's CPU, the profile's backend and GPU stand in for it (planning for another machine).
    """
    backend = device.backend
    on_gpu = not device.on_host and backend != "unknown"  # no binary to ask: plan for the host
    integrated = bool(device.integrated.value) if device.integrated is not None else False
    if profile is not None and device.on_host and profile.backend not in (None, "cpu"):
        backend = str(profile.backend)
        on_gpu = True
        integrated = bool(profile.integrated)
    max_alloc = device.max_alloc_bytes if on_gpu else None
    vulkan = device.vulkan if on_gpu else None
    memory = device.memory_bytes if on_gpu and not integrated else None
    free = device.memory_free_bytes if memory is not None else None
    listed = free is not None and not device.free_is_vendor
    return Target(
        backend=backend if backend != "unknown" else "cpu",
        host_budget=host.budget_bytes,
        address_space_budget=any(limit.kind == "address space" for limit in host.limits)
        or "RLIMIT_AS" in host.budget_bytes.detail,
        malloc_arena_max_set=malloc_arena_max_set,
        on_gpu=on_gpu,
        integrated=integrated,
        device=device.llama_name,
        max_alloc=max_alloc,
        max_tensor=vulkan.max_tensor if vulkan is not None else None,
        alloc_block=vulkan.block.value if vulkan is not None else None,
        device_memory=memory,
        device_free=free,
        device_free_listed=listed,
        kv_split=kv_split,
        binary_version=binary_version,
        neo_filter=dict(device.neo_filter),
        host_limits=host.limits,
    )


def remote_devices(listed: Sequence[LlamaDevice], declared: Sequence[tuple[str, int]]) -> tuple[RemoteDevice, ...]:
    """The RPC workers' devices with what each may hold: a declared budget (the worker's cgroup cap or GPU,
    which rpc-server does not report), else what it reports free (Target.of lowers it after a failure)."""
    budgets = dict(declared)
    out = []
    for device in listed:
        endpoint = device.description.strip()
        memory = Sourced(device.free_bytes, "probed", f"{endpoint} reports {human(device.free_bytes)} free")
        if endpoint in budgets:
            memory = Sourced(budgets[endpoint], "declared", f"--rpc-memory {endpoint}={human(budgets[endpoint])}")
        out.append(RemoteDevice(device.name, endpoint, device.free_bytes, memory))
    return tuple(out)


def _with_learned(target: Probed, learned_max_alloc: int | None) -> Probed:
    """The target with a max allocation the device itself named in a failed start (when it is lower)."""
    if learned_max_alloc is None or (target.max_alloc is not None and target.max_alloc.value <= learned_max_alloc):
        return target
    return replace(target, max_alloc=Sourced(learned_max_alloc, "learned", "from the device's own error message"))


def _with_worker_caps(target: Probed, caps: Sequence[tuple[str, int]]) -> Probed:
    """The target with RPC workers' memory lowered to what a failed start showed they cannot exceed."""
    if not caps:
        return target
    lowered = dict(caps)
    why = "failed in a start that put more there"
    remote = tuple(
        replace(r, memory=Sourced(lowered[r.endpoint], "learned", f"{r.endpoint} {why}"))
        if r.endpoint in lowered and lowered[r.endpoint] < r.memory.value
        else r
        for r in target.remote
    )
    return replace(target, remote=remote)
