"""The planner: from model facts, a target and the request to settings that fit, and why: the walk down the
degrade ladder (stateful execution, quantized KV, a smaller context, fewer GPU layers), each step checked
against plan.memory's allocations.

Owns the choice of settings. Pure: every input is a value (facts, target, policy); it runs nothing."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace

from safe_llama.cmdline.request import DEFAULT_CACHE_RAM_MIB, DEFAULT_CTX_CHECKPOINTS
from safe_llama.errors import ExitStatus, SafeLlamaError
from safe_llama.model.facts import ModelFacts
from safe_llama.model.kv import PAD, KvPlan, KvRequest, block_size, ctx_unit, plan_kv
from safe_llama.plan.memory import Allocation, Layout, LlamaSettings, allocations, planned_split
from safe_llama.plan.policy import Policy
from safe_llama.plan.serving import checkpoint_bytes, size_serving
from safe_llama.plan.split import device_names
from safe_llama.plan.target import STATEFUL_ENV, Target, atoi
from safe_llama.plan.weights_off import layers_words, weights_off
from safe_llama.units import human

_TYPE_ORDER = {
    name: i for i, name in enumerate(("f32", "f16", "bf16", "q8_0", "q5_1", "q5_0", "q4_1", "iq4_nl", "q4_0"))
}


@dataclass(frozen=True)
class Step:
    name: str
    reason: str


@dataclass(frozen=True)
class Plan:
    settings: LlamaSettings
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


def _fits(facts: ModelFacts, settings: LlamaSettings, target: Target, policy: Policy) -> bool:
    return all(a.fits for a in allocations(facts, settings, target, policy))


def _worst(allocs: Sequence[Allocation]) -> Allocation:
    return max(allocs, key=lambda a: a.bytes / max(a.limit, 1))


def _asked_ctx(kv: KvRequest, facts: ModelFacts) -> int:
    return plan_kv(facts, kv).context.n_ctx


def largest_ctx(
    facts: ModelFacts, settings: LlamaSettings, target: Target, policy: Policy, floor: int, ceiling: int
) -> int | None:
    """The largest -c in [floor, ceiling] that fits, exactly, on llama.cpp's grid of PAD cells (per stream)."""
    unit = ctx_unit(settings.kv)
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


def describe(a: Allocation) -> str:
    """One allocation against its limit in plain words: "CUDA0 (weights, KV, compute) 164.25 GiB at
    -c 2000128 is above its 137.00 GiB usable (139.80 GiB probed: ..., less 2%)"."""
    at = f" at -c {a.n_ctx}" if a.n_ctx else ""
    where = "within" if a.fits else "above"
    return f"{a.subject or a.name} {human(a.bytes)}{at} is {where} {a.limit_words or a.limit_name}"


