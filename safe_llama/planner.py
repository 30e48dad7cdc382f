"""The planner: from model facts, device limits and the request to settings that fit, and why.

Owns the allocation model (what llama.cpp allocates where, checked against which limit) and the walk
down the degrade ladder. Pure: every input is a value (facts, target, policy); it runs nothing.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace

from safe_llama.device_map import DeviceProfile, HostBudget, Sourced, TargetDevice
from safe_llama.errors import ExitStatus, SafeLlamaError
from safe_llama.kv import KvPlan, KvRequest, block_size, buffers, plan_kv
from safe_llama.model_facts import ModelFacts
from safe_llama.policy import Policy
from safe_llama.units import human

GPU_BACKENDS = frozenset({"openvino", "cuda", "vulkan", "sycl", "opencl", "metal", "hip"})
STATEFUL_ENV = "GGML_OPENVINO_STATEFUL_EXECUTION"
_TYPE_ORDER = {
    name: i for i, name in enumerate(("f32", "f16", "bf16", "q8_0", "q5_1", "q5_0", "q4_1", "iq4_nl", "q4_0"))
}


@dataclass(frozen=True)
class Target:
    """Where llama.cpp will run, and the limits that apply there."""

    backend: str  # cpu | openvino | cuda | vulkan | sycl | opencl | metal | hip
    host_budget: Sourced[int]  # bytes the process may use on the host (RAM, cgroup, rlimit: the smallest)
    address_space_budget: bool = False  # the budget is RLIMIT_AS: reserved-but-untouched memory counts too
    malloc_arena_max_set: bool = False  # the user's environment already sets MALLOC_ARENA_MAX
    kv_cap: int | None = None  # a failed start: the next plan's KV must stay at or under this
    compute_extra: int = 0  # a failed start named the compute buffers' size: bytes the estimate missed
    # the policy's margin on host and device limits times this: 1 keeps it, 0 plans against the whole limit,
    # -1 the top of the margin band (a retry's search under an exact limit starts there and steps down)
    margin_scale: float = 1.0
    on_gpu: bool = False  # KV and offloaded layers go to a device's memory
    integrated: bool = False  # the device's memory is the host's RAM
    device: str | None = None  # llama.cpp's name for it (OPENVINO0, CUDA0, ...)
    max_alloc: Sourced[int] | None = None
    device_memory: Sourced[int] | None = None
    kv_split: bool | None = None  # None: decided from the backend and the binary's version
    binary_version: str | None = None
    neo_filter: Mapping[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class Allocation:
    name: str
    bytes: int
    limit: int
    limit_name: str

    @property
    def fits(self) -> bool:
        return self.bytes <= self.limit


@dataclass(frozen=True)
class Settings:
    kv: KvRequest
    stateful: bool = False
    n_gpu_layers: int | None = None  # None: all layers on the device (llama.cpp's default)


@dataclass(frozen=True)
class Step:
    name: str
    reason: str


@dataclass(frozen=True)
class Plan:
    settings: Settings
    kv: KvPlan
    allocations: tuple[Allocation, ...]
    steps: tuple[Step, ...]
    argv_changes: Mapping[str, str | bool]
    env_changes: Mapping[str, str]
    ctx_by_type: Mapping[str, int]  # largest context that fits per cache type (0: none)
    notes: tuple[str, ...] = ()

    @property
    def fits(self) -> bool:
        return all(a.fits for a in self.allocations)


def _version_tuple(text: str) -> tuple[int, ...]:
    parts = []
    for piece in text.split("-")[0].split("."):
        if not piece.isdigit():
            break
        parts.append(int(piece))
    return tuple(parts)


def kv_splits(target: Target, policy: Policy) -> bool:
    """Whether this binary packs the KV into buffers of at most the device's max allocation."""
    if target.kv_split is not None:
        return target.kv_split
    rule = policy.kv_split.get(target.backend, "never")
    if isinstance(rule, Mapping):
        if target.binary_version is None:
            return False  # unknown build: assume the old single allocation (the safe side)
        return _version_tuple(target.binary_version) >= _version_tuple(str(rule["since"]))
    return bool(rule == "always")


def compute_estimate(facts: ModelFacts, kv: KvPlan) -> int:
    """An upper estimate of llama.cpp's compute and output buffers (not predicted to the byte).

    Calibrated on the bundled gemma-3-270m: llama.cpp logs a CPU compute buffer of 24.78 MiB at -c 4096
    and 84.78 MiB at -c 65536, the growth being the f16 attention mask (n_ubatch x 2 bytes per cell);
    without flash attention KQ holds f32 per head.
    """
    ctx = kv.context
    n_embd = facts.embedding_length
    n_ff = max(facts.feed_forward_length, n_embd)
    n_head = max(facts.head_count, default=1)
    per_token = (8 * n_embd + 4 * n_ff) * 4
    mask = ctx.n_ctx_seq * ctx.n_ubatch * (2 if kv.flash_attn else 4 * n_head)
    logits = facts.vocab_size * 4 * max(ctx.n_seq_max, 1)
    return ctx.n_ubatch * per_token + mask + logits


