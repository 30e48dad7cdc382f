"""What would have let a failed start fit, as commands to paste: each step of the backend's degrade ladder
planned exactly by the planner from the model's facts, against the machine the log describes (`log_target`).
Owns remedies and their commands; the log's numbers alone (no model) are number_remedies'. Pure: values in,
values out; must not read logs or files, probe this machine, or run anything.
"""

from __future__ import annotations

import shlex
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Protocol

from safe_llama.backends.registry import backend_named
from safe_llama.cmdline.llama_args import CommandLine, parse, redact_argv, redact_env, rewrite
from safe_llama.cmdline.memory_flags import LlamaSettings
from safe_llama.cmdline.request import Request, to_request
from safe_llama.constants import TOOL_BINARY
from safe_llama.device.host_budget import HostLimit
from safe_llama.device.limits import Sourced
from safe_llama.errors import ExitStatus, SafeLlamaError
from safe_llama.model.facts import ModelFacts
from safe_llama.model.kv import DEFAULT_N_UBATCH, KvRequest, plan_kv
from safe_llama.plan.allocation_words import describe, limit_words
from safe_llama.plan.lessons import Lessons
from safe_llama.plan.memory import allocations
from safe_llama.plan.planner import Plan, plan
from safe_llama.plan.policy import Policy
from safe_llama.plan.target import Probed, Target, target_policy
from safe_llama.units import human

# The host budget planned against when the log names none: no limit; a share of the failed KV stands in.
UNKNOWN_HOST = 1 << 60


class FailedCommand(Protocol):
    """The failed command as far as it is known (diagnosis.failed_run.FailedRun)."""

    @property
    def tool(self) -> str: ...
    @property
    def args(self) -> tuple[str, ...]: ...
    @property
    def env(self) -> Mapping[str, str]: ...
    @property
    def n_ctx(self) -> int | None: ...  # the cells the failed allocation was sized for
    @property
    def program(self) -> str | None: ...  # the tool's full path, when known


class LogMachine(Protocol):
    """What a log says of the failed run's machine and KV cache (diagnosis.log_reading.LogFacts)."""

    @property
    def backend(self) -> str | None: ...
    @property
    def on_gpu(self) -> bool | None: ...
    @property
    def integrated(self) -> bool | None: ...
    @property
    def device(self) -> str | None: ...
    @property
    def address_space_limit(self) -> int | None: ...
    @property
    def address_space_from(self) -> str: ...
    @property
    def n_seq_max(self) -> int | None: ...
    @property
    def type_k(self) -> str | None: ...
    @property
    def type_v(self) -> str | None: ...


class FailedAllocation(Protocol):
    """The failure, as far as remedies need it (run.signatures.Failure)."""

    @property
    def memory(self) -> bool: ...
    @property
    def requested_bytes(self) -> int | None: ...
    @property
    def limit_bytes(self) -> int | None: ...


class ModelInputs(Protocol):
    """The failed command read with its model's facts (run.prepare.Prepared)."""

    @property
    def cmd(self) -> CommandLine: ...
    @property
    def request(self) -> Request: ...
    @property
    def model_path(self) -> str: ...
    @property
    def facts(self) -> ModelFacts: ...


@dataclass(frozen=True)
class Remedy:
    step: str  # stateful, ctx, kv-q8, kv-q4, ngl, safe-llama, or a not-memory fix
    summary: str
    detail: str
    command: str | None  # ready to paste; None when the log lacks a number it needs
    env: Mapping[str, str] = field(default_factory=dict)
    argv_changes: Mapping[str, str | bool] = field(default_factory=dict)
    notes: tuple[str, ...] = ()


STEP_SUMMARY = {
    "stateful": "stateful execution: keep the KV cache in host RAM",
    "ctx": "a smaller context",
    "kv-q8": "a quantized cache: q8_0 K and V",
    "kv-q4": "a quantized cache: q4_0 K and V",
    "ngl": "fewer layers on the GPU",
}


def bytes_words(n: int | None) -> str:
    return "an unknown amount" if n is None else f"{n:,} bytes ({human(n)})"


def ready_command(
    run: FailedCommand,
    changes: Mapping[str, str | bool],
    env: Mapping[str, str],
    *,
    argv: Sequence[str] | None = None,
) -> str:
    """A command line to paste: environment, the tool, the failed run's options with the changes; redacted."""
    if argv is None:
        argv = rewrite(parse(run.tool, run.args, {}), changes)
    words = [f"{k}={shlex.quote(v)}" for k, v in redact_env({**run.env, **env}).items()]
    words.append(shlex.quote(run.program or TOOL_BINARY[run.tool]))
    words += [shlex.quote(a) for a in redact_argv(argv)]
    return " ".join(words)