def _split_words(split: Sequence[int], target: Target, devices: Sequence[str]) -> str:
    remote = {r.name: r for r in target.remote}
    parts = []
    for name, layers in zip(devices, split, strict=False):
        where = name
        if name in remote:
            r = remote[name]
            where = f"{r.name} {r.endpoint} ({human(r.memory.value)} {r.memory.source})"
        parts.append(f"{layers} on {where}")
    idle = [name for name, layers in zip(devices, split, strict=False) if layers == 0]
    reported = " / ".join(sorted({human(r.free_bytes) for r in target.remote}))
    return (
        f"-ts {','.join(str(x) for x in split)}: of the {sum(split)} layers (the output layer is the last) "
        f"{', '.join(parts)}, so that each device keeps the same share of its memory free"
        + (f" ({', '.join(idle)} not needed)" if idle else "")
        + f"; llama.cpp would split by the {reported} each worker reports free"
    )


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
    layout: Layout | None = None,
    user_env: Mapping[str, str] | None = None,
) -> Plan:
    """LlamaSettings that fit, keeping everything the user set that need not change; or NOTHING_FITS.

    `user_env`: the environment llama.cpp will inherit. What the user set there for stateful execution and
    the NEO filter wins: never overwritten; GGML_OPENVINO_STATEFUL_EXECUTION=1 is where the plan starts
    from, =0 takes the stateful step off the ladder."""
    user_env = user_env or {}
    floor = policy.ctx_floor if floor is None else floor
    steps = list(ladder if ladder is not None else policy.ladder_for(target.backend, request.tool))
    settings = LlamaSettings(kv=request, n_gpu_layers=user_ngl, layout=layout or Layout())
    asked_ctx = _asked_ctx(request, facts)
    taken: list[Step] = []
    changes: dict[str, str | bool] = {}
    env: dict[str, str] = {k: v for k, v in target.neo_filter.items() if k not in user_env}
    notes: list[str] = []
    kept = sorted(k for k in target.neo_filter if k in user_env)
    if kept:
        notes.append(f"NEO filter: your {', '.join(f'{k}={user_env[k]}' for k in kept)} kept")
    if env:
        taken.append(Step("neo-filter", f"{len(env)} NEO variables so only the targeted GPU is visible"))
    if STATEFUL_ENV in user_env:
        steps = [s for s in steps if s != "stateful"]
        if atoi(user_env[STATEFUL_ENV]) != 0 and target.backend == "openvino" and target.on_gpu:
            settings = replace(settings, stateful=True)
            extra = ""
            if plan_kv(facts, settings.kv).context.n_seq_max != 1:
                settings = replace(settings, kv=replace(settings.kv, n_parallel=1, kv_unified=None))
                changes["--parallel"] = "1"
                extra = ", one slot (-np 1) as it requires"
            taken.append(Step("stateful", f"your {STATEFUL_ENV}={user_env[STATEFUL_ENV]}: KV in host RAM{extra}"))
        else:
            notes.append(f"your {STATEFUL_ENV}={user_env[STATEFUL_ENV]}: stateful execution stays as you set it")
    if target.address_space_budget and policy.malloc_arena_max and not target.malloc_arena_max_set:
        env["MALLOC_ARENA_MAX"] = str(policy.malloc_arena_max)
        taken.append(
            Step(
                "malloc-arenas",
                f"address-space limit {human(target.host_budget.value)}: MALLOC_ARENA_MAX={policy.malloc_arena_max}"
                " so glibc's per-thread arenas (64 MiB of address space each) cannot exhaust it",
            )
        )
    devices = device_names(target, settings.layout.devices, settings.layout.split_mode, settings.layout.main_gpu)
    if (
        target.remote
        and len(devices) > 1
        and not settings.layout.tensor_split
        and settings.layout.split_mode == "layer"
    ):
        settings = replace(settings, layout=replace(settings.layout, balance=True))
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
            taken.append(Step("stateful", f"{describe(worst)}: keeping the KV in host RAM ({STATEFUL_ENV}=1){extra}"))
        elif step == "weights":
            if not target.on_gpu or target.integrated or (policy.keep_user_ngl and user_ngl is not None):
                continue
            probe_ctx = min(asked_ctx, floor)
            if _fits(facts, replace(settings, kv=replace(settings.kv, n_ctx=probe_ctx)), target, policy):
                continue  # the weights fit: what does not is the KV's, for the steps after this one
            # sized for the context the user asked with -c; without -c, for the floor (the ctx step grows it)
            place_ctx = asked_ctx if request.n_ctx not in (None, 0) else probe_ctx
            placed = replace(settings, kv=replace(settings.kv, n_ctx=place_ctx))
            worst = _worst(allocations(facts, placed, target, policy))
            moved_settings, moved, words = weights_off(facts, placed, target, policy)
            settings = replace(moved_settings, kv=settings.kv)
            changes.update(moved)
            yours = ""
            if user_ngl is not None and "--gpu-layers" in moved and int(moved["--gpu-layers"]) < user_ngl:
                yours = f" (your -ngl {user_ngl} taken as 'as many as fit'; keep_user_ngl = true keeps it)"
            taken.append(Step("weights", f"{describe(worst)}: {words}{yours}"))
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
            taken.append(
                Step(
                    step,
                    f"{describe(worst)}: a {new_type} KV cache "
                    f"(-ctk {new_type} -ctv {new_type}, with -fa on as it requires)",
                )
            )
        elif step == "ctx":
            best = largest_ctx(facts, settings, target, policy, floor, asked_ctx)
            chosen = best if best is not None else min(floor, asked_ctx)
            if chosen >= asked_ctx:
                continue
            settings = replace(settings, kv=replace(settings.kv, n_ctx=chosen))
            changes["--ctx-size"] = str(chosen)
            ctx_applied = True
            ctx_reason = f"{describe(worst)}: -c "
            taken.append(Step("ctx", f"{ctx_reason}{chosen}, the largest that fits"))
        elif step == "ngl":
            if not target.on_gpu or target.integrated or (policy.keep_user_ngl and user_ngl is not None):
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
            taken.append(
                Step("ngl", f"{describe(worst)}: -ngl {chosen_ngl}, {layers_words(chosen_ngl, n_layer)} on the GPU")
            )
    if ctx_applied and _fits(facts, settings, target, policy):
        # a later step freed memory: give the context back, up to what was asked
        best = largest_ctx(facts, settings, target, policy, floor, asked_ctx)
        if best is not None and best != settings.kv.n_ctx:
            settings = replace(settings, kv=replace(settings.kv, n_ctx=best))
            changes["--ctx-size"] = str(best)
            at = next(i for i, step in enumerate(taken) if step.name == "ctx")
            taken[at] = Step("ctx", f"{ctx_reason}{best}, the largest that fits with the steps after it")
    allocs = allocations(facts, settings, target, policy)
    split = planned_split(facts, settings, target) if settings.layout.balance else None
    if split is not None and all(a.fits for a in allocs):
        settings = replace(settings, layout=replace(settings.layout, tensor_split=tuple(float(x) for x in split)))
        changes["--tensor-split"] = ",".join(str(x) for x in split)
        taken.insert(0, Step("split", _split_words(split, target, devices)))
    if not all(a.fits for a in allocs):
        worst = _worst(allocs)
        raise SafeLlamaError(
            f"safe-llama: nothing fits: even at -c {settings.kv.n_ctx or asked_ctx} with {settings.kv.type_k} KV, "
            f"{describe(worst)}",
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
    served = _serving_step(facts, settings, target, policy, allocs)
    if served is not None:
        settings, serving_step, serving_changes = served
        changes.update(serving_changes)
        taken.append(serving_step)
        allocs = allocations(facts, settings, target, policy)
    ctx_by_type: dict[str, int] = {}
    for type_name in ("f16", "q8_0", "q4_0"):
        if type_name != "f16" and not _kv_quant_ok(facts, type_name):
            continue
        trial = replace(settings, kv=replace(settings.kv, type_k=type_name, type_v=type_name))
        ctx_by_type[type_name] = largest_ctx(facts, trial, target, policy, PAD, max(asked_ctx, PAD)) or 0
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


def _serving_step(
    facts: ModelFacts, settings: LlamaSettings, target: Target, policy: Policy, allocs: Sequence[Allocation]
) -> tuple[LlamaSettings, Step, dict[str, str | bool]] | None:
    """Under a cgroup limit, llama-server's prompt cache and context checkpoints sized to what the plan leaves
    (plan.serving); None when there is nothing to set (not a server, no cgroup limit, the user set both)."""
    layout = settings.layout
    cgroup = [a.limit - a.bytes for a in allocs if a.host_kind == "cgroup"]
    if settings.kv.tool != "server" or not cgroup or (layout.prompt_cache_set and layout.ctx_checkpoints_set):
        return None
    kv = plan_kv(facts, settings.kv)
    chosen = size_serving(
        min(cgroup),
        kv.context.n_seq_max,
        checkpoint_bytes(facts, kv),
        user_cache_ram_mib=layout.prompt_cache_mib if layout.prompt_cache_set else None,
        user_ctx_checkpoints=layout.ctx_checkpoints if layout.ctx_checkpoints_set else None,
        default_cache_ram_mib=DEFAULT_CACHE_RAM_MIB,
        default_ctx_checkpoints=DEFAULT_CTX_CHECKPOINTS,
        cache_charge=policy.prompt_cache_charge,
    )
    if not chosen.reason:
        return None
    changes: dict[str, str | bool] = {}
    if chosen.cache_ram_mib is not None:
        layout = replace(layout, prompt_cache_mib=chosen.cache_ram_mib, prompt_cache_set=True)
        changes["--cache-ram"] = str(chosen.cache_ram_mib)
    if chosen.ctx_checkpoints is not None:
        layout = replace(layout, ctx_checkpoints=chosen.ctx_checkpoints, ctx_checkpoints_set=True)
        changes["--ctx-checkpoints"] = str(chosen.ctx_checkpoints)
    return replace(settings, layout=layout), Step("serving", chosen.reason), changes

