"""The planner: from model facts, a target and the request to settings that fit, and why: what the user's
environment sets, the walk down the degrade ladder (plan.steps: stateful execution, weights off the GPU,
quantized KV, a smaller context, fewer GPU layers), then the finish (the context given back, the RPC split,
-fit off, the serving values), each checked against plan.memory's allocations.

Owns the order of that walk and the Plan it returns. Pure: every input is a value (facts, target, policy);
it runs nothing."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace

from safe_llama.backends.openvino import STATEFUL_ENV
from safe_llama.backends.registry import backend_named
from safe_llama.cmdline import memory_flags
from safe_llama.cmdline.memory_flags import DEFAULT_CACHE_RAM_MIB, DEFAULT_CTX_CHECKPOINTS, Layout, LlamaSettings
from safe_llama.errors import ExitStatus
from safe_llama.model.facts import ModelFacts
from safe_llama.model.kv import KvPlan, KvRequest, plan_kv
from safe_llama.plan.allocation_words import describe, host_attention_words
from safe_llama.plan.compute import attention_on_host
from safe_llama.plan.memory import Allocation, attention_limit, planned_split
from safe_llama.plan.policy import Policy
from safe_llama.plan.serving import checkpoint_bytes, size_serving
from safe_llama.plan.split import device_names
from safe_llama.plan.steps import Inputs, State, Step, ctx_by_type, go_stateful, largest_ctx, walk, worst
from safe_llama.plan.target import Target, atoi
from safe_llama.units import human

__all__ = ["Plan", "Step", "plan"]


@dataclass(frozen=True)
class Plan:
    """The plan: the settings chosen, their caches and allocations, the steps taken to reach them."""

    settings: LlamaSettings
    kv: KvPlan
    allocations: tuple[Allocation, ...]
    steps: tuple[Step, ...]
    decided: tuple[str, ...]  # the settings' fields the plan sets on argv, in the order it decided them
    env_changes: Mapping[str, str]
    ctx_by_type: Mapping[str, int]  # largest context that fits per cache type (0: none)
    notes: tuple[str, ...] = ()
    # notes a launch says too, after the steps' reasons: where llama.cpp runs a part the plan counts elsewhere
    said: tuple[str, ...] = ()

    @property
    def argv_changes(self) -> dict[str, str | bool]:
        """The options the plan sets, with the settings' values (cmdline.memory_flags writes them)."""
        return memory_flags.argv_changes(self.settings, self.decided)

    @property
    def fits(self) -> bool:
        return all(a.fits for a in self.allocations)


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
    user_kv_types: bool | None = None,
    floor: int | None = None,
    layout: Layout | None = None,
    user_env: Mapping[str, str] | None = None,
) -> Plan:
    """Settings that fit, keeping everything the user set that need not change; or NOTHING_FITS.

    `user_env`: the environment llama.cpp will inherit. What the user set there for stateful execution and
    the NEO filter wins: never overwritten; GGML_OPENVINO_STATEFUL_EXECUTION=1 is where the plan starts
    from, =0 takes the stateful step off the ladder."""
    user_env = user_env or {}
    inputs = Inputs(
        facts, request, target, policy, policy.ctx_floor if floor is None else floor,
        plan_kv(facts, request).context.n_ctx, user_ngl, user_kv_types,
    )  # fmt: skip
    steps = tuple(ladder if ladder is not None else policy.ladder_for(target.backend, request.tool))
    if STATEFUL_ENV in user_env:
        steps = tuple(s for s in steps if s != "stateful")
    state = _from_user_env(
        inputs, LlamaSettings(kv=request, n_gpu_layers=user_ngl, layout=layout or Layout()), user_env
    )
    state = _give_ctx_back(inputs, walk(inputs, _balance(inputs, state), steps))
    allocs = inputs.allocations(state.settings)
    state = _split(inputs, state, allocs)
    if not all(a.fits for a in allocs):
        from safe_llama.messages import NOTHING_FITS  # the templates, where one is said

        raise NOTHING_FITS.error(
            ExitStatus.NOTHING_FITS,
            ctx=state.settings.kv.n_ctx or inputs.asked_ctx,
            type=state.settings.kv.type_k,
            detail=describe(worst(allocs)),
        )
    state = _fit_off(inputs, state, user_fit_set)
    served = _serving_step(facts, state.settings, target, policy, allocs)
    if served is not None:
        state = state.took(served[1], served[0], served[2])
        allocs = inputs.allocations(state.settings)
    kv = plan_kv(facts, state.settings.kv)
    on_host = attention_on_host(facts, kv, attention_limit(facts, state.settings, target))
    said: tuple[str, ...] = ()
    if on_host is not None and target.max_tensor is not None:
        said = (
            host_attention_words(
                scores=on_host.scores, tensor_bytes=on_host.tensor_bytes, host_bytes=on_host.host_bytes,
                n_ubatch=kv.context.n_ubatch, device=target.device or "the device", limit=target.max_tensor,
            ),
        )  # fmt: skip
    return Plan(
        settings=state.settings,
        kv=kv,
        allocations=allocs,
        steps=state.taken,
        decided=state.decided,
        env_changes=dict(state.env),
        ctx_by_type=ctx_by_type(inputs, state.settings),
        notes=(*state.notes, *said),
        said=said,
    )


