"""The degrade ladder's steps (configs/planner.toml [ladder]: stateful, weights, kv-q8, kv-q4, ctx, ngl), each a
function from the plan's state to the next one (None: the step does not apply), over one small state value.

Owns what each step changes and the reason it gives; must not choose the order (the policy's ladder does) nor
finish the plan (plan.planner: the split, -fit off, the serving values)."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace

from safe_llama.backends.registry import backend_named
from safe_llama.cmdline.memory_flags import LlamaSettings
from safe_llama.model.facts import ModelFacts
from safe_llama.model.kv import PAD, KvRequest, block_size, ctx_unit, plan_kv
from safe_llama.plan.allocation_words import describe
from safe_llama.plan.memory import Allocation, allocations
from safe_llama.plan.policy import Policy
from safe_llama.plan.split import WeightsCache
from safe_llama.plan.target import Target
from safe_llama.plan.weights_off import layers_words, weights_off

_TYPE_ORDER = {
    name: i for i, name in enumerate(("f32", "f16", "bf16", "q8_0", "q5_1", "q5_0", "q4_1", "iq4_nl", "q4_0"))
}


@dataclass(frozen=True)
class Step:
    """One ladder step taken, and the reason it gives."""

    name: str
    reason: str


@dataclass(frozen=True)
class Inputs:
    """What every step reads and none changes: the model, the target, the policy and what the user asked."""

    facts: ModelFacts
    request: KvRequest
    target: Target
    policy: Policy
    floor: int  # never a context below this
    asked_ctx: int  # the context the request makes (llama.cpp's, without -c)
    user_ngl: int | None = None
    # the user wrote -ctk or -ctv (None: not known; a cache type other than f16 is taken as written)
    user_kv_types: bool | None = None
    weights_cache: WeightsCache = field(default_factory=WeightsCache)

    def fits(self, settings: LlamaSettings) -> bool:
        return all(a.fits for a in self.allocations(settings))

    def allocations(self, settings: LlamaSettings) -> tuple[Allocation, ...]:
        return allocations(self.facts, settings, self.target, self.policy, self.weights_cache)


@dataclass(frozen=True)
class State:
    """The plan so far: the settings, the fields it decided (their options set on argv, in that order), the
    environment changes, the steps taken and the notes."""

    settings: LlamaSettings
    decided: tuple[str, ...] = ()
    env: Mapping[str, str] = field(default_factory=dict)
    taken: tuple[Step, ...] = ()
    notes: tuple[str, ...] = ()
    ctx_reason: str = ""  # the ctx step's reason up to its -c value ("" until it is taken)

    def took(
        self,
        step: Step,
        settings: LlamaSettings | None = None,
        decided: tuple[str, ...] = (),
        env: Mapping[str, str] | None = None,
    ) -> State:
        return replace(
            self,
            settings=settings or self.settings,
            decided=self.deciding(*decided),
            env={**self.env, **(env or {})},
            taken=(*self.taken, step),
        )

    def deciding(self, *names: str) -> tuple[str, ...]:
        """The decided fields with these added (each once, where it was first decided)."""
        return self.decided + tuple(dict.fromkeys(n for n in names if n not in self.decided))

    def noted(self, note: str) -> State:
        return replace(self, notes=(*self.notes, note))


def worst(allocs: tuple[Allocation, ...]) -> Allocation:
    return max(allocs, key=lambda a: a.bytes / max(a.limit, 1))


def largest_ctx(inputs: Inputs, settings: LlamaSettings, floor: int, ceiling: int) -> int | None:
    """The largest -c in [floor, ceiling] that fits, exactly, on llama.cpp's grid of PAD cells (per stream)."""
    unit = ctx_unit(settings.kv)
    lo = max(1, -(-floor // unit))
    hi = ceiling // unit
    if hi < lo:
        hi = lo

    def ok(k: int) -> bool:
        return inputs.fits(replace(settings, kv=replace(settings.kv, n_ctx=k * unit)))

    if not ok(lo):
        return None
    if ok(hi):  # most often the whole ceiling fits: one check instead of a search
        return hi * unit
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if ok(mid):
            lo = mid
        else:
            hi = mid - 1
    return lo * unit


def kv_quant_ok(facts: ModelFacts, type_name: str) -> bool:
    blk = block_size(type_name)
    return all(k % blk == 0 for k in facts.key_length if k)


def go_stateful(inputs: Inputs, state: State, why: str, env: Mapping[str, str]) -> State:
    """Stateful execution (the KV in host RAM), with the one slot it requires: from the user's environment
    or as the ladder's step (`env`: what the plan sets for it, nothing when the user did)."""
    settings = replace(state.settings, stateful=True)
    decided: tuple[str, ...] = ()
    extra = ""
    if plan_kv(inputs.facts, settings.kv).context.n_seq_max != 1:
        settings = replace(settings, kv=replace(settings.kv, n_parallel=1, kv_unified=None))
        decided = ("n_parallel",)
        extra = ", one slot (-np 1) as it requires"
    return state.took(Step("stateful", f"{why}{extra}"), settings, decided, env)


def _stateful(inputs: Inputs, state: State, over: Allocation) -> State | None:
    target = inputs.target
    variable = backend_named(target.backend).stateful_env
    if variable is None or not target.on_gpu or state.settings.stateful:
        return None
    why = f"{describe(over)}: keeping the KV in host RAM ({variable}=1)"
    return go_stateful(inputs, state, why, {variable: "1"})


def _lowers_ngl(inputs: Inputs) -> bool:
    target, policy = inputs.target, inputs.policy
    return target.on_gpu and not target.integrated and not (policy.keep_user_ngl and inputs.user_ngl is not None)


def _weights(inputs: Inputs, state: State, over: Allocation) -> State | None:
    if not _lowers_ngl(inputs):
        return None
    settings = state.settings
    probe_ctx = min(inputs.asked_ctx, inputs.floor)
    if inputs.fits(replace(settings, kv=replace(settings.kv, n_ctx=probe_ctx))):
        return None  # the weights fit: what does not is the KV's, for the steps after this one
    # sized for the context the user asked with -c; without -c, for the floor (the ctx step grows it)
    place_ctx = inputs.asked_ctx if inputs.request.n_ctx not in (None, 0) else probe_ctx
    placed = replace(settings, kv=replace(settings.kv, n_ctx=place_ctx))
    over = worst(inputs.allocations(placed))
    moved_settings, moved, words = weights_off(inputs.facts, placed, inputs.target, inputs.policy, inputs.weights_cache)
    user_ngl = inputs.user_ngl
    yours = ""
    if user_ngl is not None and "n_gpu_layers" in moved and (moved_settings.n_gpu_layers or user_ngl) < user_ngl:
        yours = f" (your -ngl {user_ngl} taken as 'as many as fit'; keep_user_ngl = true keeps it)"
    step = Step("weights", f"{describe(over)}: {words}{yours}")
    return state.took(step, replace(moved_settings, kv=settings.kv), moved)


def _kv_type(name: str, new_type: str) -> Callable[[Inputs, State, Allocation], State | None]:
    def step(inputs: Inputs, state: State, over: Allocation) -> State | None:
        kv = state.settings.kv
        if (
            _TYPE_ORDER.get(kv.type_k, 0) >= _TYPE_ORDER[new_type]
            and _TYPE_ORDER.get(kv.type_v, 0) >= _TYPE_ORDER[new_type]
        ):
            return None
        unverified = not backend_named(inputs.target.backend).q8_kv_verified
        if unverified and new_type == "q8_0" and not inputs.policy.openvino_q8:
            return state.noted("q8_0 KV skipped: never verified on OpenVINO (set quantized_kv.openvino_q8 to allow)")
        if not kv_quant_ok(inputs.facts, new_type):
            return state.noted(f"{new_type} KV skipped: a head dimension is not a multiple of {block_size(new_type)}")
        asked = inputs.request
        written = inputs.user_kv_types
        if written is None:
            written = (asked.type_k, asked.type_v) != ("f16", "f16")
        if inputs.policy.keep_user_kv and written:
            return state.noted(
                f"{new_type} KV skipped: your -ctk {asked.type_k} -ctv {asked.type_v} kept"
                " (keep_user_kv = false allows it)"
            )
        if inputs.policy.keep_user_kv and asked.flash_attn == "off":
            if _TYPE_ORDER.get(kv.type_k, 0) >= _TYPE_ORDER[new_type]:
                return None
            if backend_named(inputs.target.backend).quantized_k_attention_on_host:
                return state.noted(
                    f"{new_type} K skipped: your -fa off is kept, and {inputs.target.backend} runs a quantized K's"
                    " attention on the CPU without flash attention (keep_user_kv = false allows -fa on)"
                )
            settings = replace(state.settings, kv=replace(kv, type_k=new_type))
            why = (
                f"{describe(over)}: a {new_type} K cache (-ctk {new_type}); V stays {kv.type_v}: your -fa off is kept"
                " and llama.cpp quantizes V only under flash attention (keep_user_kv = false allows -fa on)"
            )
            return state.took(Step(name, why), settings, ("type_k",))
        settings = replace(state.settings, kv=replace(kv, type_k=new_type, type_v=new_type, flash_attn="on"))
        why = f"{describe(over)}: a {new_type} KV cache (-ctk {new_type} -ctv {new_type}, with -fa on as it requires)"
        return state.took(Step(name, why), settings, ("type_k", "type_v", "flash_attn"))

    return step


def _ctx(inputs: Inputs, state: State, over: Allocation) -> State | None:
    best = largest_ctx(inputs, state.settings, inputs.floor, inputs.asked_ctx)
    chosen = best if best is not None else min(inputs.floor, inputs.asked_ctx)
    if chosen >= inputs.asked_ctx:
        return None
    settings = replace(state.settings, kv=replace(state.settings.kv, n_ctx=chosen))
    reason = f"{describe(over)}: -c "
    taken = state.took(Step("ctx", f"{reason}{chosen}, the largest that fits"), settings, ("n_ctx",))
    return replace(taken, ctx_reason=reason)


def _ngl(inputs: Inputs, state: State, over: Allocation) -> State | None:
    if not _lowers_ngl(inputs):
        return None
    n_layer = inputs.facts.block_count
    settings = state.settings
    # the search starts below the current -ngl; llama.cpp's default (None) is searched from n_layer - 1 down
    start = n_layer if settings.n_gpu_layers is None else settings.n_gpu_layers
    chosen = next((n for n in range(start - 1, -1, -1) if inputs.fits(replace(settings, n_gpu_layers=n))), 0)
    step = Step("ngl", f"{describe(over)}: -ngl {chosen}, {layers_words(chosen, n_layer)} on the GPU")
    return state.took(step, replace(settings, n_gpu_layers=chosen), ("n_gpu_layers",))


# the ladder's step names (configs/planner.toml [ladder], plan.policy.STEPS) and what each does
LADDER: Mapping[str, Callable[[Inputs, State, Allocation], State | None]] = {
    "stateful": _stateful,
    "weights": _weights,
    "kv-q8": _kv_type("kv-q8", "q8_0"),
    "kv-q4": _kv_type("kv-q4", "q4_0"),
    "ctx": _ctx,
    "ngl": _ngl,
}


def walk(inputs: Inputs, state: State, ladder: tuple[str, ...]) -> State:
    """The ladder's steps in order until the plan fits; a step that does not apply leaves the state as it is."""
    for name in ladder:
        allocs = inputs.allocations(state.settings)
        if all(a.fits for a in allocs):
            break
        state = LADDER[name](inputs, state, worst(allocs)) or state
    return state


def ctx_by_type(inputs: Inputs, settings: LlamaSettings) -> dict[str, int]:
    """The largest context that fits per KV cache type (0: none), at the plan's other settings."""
    out: dict[str, int] = {}
    for type_name in ("f16", "q8_0", "q4_0"):
        if type_name != "f16" and not kv_quant_ok(inputs.facts, type_name):
            continue
        trial = replace(settings, kv=replace(settings.kv, type_k=type_name, type_v=type_name))
        out[type_name] = largest_ctx(inputs, trial, PAD, max(inputs.asked_ctx, PAD)) or 0
    return out