def _origin(value: Sourced[int]) -> str:
    return f"{value.source}: {value.detail}" if value.detail else value.source


def _margin_words(fraction: float) -> str:
    if fraction > 0:
        return f" less {fraction:.0%}"
    return f" plus {-fraction:.0%}" if fraction < 0 else ""


def allocations(facts: ModelFacts, settings: Settings, target: Target, policy: Policy) -> tuple[Allocation, ...]:
    kv = plan_kv(facts, settings.kv)
    out: list[Allocation] = []
    if target.kv_cap is not None:
        out.append(Allocation("KV total", kv.total_bytes, target.kv_cap, "smaller than the start that failed"))
    kv_on_device = target.on_gpu and not settings.stateful
    n_layer = max(facts.block_count, 1)
    offloaded = n_layer if settings.n_gpu_layers is None else max(0, min(settings.n_gpu_layers, n_layer))
    device_share = offloaded / n_layer if kv_on_device else 0.0
    split = kv_splits(target, policy)
    kv_device = int(kv.total_bytes * device_share)
    kv_host = kv.total_bytes - kv_device
    if kv_on_device and target.max_alloc is not None and offloaded:
        margin = policy.per_backend(policy.max_alloc_margin, target.backend)
        limit = target.max_alloc.value - margin
        limit_name = f"device max allocation {human(target.max_alloc.value)} ({target.max_alloc.source})"
        if margin:
            limit_name += f" less {human(margin)} margin"
        for cache in kv.caches:
            sizes = buffers(cache.tensor_bytes, target.max_alloc.value if split else None)
            for i, size in enumerate(sizes):
                label = f"KV {cache.kind} buffer" + (f" {i + 1}/{len(sizes)}" if len(sizes) > 1 else "")
                if not split:
                    label += " (one allocation)"
                out.append(Allocation(label, int(size * device_share), limit, limit_name))
    weights = facts.total_weight_bytes
    weights_device = int(sum(facts.weight_bytes_per_layer[n_layer - offloaded :])) if target.on_gpu else 0
    compute = compute_estimate(facts, kv) + target.compute_extra
    fraction = policy.per_backend(policy.memory_margin_fraction, target.backend) * target.margin_scale
    if target.on_gpu and target.device_memory is not None and not target.integrated:
        usable = int(target.device_memory.value * (1 - fraction))
        out.append(
            Allocation(
                "device total (weights, KV, compute estimate)",
                weights_device + kv_device + compute,
                usable,
                f"device memory {human(target.device_memory.value)} ({_origin(target.device_memory)})"
                f"{_margin_words(fraction)}",
            )
        )
    overheads = policy.address_space_overhead if target.address_space_budget else policy.process_overhead
    overhead = policy.per_backend(overheads, target.backend)
    # Integrated GPUs share the host's RAM; OpenVINO allocates every buffer on the host first.
    host_kv = kv.total_bytes if (target.integrated or target.backend == "openvino") else kv_host
    host_compute = compute if (not target.on_gpu or target.integrated) else 0
    host_weights = weights  # the model file is mapped whole, whatever part of it a device also holds
    usable_host = int(target.host_budget.value * (1 - fraction))
    out.append(
        Allocation(
            "host total (process, weights, KV, compute estimate)",
            overhead + host_weights + host_kv + host_compute,
            usable_host,
            f"host budget {human(target.host_budget.value)} ({_origin(target.host_budget)}){_margin_words(fraction)}",
        )
    )
    return tuple(out)


def _fits(facts: ModelFacts, settings: Settings, target: Target, policy: Policy) -> bool:
    return all(a.fits for a in allocations(facts, settings, target, policy))


def _worst(allocs: Sequence[Allocation]) -> Allocation:
    return max(allocs, key=lambda a: a.bytes / max(a.limit, 1))


def _asked_ctx(kv: KvRequest, facts: ModelFacts) -> int:
    return plan_kv(facts, kv).context.n_ctx