def _from_user_env(inputs: Inputs, settings: LlamaSettings, user_env: Mapping[str, str]) -> State:
    """Where the plan starts: the NEO filter where the user did not set its variables, the user's stateful
    execution, and MALLOC_ARENA_MAX under an address-space limit."""
    target, policy = inputs.target, inputs.policy
    state = State(settings, env={k: v for k, v in target.neo_filter.items() if k not in user_env})
    kept = sorted(k for k in target.neo_filter if k in user_env)
    if kept:
        state = state.noted(f"NEO filter: your {', '.join(f'{k}={user_env[k]}' for k in kept)} kept")
    if state.env:
        state = state.took(Step("neo-filter", f"{len(state.env)} NEO variables so only the targeted GPU is visible"))
    if STATEFUL_ENV in user_env:
        yours = f"your {STATEFUL_ENV}={user_env[STATEFUL_ENV]}"
        if atoi(user_env[STATEFUL_ENV]) != 0 and backend_named(target.backend).stateful_env and target.on_gpu:
            state = go_stateful(inputs, state, f"{yours}: KV in host RAM", {})
        else:
            state = state.noted(f"{yours}: stateful execution stays as you set it")
    if target.address_space_budget and policy.malloc_arena_max and not target.malloc_arena_max_set:
        state = state.took(
            Step(
                "malloc-arenas",
                f"address-space limit {human(target.host_budget.value)}: MALLOC_ARENA_MAX={policy.malloc_arena_max}"
                " so glibc's per-thread arenas (64 MiB of address space each) cannot exhaust it",
            ),
            env={"MALLOC_ARENA_MAX": str(policy.malloc_arena_max)},
        )
    return state


def _devices(target: Target, settings: LlamaSettings) -> list[str]:
    layout = settings.layout
    return device_names(target, layout.devices, layout.split_mode, layout.main_gpu)


def _balance(inputs: Inputs, state: State) -> State:
    """Over RPC workers without the user's -ts: the plan chooses the split (planned_split), not llama.cpp."""
    layout = state.settings.layout
    target = inputs.target
    if not target.remote or len(_devices(target, state.settings)) < 2 or layout.tensor_split:
        return state
    if layout.split_mode != "layer":
        return state
    return replace(state, settings=replace(state.settings, layout=replace(layout, balance=True)))


def _split(inputs: Inputs, state: State, allocs: tuple[Allocation, ...]) -> State:
    """The balanced -ts, first among the steps, when the plan fits with it."""
    settings = state.settings
    if not settings.layout.balance or not all(a.fits for a in allocs):
        return state
    split = planned_split(inputs.facts, settings, inputs.target, inputs.weights_cache)
    if split is None:
        return state
    devices = _devices(inputs.target, settings)
    return replace(
        state,
        settings=replace(settings, layout=replace(settings.layout, tensor_split=tuple(float(x) for x in split))),
        decided=state.deciding("tensor_split"),
        taken=(Step("split", _split_words(split, inputs.target, devices)), *state.taken),
    )