def step_notes(
    step: str, backend: str, kv_bytes: int | None, policy: Policy, *, tool: str, model_known: bool
) -> list[str]:
    """The caveats of a remedy, the same whether it was planned or computed from the log."""
    if step == "stateful":
        held = f" ({human(kv_bytes)})" if kv_bytes is not None else ""
        slot = ", and llama-server runs a single slot (-np 1)" if tool == "server" else ""
        return [
            "not OpenVINO's default mode: the workaround verified in the original report",
            f"host RAM must then hold the KV cache{held}{slot}",
        ]
    notes = []
    if step in ("kv-q8", "kv-q4"):
        if not model_known:
            notes.append("a quantized K cache needs head sizes divisible by 32: not checked without the model")
        if not backend_named(backend).q8_kv_verified and not policy.openvino_q8:
            notes.append("q8_0 was never verified on OpenVINO, so it is not offered there")
    return notes


def _batch_remedy(run: FailedCommand) -> Remedy | None:
    """A smaller micro-batch than the failed run's own (its -ub, capped by its -b as llama.cpp caps it): the
    compute buffers are sized for one micro-batch. llama.cpp's default when the run's was larger, else half."""
    cmd = parse(run.tool, run.args, run.env)
    try:
        kv = to_request(cmd).kv
    except (SafeLlamaError, ValueError):
        kv = KvRequest(tool=run.tool)
    # llama.cpp's micro-batch: -ub, capped by -b, and -b by the context
    sizes = {"-ub": kv.n_ubatch or kv.n_batch, "-b": kv.n_batch, "-c": kv.n_ctx or kv.n_batch}
    current = min(sizes.values())
    smaller = DEFAULT_N_UBATCH if current > DEFAULT_N_UBATCH else current // 2
    if smaller < 1:
        return None  # a micro-batch of one token: only a smaller context is left (the ctx remedies)
    bound = next(flag for flag, size in sizes.items() if size == current)
    given = bound != "-ub" or cmd.value("--ubatch-size") is not None
    was = f"{current} tokens ({bound} {current}{'' if given else ', llama.cpp default'})"
    changes: dict[str, str | bool] = {"--ubatch-size": str(smaller)}
    return Remedy(
        "batch",
        f"a smaller micro-batch: -ub {smaller}",
        f"the compute buffers are sized for one micro-batch and grow with it and with the context: -ub {smaller} "
        f"instead of the failed run's {was}; a prompt is then processed in more, smaller steps",
        ready_command(run, changes, {}),
        {},
        changes,
    )


def stage_remedies(stage: str, run: FailedCommand) -> list[Remedy]:
    """For an allocation that was not the KV cache: the compute buffers, the weights."""
    if stage == "compute":
        batch = _batch_remedy(run)
        return [] if batch is None else [batch]
    if stage == "weights":
        return [
            Remedy(
                "weights",
                "a smaller model file, or more memory",
                "the weights alone did not fit: a smaller quantization of the model (Q4_K_M instead of Q8_0, ...), "
                "fewer layers on a GPU (-ngl) when it was device memory, or a higher limit (ulimit -v, cgroup)",
                None,
            )
        ]
    return []


def safe_llama_remedy(run: FailedCommand, whole: Plan | None) -> Remedy:
    args = " ".join(shlex.quote(a) for a in redact_argv(list(run.args)))
    if whole is not None and whole.steps:
        detail = "it would: " + "; ".join(s.reason for s in whole.steps)
    else:
        detail = (
            "it plans against this machine's limits, and after an allocation failure retries smaller, "
            "learning the device's limit from its message"
        )
    return Remedy("safe-llama", "or let safe-llama plan it", detail, f"safe-llama {run.tool} {args}".rstrip())


def log_target(facts: LogMachine, failure: FailedAllocation, policy: Policy) -> tuple[Target, str | None]:
    """The machine that wrote the log, as far as the log tells: its backend and device, the limit its own
    error named, a `ulimit -v` it quotes. Nothing of this machine: explain may run anywhere."""
    backend = facts.backend or "cpu"
    on_gpu = bool(facts.on_gpu) and backend != "cpu"
    limits: tuple[HostLimit, ...] = ()
    budget = Sourced(UNKNOWN_HOST, "declared", "not in the log")
    if facts.address_space_limit is not None:
        budget = Sourced(facts.address_space_limit, "declared", facts.address_space_from)
        limits = (HostLimit("address space", budget),)
    probed = Probed(
        backend=backend,
        host_budget=budget,
        address_space_budget=bool(limits),
        on_gpu=on_gpu,
        integrated=bool(facts.integrated),
        device=facts.device,
        host_limits=limits,
    )
    target = Target.of(
        probed, target_policy(policy, probed), Lessons(learned_max_alloc=failure.limit_bytes if on_gpu else None)
    )
    note = None
    if on_gpu and facts.integrated is None:
        note = "whether that GPU is integrated is not in the log: planned as a discrete one"
    return target, note


