"""Remedies from a log's numbers alone, when the model is not at hand: without its layers no cache can be
planned (plan_kv), so the failed allocation is scaled in proportion to the context and the cache type (exact
for a cache that grows with the context; a sliding-window cache stops at its window). The grid is kv's, the
share for a failure that names no limit is the policy's. Pure: must not read files or probe.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from fractions import Fraction

from safe_llama.backends.registry import backend_named
from safe_llama.cmdline.llama_args import parse
from safe_llama.cmdline.memory_flags import changes_of
from safe_llama.cmdline.request import to_request
from safe_llama.diagnosis.remedies import (
    STEP_SUMMARY,
    FailedAllocation,
    FailedCommand,
    LogMachine,
    Remedy,
    bytes_words,
    ready_command,
    stage_remedies,
    step_notes,
)
from safe_llama.errors import SafeLlamaError
from safe_llama.model.kv import PAD, block_size, ctx_unit, row_bytes
from safe_llama.plan.policy import Policy
from safe_llama.units import human


def _type_bytes(type_name: str) -> Fraction:
    return Fraction(row_bytes(type_name, block_size(type_name)), block_size(type_name))


def _grid(budget: int | Fraction, bytes_at: int | Fraction, cells: int, unit: int = PAD) -> int:
    """The largest multiple of `unit` tokens whose bytes (bytes_at at `cells`, proportional) fit in budget."""
    if bytes_at <= 0:
        return 0
    return int(Fraction(budget) * cells / (Fraction(bytes_at) * unit)) * unit


def _unit(run: FailedCommand) -> int:
    """The failed command's context grid (kv.ctx_unit); one stream's when llama.cpp would reject its values."""
    try:
        return ctx_unit(to_request(parse(run.tool, run.args, run.env)).kv)
    except (SafeLlamaError, ValueError):
        return PAD


@dataclass(frozen=True)
class _Numbers:
    """What the log's numbers say a remedy must fit: the failed allocation and the budget it must get under."""

    requested: int
    budget: Fraction  # the device's limit less the margin, or the policy's share of the failed allocation
    budget_words: str
    device_limit: bool
    n_ctx: int | None  # the cells the failed allocation was sized for
    unit: int  # the contexts llama.cpp makes are multiples of this (kv.ctx_unit)
    backend: str
    types: tuple[str, str]  # K and V cache types of the failed run

    @property
    def bytes_per_element(self) -> Fraction:
        return (_type_bytes(self.types[0]) + _type_bytes(self.types[1])) / 2


def _numbers(
    failure: FailedAllocation, backend: str, run: FailedCommand, facts: LogMachine, policy: Policy
) -> _Numbers | None:
    requested, limit = failure.requested_bytes, failure.limit_bytes
    if requested is None:
        return None
    types = (facts.type_k or "f16", facts.type_v or "f16")
    unit = _unit(run)
    if limit is not None and requested > limit:
        margin = int(policy.per_backend(policy.max_alloc_margin, backend))
        words = f"the limit less safe-llama's {human(margin)} margin ({limit - margin:,} bytes)"
        return _Numbers(requested, Fraction(limit - margin), words, True, run.n_ctx, unit, backend, types)
    share = policy.failed_alloc_share
    words = (
        f"{share.numerator}/{share.denominator} of the allocation that failed "
        "(how much memory that run had is not in the log)"
    )
    return _Numbers(requested, requested * share, words, False, run.n_ctx, unit, backend, types)


def _stateful_remedy(n: _Numbers, run: FailedCommand, facts: LogMachine, policy: Policy) -> Remedy | None:
    stateful_env = backend_named(n.backend).stateful_env
    if stateful_env is None or not n.device_limit:
        return None  # only OpenVINO moves the KV cache to the device, and only a device limit is escaped this way
    changes: dict[str, str | bool] = {"--parallel": "1"} if run.tool == "server" and facts.n_seq_max != 1 else {}
    env = {stateful_env: "1"}
    return Remedy(
        "stateful",
        STEP_SUMMARY["stateful"],
        "OpenVINO then makes no device object for the KV cache, so the device's per-allocation limit no longer "
        "applies to it",
        ready_command(run, changes, env),
        env,
        changes,
        tuple(step_notes("stateful", n.backend, n.requested, policy, tool=run.tool, model_known=False)),
    )