def _give_ctx_back(inputs: Inputs, state: State) -> State:
    """After the ladder: where a step after ctx freed memory, the context back, up to what was asked."""
    if not state.ctx_reason or not inputs.fits(state.settings):
        return state
    best = largest_ctx(inputs, state.settings, inputs.floor, inputs.asked_ctx)
    if best is None or best == state.settings.kv.n_ctx:
        return state
    first = next(i for i, step in enumerate(state.taken) if step.name == "ctx")
    again = Step("ctx", f"{state.ctx_reason}{best}, the largest that fits with the steps after it")
    return replace(
        state,
        settings=replace(state.settings, kv=replace(state.settings.kv, n_ctx=best)),
        decided=state.deciding("n_ctx"),
        taken=tuple(again if i == first else step for i, step in enumerate(state.taken)),
    )


def _fit_off(inputs: Inputs, state: State, user_fit_set: bool) -> State:
    """-fit off when the plan decided every value llama.cpp's own fitting would touch (and -c with it when the
    request had none, at what llama.cpp would pick)."""
    target, settings = inputs.target, state.settings
    if not inputs.policy.skip_llama_fit or user_fit_set or (target.on_gpu and settings.n_gpu_layers is None):
        return state
    kv = replace(settings.kv, fit=False)
    decided: tuple[str, ...] = ("fit",)
    what = "-fit off"
    if "n_ctx" not in state.decided and inputs.request.n_ctx in (None, 0):
        kv = replace(kv, n_ctx=plan_kv(inputs.facts, settings.kv).context.n_ctx)
        decided = ("fit", "n_ctx")
        what = f"-c {kv.n_ctx} (what llama.cpp would pick) and -fit off"
    why = f"{what}: the plan already sized it, so llama.cpp's own fitting dry run is skipped"
    return state.took(Step("fit-off", why), replace(settings, kv=kv), decided)


def _serving_step(
    facts: ModelFacts, settings: LlamaSettings, target: Target, policy: Policy, allocs: Sequence[Allocation]
) -> tuple[LlamaSettings, Step, tuple[str, ...]] | None:
    """Under a cgroup limit or a declared host budget (--host-memory: what the user says the server may have),
    llama-server's prompt cache and context checkpoints sized to what the plan leaves (plan.serving); None when
    there is nothing to set (not a server, no such limit, the user set both). Free RAM alone does not size them:
    it is what other programs leave now, not a limit."""
    layout = settings.layout
    budgets = [(a.limit - a.bytes, "the cgroup's limit") for a in allocs if a.host_kind == "cgroup"]
    budgets += [
        (a.limit - a.bytes, "the declared host memory")
        for a in allocs
        if a.host_kind == "ram" and a.source is not None and a.source.source == "declared"
    ]
    if settings.kv.tool != "server" or not budgets or (layout.cache_ram_set and layout.ctx_checkpoints_set):
        return None
    kv = plan_kv(facts, settings.kv)
    leftover, budget = min(budgets)
    chosen = size_serving(
        leftover,
        kv.context.n_seq_max,
        checkpoint_bytes(facts, kv),
        user_cache_ram_mib=layout.cache_ram_mib if layout.cache_ram_set else None,
        user_ctx_checkpoints=layout.ctx_checkpoints if layout.ctx_checkpoints_set else None,
        default_cache_ram_mib=DEFAULT_CACHE_RAM_MIB,
        default_ctx_checkpoints=DEFAULT_CTX_CHECKPOINTS,
        cache_charge=policy.prompt_cache_charge,
        budget=budget,
    )
    if not chosen.reason:
        return None
    decided: list[str] = []
    if chosen.cache_ram_mib is not None:
        layout = replace(layout, cache_ram_mib=chosen.cache_ram_mib, cache_ram_set=True)
        decided.append("cache_ram_mib")
    if chosen.ctx_checkpoints is not None:
        layout = replace(layout, ctx_checkpoints=chosen.ctx_checkpoints, ctx_checkpoints_set=True)
        decided.append("ctx_checkpoints")
    return replace(settings, layout=layout), Step("serving", chosen.reason), tuple(decided)