def largest_ctx(
    facts: ModelFacts, settings: Settings, target: Target, policy: Policy, floor: int, ceiling: int
) -> int | None:
    """The largest -c in [floor, ceiling] that fits, exactly, on llama.cpp's 256-cell grid."""
    probe = plan_kv(facts, replace(settings.kv, n_ctx=ceiling)).context
    unit = 256 * (1 if probe.unified else probe.n_seq_max)
    lo = max(1, -(-floor // unit))
    hi = ceiling // unit
    if hi < lo:
        hi = lo

    def ok(k: int) -> bool:
        return _fits(facts, replace(settings, kv=replace(settings.kv, n_ctx=k * unit)), target, policy)

    if not ok(lo):
        return None
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if ok(mid):
            lo = mid
        else:
            hi = mid - 1
    return lo * unit


def _kv_quant_ok(facts: ModelFacts, type_name: str) -> bool:
    blk = block_size(type_name)
    return all(k % blk == 0 for k in facts.key_length if k)


def _describe(a: Allocation) -> str:
    return f"{a.name} {human(a.bytes)} > {a.limit_name}"


def plan(
    facts: ModelFacts,
    request: KvRequest,
    target: Target,
    policy: Policy,
    *,
    ladder: Sequence[str] | None = None,
    user_fit_set: bool = False,
    user_ngl: int | None = None,
    floor: int | None = None,
) -> Plan:
    """Settings that fit, keeping everything the user set that need not change; or NOTHING_FITS."""
    floor = policy.ctx_floor if floor is None else floor
    steps = list(ladder if ladder is not None else policy.ladder_for(target.backend, request.tool))
    settings = Settings(kv=request, n_gpu_layers=user_ngl)
    asked_ctx = _asked_ctx(request, facts)
    taken: list[Step] = []
    changes: dict[str, str | bool] = {}
    env: dict[str, str] = dict(target.neo_filter)
    notes: list[str] = []
    if target.neo_filter:
        taken.append(Step("neo-filter", f"{len(target.neo_filter)} NEO variables so only the targeted GPU is visible"))
    if target.address_space_budget and policy.malloc_arena_max and not target.malloc_arena_max_set:
        env["MALLOC_ARENA_MAX"] = str(policy.malloc_arena_max)
        taken.append(
            Step(
                "malloc-arenas",
                f"address-space limit {human(target.host_budget.value)}: MALLOC_ARENA_MAX={policy.malloc_arena_max}"
                " so glibc's per-thread arenas (64 MiB of address space each) cannot exhaust it",
            )
        )
    ctx_applied = False
    ctx_reason = ""
    for step in steps:
        allocs = allocations(facts, settings, target, policy)
        if all(a.fits for a in allocs):
            break
        worst = _worst(allocs)
        if step == "stateful":
            if target.backend != "openvino" or not target.on_gpu or settings.stateful:
                continue
            kv = settings.kv
            new_kv = kv
            if plan_kv(facts, kv).context.n_seq_max != 1:
                new_kv = replace(kv, n_parallel=1, kv_unified=None)
                changes["--parallel"] = "1"
            settings = replace(settings, stateful=True, kv=new_kv)
            env[STATEFUL_ENV] = "1"
            extra = ", one slot (-np 1) as it requires" if "--parallel" in changes else ""
            taken.append(Step("stateful", f"{_describe(worst)}: stateful execution keeps the KV in host RAM{extra}"))
        elif step in ("kv-q8", "kv-q4"):
            new_type = "q8_0" if step == "kv-q8" else "q4_0"
            kv = settings.kv
            if (
                _TYPE_ORDER.get(kv.type_k, 0) >= _TYPE_ORDER[new_type]
                and _TYPE_ORDER.get(kv.type_v, 0) >= _TYPE_ORDER[new_type]
            ):
                continue
            if target.backend == "openvino" and step == "kv-q8" and not policy.openvino_q8:
                notes.append("q8_0 KV skipped: never verified on OpenVINO (set quantized_kv.openvino_q8 to allow)")
                continue
            if not _kv_quant_ok(facts, new_type):
                notes.append(f"{new_type} KV skipped: a head dimension is not a multiple of {block_size(new_type)}")
                continue
            settings = replace(settings, kv=replace(kv, type_k=new_type, type_v=new_type, flash_attn="on"))
            changes.update({"--cache-type-k": new_type, "--cache-type-v": new_type, "--flash-attn": "on"})
            taken.append(Step(step, f"{_describe(worst)}: {new_type} KV cache (flash attention on, as it requires)"))
        elif step == "ctx":
            best = largest_ctx(facts, settings, target, policy, floor, asked_ctx)
            chosen = best if best is not None else min(floor, asked_ctx)
            if chosen >= asked_ctx:
                continue
            settings = replace(settings, kv=replace(settings.kv, n_ctx=chosen))
            changes["--ctx-size"] = str(chosen)
            ctx_applied = True
            ctx_reason = f"{_describe(worst)}: context {asked_ctx} -> "
            taken.append(Step("ctx", f"{ctx_reason}{chosen}, the largest that fits"))
        elif step == "ngl":
            if not target.on_gpu or target.integrated:
                continue
            n_layer = facts.block_count
            current = n_layer if settings.n_gpu_layers is None else settings.n_gpu_layers
            best_ngl = None
            for n in range(current - 1, -1, -1):
                if _fits(facts, replace(settings, n_gpu_layers=n), target, policy):
                    best_ngl = n
                    break
            chosen_ngl = 0 if best_ngl is None else best_ngl
            settings = replace(settings, n_gpu_layers=chosen_ngl)
            changes["--gpu-layers"] = str(chosen_ngl)
            taken.append(Step("ngl", f"{_describe(worst)}: {chosen_ngl} of {n_layer} layers on the GPU"))
    if ctx_applied and _fits(facts, settings, target, policy):
        # a later step freed memory: give the context back, up to what was asked
        best = largest_ctx(facts, settings, target, policy, floor, asked_ctx)
        if best is not None and best != settings.kv.n_ctx:
            settings = replace(settings, kv=replace(settings.kv, n_ctx=best))
            changes["--ctx-size"] = str(best)
            at = next(i for i, step in enumerate(taken) if step.name == "ctx")
            taken[at] = Step("ctx", f"{ctx_reason}{best}, the largest that fits with the steps after it")
    allocs = allocations(facts, settings, target, policy)
    if not all(a.fits for a in allocs):
        worst = _worst(allocs)
        raise SafeLlamaError(
            f"safe-llama: nothing fits: even at -c {settings.kv.n_ctx or asked_ctx} with {settings.kv.type_k} KV, "
            f"{_describe(worst)}",
            ExitStatus.NOTHING_FITS,
        )
    if policy.skip_llama_fit and not user_fit_set and (not target.on_gpu or settings.n_gpu_layers is not None):
        changes["--fit"] = "off"
        what = "-fit off"
        if "--ctx-size" not in changes and request.n_ctx in (None, 0):
            changes["--ctx-size"] = str(plan_kv(facts, settings.kv).context.n_ctx)
            what = f"-c {changes['--ctx-size']} (what llama.cpp would pick) and -fit off"
        taken.append(
            Step("fit-off", f"{what}: the plan already sized it, so llama.cpp's own fitting dry run is skipped")
        )
    ctx_by_type: dict[str, int] = {}
    for type_name in ("f16", "q8_0", "q4_0"):
        if type_name != "f16" and not _kv_quant_ok(facts, type_name):
            continue
        trial = replace(settings, kv=replace(settings.kv, type_k=type_name, type_v=type_name))
        ctx_by_type[type_name] = largest_ctx(facts, trial, target, policy, 256, max(asked_ctx, 256)) or 0
    return Plan(
        settings=settings,
        kv=plan_kv(facts, settings.kv),
        allocations=allocs,
        steps=tuple(taken),
        argv_changes=changes,
        env_changes=env,
        ctx_by_type=ctx_by_type,
        notes=tuple(notes),
    )


def settings_summary(settings: Settings) -> dict[str, object]:
    return {k: v for k, v in dataclasses.asdict(settings.kv).items()} | {
        "stateful": settings.stateful,
        "n_gpu_layers": settings.n_gpu_layers,
    }


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
    on_gpu = not device.on_host
    integrated = bool(device.integrated.value) if device.integrated is not None else False
    if profile is not None and device.on_host and profile.backend not in (None, "cpu"):
        backend = str(profile.backend)
        on_gpu = True
        integrated = bool(profile.integrated)
    max_alloc = device.max_alloc_bytes if on_gpu else None
    memory = device.memory_bytes if on_gpu and not integrated else None
    return Target(
        backend=backend if backend != "unknown" else "cpu",
        host_budget=host.budget_bytes,
        address_space_budget="RLIMIT_AS" in host.budget_bytes.detail,
        malloc_arena_max_set=malloc_arena_max_set,
        on_gpu=on_gpu,
        integrated=integrated,
        device=device.llama_name,
        max_alloc=max_alloc,
        device_memory=memory,
        kv_split=kv_split,
        binary_version=binary_version,
        neo_filter=dict(device.neo_filter),
    )


def with_learned(target: Target, learned_max_alloc: int | None) -> Target:
    """The target with a max allocation the device itself named in a failed start (when it is lower)."""
    if learned_max_alloc is None or (target.max_alloc is not None and target.max_alloc.value <= learned_max_alloc):
        return target
    return replace(target, max_alloc=Sourced(learned_max_alloc, "learned", "from the device's own error message"))