def _ctx_remedy(n: _Numbers, run: FailedCommand, facts: LogMachine, policy: Policy) -> Remedy | None:
    if n.n_ctx is None:
        share = float(n.budget / n.requested)
        return Remedy(
            "ctx",
            f"a smaller context: at most {share:.2%} of the one that failed",
            f"the largest multiple of {n.unit} tokens at or under {share:.2%} of the failed run's context keeps the "
            f"allocation within {n.budget_words}; the log does not say that context: give it to explain "
            "(safe-llama explain FILE -c N) for the exact number",
            None,
        )
    ctx = _grid(n.budget, n.requested, n.n_ctx, n.unit)
    if ctx < n.unit:
        return None
    changes = changes_of({"n_ctx": ctx})
    return Remedy(
        "ctx",
        f"a smaller context: -c {ctx}",
        f"-c {ctx} is the largest multiple of {n.unit} whose allocation "
        f"({bytes_words(n.requested * ctx // n.n_ctx)}) stays within {n.budget_words}",
        ready_command(run, changes, {}),
        {},
        changes,
        () if ctx >= policy.ctx_floor else (f"below safe-llama's floor of {policy.ctx_floor} tokens",),
    )


def _quant_remedy(quant: str) -> Callable[[_Numbers, FailedCommand, LogMachine, Policy], Remedy | None]:
    step = "kv-q8" if quant == "q8_0" else "kv-q4"

    def remedy(n: _Numbers, run: FailedCommand, facts: LogMachine, policy: Policy) -> Remedy | None:
        if quant == "q8_0" and not backend_named(n.backend).q8_kv_verified and not policy.openvino_q8:
            return None
        if _type_bytes(quant) >= n.bytes_per_element:
            return None  # the cache is already this small
        factor = _type_bytes(quant) / n.bytes_per_element
        new = n.requested * factor
        share = f"{quant} takes {float(factor):.1%} of the {n.types[0]}/{n.types[1]} cache"
        changes = changes_of({"type_k": quant, "type_v": quant, "flash_attn": "on"})
        caveats = tuple(step_notes(step, n.backend, n.requested, policy, tool=run.tool, model_known=False))
        if new <= n.budget:
            summary = f"a quantized cache: {quant} K and V at the same context"
            detail = (
                f"{share}: {bytes_words(round(new))}, within {n.budget_words}; flash attention on, as a quantized V "
                "cache requires"
            )
        elif n.n_ctx is not None:
            ctx = _grid(n.budget, new, n.n_ctx, n.unit)
            if ctx < n.unit:
                return None
            changes |= changes_of({"n_ctx": ctx})
            summary = f"a quantized cache: {quant} K and V at -c {ctx}"
            detail = f"{share}; -c {ctx} is the largest context whose cache stays within {n.budget_words}"
        else:
            at_most = float(n.budget / new)
            summary = f"a quantized cache ({quant}) and a context at most {at_most:.2%} of the one that failed"
            return Remedy(step, summary, share, None, {}, changes, caveats)
        return Remedy(step, summary, detail, ready_command(run, changes, {}), {}, changes, caveats)

    return remedy


# The ladder's steps that the log's numbers alone can compute (ngl needs the model's layer sizes).
_NUMBER_STEPS: Mapping[str, Callable[[_Numbers, FailedCommand, LogMachine, Policy], Remedy | None]] = {
    "stateful": _stateful_remedy,
    "ctx": _ctx_remedy,
    "kv-q8": _quant_remedy("q8_0"),
    "kv-q4": _quant_remedy("q4_0"),
}


def number_remedies(
    failure: FailedAllocation, stage: str | None, facts: LogMachine, run: FailedCommand, policy: Policy
) -> tuple[list[Remedy], list[str]]:
    """What would fit, from the log's numbers alone (no model): the failed allocation against the limit,
    step by step in the order of the backend's degrade ladder (configs/planner.toml)."""
    if stage not in (None, "kv", "context"):
        return stage_remedies(stage, run), []
    backend = facts.backend or "cpu"
    numbers = _numbers(failure, backend, run, facts, policy)
    if numbers is None:
        return [], ["the log gives no size for the failed allocation: nothing to compute a context from"]
    notes = []
    if facts.type_k is None:
        notes.append("the KV cache types are not in the log (only at -lv 4): f16, llama.cpp's default, assumed")
    remedies = []
    for step in policy.ladder_for(backend, run.tool):
        compute = _NUMBER_STEPS.get(step)
        found = compute(numbers, run, facts, policy) if compute is not None else None
        if found is not None:
            remedies.append(found)
        elif step == "ngl" and facts.on_gpu:
            notes.append("fewer layers on the GPU (-ngl) is not computed: it needs the model's layer sizes (-m MODEL)")
    return remedies, notes


def per_token_words(requested: int, n_ctx: int) -> str:
    """The failed allocation per token of its context."""
    per = Fraction(requested, n_ctx)
    if per.denominator == 1:
        return f"{requested:,} bytes = {int(per):,} bytes per token x {n_ctx} tokens"
    return f"{requested:,} bytes at {n_ctx} tokens, about {float(per):,.0f} bytes per token"