def kv_identity(inputs: ModelInputs, requested: int | None) -> tuple[str | None, bool]:
    """When the failed allocation is exactly one of this model's KV caches, say so (and that it was whole)."""
    if requested is None:
        return None, False
    kv = plan_kv(inputs.facts, inputs.request.kv)
    for cache in kv.caches:
        if requested == cache.total_bytes:
            per_cell = cache.total_bytes // max(cache.cells * cache.n_stream, 1)
            kind = "" if len(kv.caches) == 1 else f"{cache.kind} "
            return (
                f"that is exactly this model's {kind}KV cache at this context: {cache.layers} layers x "
                f"{cache.cells} cells, K {cache.type_k} and V {cache.type_v}, {per_cell:,} bytes per token",
                True,
            )
    return None, False


def plan_remedies(
    inputs: ModelInputs,
    target: Target,
    policy: Policy,
    failure: FailedAllocation,
    run: FailedCommand,
    *,
    kv_failed: bool,
) -> tuple[list[Remedy], list[str], Plan | None]:
    """What would fit, planned exactly from the model's facts against `target` (the limit learned from the
    log included): each step of the backend's ladder on its own, then the whole ladder (what safe-llama
    would launch; None when nothing fits). When the command fits this machine as asked, the failed run had less
    memory: if the KV cache was what failed (`kv_failed`), the plans keep it under the policy's share of the one
    that failed."""
    notes: list[str] = []
    req = inputs.request
    ngl = req.n_gpu_layers
    user_ngl = int(ngl) if ngl is not None and ngl.lstrip("-").isdigit() and int(ngl) >= 0 else None
    user_fit = inputs.cmd.get("--fit") is not None

    def attempt(ladder: Sequence[str] | None) -> Plan | None:
        try:
            return plan(inputs.facts, req.kv, target, policy, ladder=ladder, user_fit_set=user_fit, user_ngl=user_ngl)
        except SafeLlamaError as err:
            if err.status != ExitStatus.NOTHING_FITS:
                raise
            if ladder is None:
                notes.append(err.message.removeprefix("safe-llama: "))
            return None

    as_asked = allocations(inputs.facts, LlamaSettings(kv=req.kv, n_gpu_layers=user_ngl), target, policy)
    if failure.memory and all(a.fits for a in as_asked):
        named = [limit_words(a) for a in as_asked if a.limit < UNKNOWN_HOST // 2]
        notes.append(
            "as asked, the command fits "
            + (
                f"every limit planned against ({'; '.join(named)})"
                if named
                else "everything the log says of its machine"
            )
            + ": that run had less memory than it needed (a ulimit -v, a cgroup limit, other programs), and how "
            "much is not in the log"
        )
        if not kv_failed:
            return [], notes, attempt(None)
        share = policy.failed_alloc_share
        failed_kv = plan_kv(inputs.facts, req.kv).total_bytes
        cap = int(failed_kv * share)
        notes.append(
            f"the plans keep the KV cache at or under {human(cap)}, {share.numerator}/{share.denominator} of "
            f"the {human(failed_kv)} that failed"
        )
        target = replace(target, kv_cap=cap)

    remedies: list[Remedy] = []
    kv_bytes = plan_kv(inputs.facts, req.kv).total_bytes
    for step in policy.ladder_for(target.backend, req.kv.tool):
        decided = attempt((step,))
        if decided is None or step not in [s.name for s in decided.steps]:
            continue
        # the model named explicitly: the log's, or explain's -m
        argv = rewrite(inputs.cmd, {**decided.argv_changes, "--model": inputs.model_path})
        summary = STEP_SUMMARY.get(step, step)
        if step == "ctx":
            summary += f": -c {decided.argv_changes.get('--ctx-size')}"
        remedies.append(
            Remedy(
                step,
                summary,
                _remedy_size(decided, step),
                ready_command(run, decided.argv_changes, decided.env_changes, argv=argv),
                dict(decided.env_changes),
                dict(decided.argv_changes),
                (*decided.notes, *step_notes(step, target.backend, kv_bytes, policy, tool=run.tool, model_known=True)),
            )
        )
    return remedies, notes, attempt(None)


def _remedy_size(decided: Plan, step: str) -> str:
    """The remedy's own size against the tightest limit the log names (not the size that failed); a step that
    moves the allocation off that limit (stateful) says what it did instead."""
    named = [a for a in decided.allocations if a.limit < UNKNOWN_HOST // 2]
    if named and step != "stateful":
        return describe(max(named, key=lambda a: a.bytes / max(a.limit, 1)))
    return "; ".join(s.reason for s in decided.steps if s.name == step)
