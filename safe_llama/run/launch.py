"""Launch a llama.cpp tool with the plan, watch its start-up, retry smaller on an allocation failure,
remember what worked, and hand back the child's exit code.

Owns the attempt loop (run_attempts, its state in one _Loop) and what is said about it (one line per
change, one per failed attempt), and the early start's takeover (adopted). One attempt's body is
attempt.py's, the process handling supervise.py's, the decisions the planner's.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, NamedTuple

from safe_llama.errors import ExitStatus, ModelNotOnDisk, SafeLlamaError
from safe_llama.paths import cache_dir
from safe_llama.run import footprint
from safe_llama.run.attempt import LaunchRecord, Supervision, remember_kill, run_attempt
from safe_llama.run.say import Say
from safe_llama.run.sdnotify import Notifier, child_env
from safe_llama.state import check_cache
from safe_llama.units import human

if TYPE_CHECKING:  # the planner's side is imported where used: an early start may never need it
    from safe_llama.diagnosis.signatures import Failure
    from safe_llama.pipeline.prepare import LaunchOptions, PlanOptions, Prepared
    from safe_llama.run.early import Early
    from safe_llama.run.fast_record import Recorder
    from safe_llama.run.retry import Learned
    from safe_llama.run.supervise import Outcome

_MARGIN_SCALE = {"keep": 1.0, "band": -1.0}  # retry.Margin as planner.Target.margin_scale
# Tools whose readiness comes after every allocation of their start-up, so a start that does not fit is
# seen and retried. llama-server too: it is ready once its task loop answers (readiness.HealthProbe), not
# at `model loaded`, after which a context just past ulimit -v still aborts (std::system_error, exit 134).
_READY_AFTER_EVERY_ALLOCATION = frozenset({"cli", "completion", "server"})


def _remember_key(prepared: Prepared, binary: Path) -> str:
    from safe_llama import state
    from safe_llama.run import remember

    target = prepared.target
    identity = remember.Identity(
        model=state.file_key(Path(prepared.model_path)),
        binary=state.file_key(binary),
        binary_version=target.binary_version,
        # with RPC workers: each one's endpoint and budget (a different worker set is another machine)
        device=f"{target.backend}:{target.device or ''}"
        + "".join(f",{r.endpoint}={r.memory.value if r.memory.source == 'declared' else '?'}" for r in target.remote),
        device_memory=target.device_memory.value if target.device_memory else None,
        device_max_alloc=target.max_alloc.value if target.max_alloc else None,
        budget_source=remember.budget_source(target.host_budget.detail, target.host_budget.source),
        request=asdict(prepared.request.kv),
    )
    return remember.key(identity)


@dataclass
class _Loop:
    """What the attempt loop carries from one attempt to the next."""

    prepared: Prepared | None  # the facts and the plan of the next attempt; None: llama.cpp as given
    options: PlanOptions  # the planner's options, with what the failures taught
    learned: Learned  # the lessons so far (retry.learn)
    attempt: int = 0  # the number of the attempt being made
    last_kv: footprint.Footprint | None = None  # the last failed attempt's footprint: the next is smaller
    stepped: bool = False  # this attempt's size is a step below an earlier failure


class _Start(NamedTuple):
    """What one attempt starts: llama.cpp's arguments, the environment changes, and its footprint."""

    argv: list[str]
    extra_env: dict[str, str]
    kv_now: footprint.Footprint | None


def run_attempts(
    tool: str,
    args: Sequence[str],
    env: Mapping[str, str],
    options: LaunchOptions,
    *,
    recorder: Recorder | None = None,
    door: tuple[str, Sequence[str]] | None = None,
    first: Outcome | None = None,
) -> int:
    """The whole launch; returns the exit code safe-llama leaves with. recorder: the window that notes what
    this launch reads until attempt 1 starts (env is its recording mapping), for a launch record keyed by
    door (which door, its words); first: attempt 1 already ran (started early, it failed for memory)."""
    from safe_llama.cmdline.llama_args import redact_argv
    from safe_llama.device.binaries import find_binary
    from safe_llama.diagnosis.signatures import load_table
    from safe_llama.run import supervise
    from safe_llama.run.retry import Learned

    raw_env = recorder.raw if recorder is not None else env
    say = Say(raw_env)
    supervise.check_not_nested(env)
    unusable = check_cache(cache_dir(env))
    if unusable is not None:
        options = replace(options, remember=False)
        say(f"{unusable}: running without caching or remembering plans", "warning")
    binary = find_binary(tool, env=env, explicit=options.plan.llama_bin)
    table = load_table(
        Path(env["SAFE_LLAMA_SIGNATURES"]) if env.get("SAFE_LLAMA_SIGNATURES") else None, keep_in=cache_dir(env)
    )
    shared = Supervision(say, Notifier(raw_env), table)
    base_env = child_env(raw_env)
    prepared, plan_options = _prepare(tool, args, env, options.plan, binary, say), options.plan
    digest = None
    recalled = False  # a remembered plan was at hand: its use hangs on the budget, so no launch record
    if prepared is not None and options.remember:
        digest = _remember_key(prepared, binary)
        prepared, plan_options, recalled = _recall(prepared, plan_options, digest, env, say)
    if prepared is not None and first is None:  # an early start said them already
        for line in prepared.announce:
            _say(say, line, recorder)
    loop = _Loop(prepared, plan_options, Learned(max_alloc=plan_options.learned_max_alloc, kv_cap=plan_options.kv_cap))
    while True:
        loop.attempt += 1
        attempt, prepared = loop.attempt, loop.prepared
        start = _next_start(loop, args, options, say, recorder, said=first is not None and attempt == 1)
        last_kv, kv_now = loop.last_kv, start.kv_now
        if last_kv is not None and kv_now is not None and all(n >= b for n, b in zip(kv_now, last_kv, strict=True)):
            raise SafeLlamaError(
                f"safe-llama: no plan smaller than the one that failed ({human(last_kv[2])} of KV, "
                f"{human(last_kv[1])} of it on the device, {human(last_kv[0])} on the device in all); "
                f"giving up after {attempt - 1} attempt(s)",
                ExitStatus.RETRIES_EXHAUSTED,
            )
        if first is not None and attempt == 1:
            outcome = first
        else:
            status = f"attempt {attempt}: {os.path.basename(binary)} " + " ".join(redact_argv(start.argv))[:200]
            store, record = None, None
            if prepared is not None and digest is not None and prepared.plan is not None and _planned(loop, options):
                store = (digest, prepared, loop.options, env)
                if recorder is not None and door is not None and attempt == 1 and not recalled:
                    record = LaunchRecord(recorder, door, tool, args, start.argv, prepared, loop.options, status)
            outcome = run_attempt(
                shared,
                tool,
                [str(binary), *start.argv],
                {**base_env, **start.extra_env},
                number=attempt,
                status=status,
                store=store,
                record=record,
                recorder=recorder,
            )
        if outcome.killed_for_memory is not None and prepared is not None and prepared.plan is not None:
            remember_kill(prepared, digest, loop.options, outcome.killed_for_memory, env, say)
        if not outcome.retry:  # ready, stopped, or not memory: the child's own message is on the terminal
            return outcome.exit_code
        failure = outcome.failure
        assert failure is not None
        if prepared is None:
            say(f"start failed for lack of memory ({failure.line or failure.kind}); no plan to retry with", "error")
            return outcome.exit_code
        if attempt >= options.attempts:
            say(f"attempt {attempt} failed: {failure.line or failure.kind}; no attempts left", "error")
            return int(ExitStatus.RETRIES_EXHAUSTED)
        _learn(loop, prepared, failure, kv_now, tool, options, env, say)


def _say(say: Say, line: str, recorder: Recorder | None) -> None:
    """A line of the plan; inside a launch record's window the record keeps it to say again."""
    if recorder is not None:
        recorder.say(say, line)
    else:
        say(line)


def _prepare(
    tool: str, args: Sequence[str], env: Mapping[str, str], options: PlanOptions, binary: Path, say: Say
) -> Prepared | None:
    """The facts and the plan; None where llama.cpp runs as given (a model it downloads, words not planned)."""
    from safe_llama.pipeline.prepare import prepare

    try:
        return prepare(tool, args, env, options, binary=binary)
    except ModelNotOnDisk as missing:  # llama.cpp downloads it; its own fitting stays on
        say(missing.message.removeprefix("safe-llama: "))
    except SafeLlamaError as err:
        if err.status not in (ExitStatus.USAGE,):
            raise
        say(f"not planning ({err.message.removeprefix('safe-llama: ')}); running llama.cpp as given", "warning")
    return None


def _recall(
    prepared: Prepared, options: PlanOptions, digest: str, env: Mapping[str, str], say: Say
) -> tuple[Prepared, PlanOptions, bool]:
    """The plan with what was remembered under this key: (prepared, options, whether a KV size was used)."""
    from safe_llama.pipeline.prepare import replan
    from safe_llama.run import remember

    known = remember.recall(digest, env)
    if known is not None and known.learned_max_alloc is not None:  # the device's own limit: any budget
        options = replace(options, learned_max_alloc=known.learned_max_alloc)
        prepared = replan(prepared, options, env)
    if known is not None and not remember.usable(known, prepared.target.host_budget.value):
        known = None  # the size was learned under a tighter budget than this launch has: plan afresh
    if known is not None and prepared.plan is not None and prepared.plan.kv.total_bytes > known.kv_bytes:
        # the plan would ask for more than what last started here: start from what worked
        options = replace(options, kv_cap=known.kv_bytes)
        prepared = replan(prepared, options, env)
        why = "a larger plan was killed for lack of memory once ready" if known.after_oom else "it worked before"
        say(f"starting from the plan with {human(known.kv_bytes)} of KV: {why}")
        return prepared, options, True
    return prepared, options, False


def _next_start(
    loop: _Loop, args: Sequence[str], options: LaunchOptions, say: Say, recorder: Recorder | None, *, said: bool
) -> _Start:
    """What this attempt starts, its plan's lines said (said: an early start said them already)."""
    from safe_llama.pipeline.prepare import final_argv

    prepared, attempt = loop.prepared, loop.attempt
    if prepared is None:
        return _Start(list(args), {}, None)
    if not _planned(loop, options):
        return _Start(final_argv(replace(prepared, plan=None)), {}, footprint.unplanned_footprint(prepared))
    if prepared.plan is None:
        assert prepared.error is not None
        if attempt == 1:
            raise prepared.error
        raise SafeLlamaError(
            f"{prepared.error.message} (after {attempt - 1} failed start(s))", ExitStatus.RETRIES_EXHAUSTED
        )
    if not said:
        for step in prepared.plan.steps:
            _say(say, step.reason, recorder if attempt == 1 else None)
    return _Start(final_argv(prepared), dict(prepared.plan.env_changes), footprint.planned_footprint(prepared))


def _learn(
    loop: _Loop,
    prepared: Prepared,
    failure: Failure,
    kv_now: footprint.Footprint | None,
    tool: str,
    options: LaunchOptions,
    env: Mapping[str, str],
    say: Say,
) -> None:
    """After a start that failed for memory: the lesson, said, and the next attempt's plan in loop."""
    from safe_llama.pipeline.prepare import free_again, replan
    from safe_llama.run.retry import learn

    if _worker_failed(failure) and prepared.plan is not None and prepared.target.remote:
        # an RPC worker stopped: the same KV with a smaller share for that worker is the next plan
        loop.options = _after_lost_worker(prepared, loop.options, failure, loop.attempt, say)
        loop.prepared = replan(prepared, loop.options, env)
        loop.last_kv, loop.stepped = None, False
        return
    loop.last_kv = kv_now
    lower = replan(prepared, replace(loop.options, kv_cap=None, margin_scale=1.0), env).plan
    planned = _planned(loop, options)
    lesson = learn(
        footprint.attempted(prepared, kv_now, planned=planned, stepped=loop.stepped),
        failure,
        loop.learned,
        lower_kv=lower.kv.total_bytes if lower is not None else None,
        # the band only below a planned start that failed: after an unplanned one (--no-predict) the next
        # plan keeps the margin, as a predicted launch does
        search_band=prepared.target.address_space_budget and tool in _READY_AFTER_EVERY_ALLOCATION and planned,
    )
    learned = loop.learned = lesson.learned
    loop.options = replace(
        loop.options,
        learned_max_alloc=learned.max_alloc,
        compute_extra=learned.compute_extra,
        kv_cap=learned.kv_cap,
        margin_scale=_MARGIN_SCALE[learned.margin],
        device_cap=learned.device_cap,
    )
    say(f"attempt {loop.attempt} failed: {failure.line or failure.kind}; retrying: {lesson.reason}", "warning")
    prepared, moved = free_again(prepared, env)
    if moved:
        say(moved)
    loop.prepared = replan(prepared, loop.options, env)
    loop.stepped = footprint.cap_binds(loop.prepared, loop.options, env)


WORKER_WAIT = 30.0  # seconds a worker that stopped may take to answer again (systemd restarts it in 0.1 s)


def _after_lost_worker(
    prepared: Prepared, options: PlanOptions, failure: Failure, attempt: int, say: Say
) -> PlanOptions:
    """Name the RPC worker that stopped, wait (bounded) until it answers again, and cap its next share."""
    from safe_llama.plan.memory import memory_by_place
    from safe_llama.run import workers
    from safe_llama.run.retry import worker_cap

    assert prepared.plan is not None
    places = memory_by_place(prepared.facts, prepared.plan.settings, prepared.target)
    held = {r.name: sum(places.get(r.name, {}).values()) for r in prepared.target.remote}
    named = workers.endpoint_of(failure.buffer)
    refused = next((r for r in prepared.target.remote if r.endpoint == named), None)
    if refused is not None:  # it is alive and said which allocation it could not make
        worker, seen = refused, False
        how = f"could not allocate {human(failure.requested_bytes or 0)}"
    else:
        found = workers.lost_worker(prepared.target.remote, lambda r: held[r.name] / max(r.memory.value, 1))
        assert found is not None
        worker, seen = found
        how = "stopped during the start" if seen else "most likely stopped (all answer again; it was the fullest)"
    caps = dict(options.worker_caps)
    cap = worker_cap(held[worker.name], caps.get(worker.endpoint))
    caps[worker.endpoint] = cap
    say(
        f"attempt {attempt} failed: RPC worker {worker.label} {how}, with {human(held[worker.name])} planned there "
        f"({failure.line or failure.kind}); retrying with at most {human(cap)} on it",
        "warning",
    )
    if seen and not workers.wait_back(worker.endpoint, WORKER_WAIT):
        raise SafeLlamaError(
            f"safe-llama: RPC worker {worker.label} stopped during the start and did not answer again within "
            f"{WORKER_WAIT:.0f} s",
            ExitStatus.WORKER_UNAVAILABLE,
        )
    return replace(options, worker_caps=tuple(sorted(caps.items())))


def _worker_failed(failure: Failure) -> bool:
    """An RPC worker stopped (its connection broke) or refused an allocation (the buffer names it)."""
    from safe_llama.run.workers import endpoint_of

    return failure.stage == "worker" or endpoint_of(failure.buffer) is not None


def _planned(loop: _Loop, options: LaunchOptions) -> bool:
    """The attempt starts the plan (not llama.cpp's own sizes): with prediction on, or after a failure."""
    return options.predict or loop.attempt > 1


def run_launch(
    tool: str, args: list[str], given: dict[str, str], *, door: tuple[str, Sequence[str]] | None = None
) -> int:
    """The supervised launch with safe-llama's own options resolved (flags over SAFE_LLAMA_* over the config
    file); callers have already handed no-model invocations to llama.cpp (`passthrough.pass_through_early`).
    door: which door was used and its words, to key a launch record for the next start (early.py)."""
    from safe_llama.cmdline import launch_args
    from safe_llama.pipeline.options import launch_options

    if door is None:
        settings, origins = launch_args.resolve_sourced(given, os.environ)
        return run_attempts(tool, args, os.environ, launch_options(settings, origins))
    from safe_llama.run.fast_record import Recorder

    with Recorder(os.environ) as recorder:
        settings, origins = launch_args.resolve_sourced(given, recorder.env)
        options = launch_options(settings, origins)
        return run_attempts(tool, args, recorder.env, options, recorder=recorder, door=door)


def adopted(early: Early, door_args: list[str]) -> int:
    """Attempt 1 started early from a launch record, supervised as run_attempts() supervises its own; when it
    fails for memory the record is dropped and run_attempts() goes on from there (plans, learns, retries)."""
    from safe_llama.diagnosis.signatures import load_table

    env = os.environ
    tool = early.tool
    say = Say(env)
    for message, level in early.lines:
        say(message, level)
    table = load_table(
        Path(env["SAFE_LLAMA_SIGNATURES"]) if env.get("SAFE_LLAMA_SIGNATURES") else None, keep_in=cache_dir(env)
    )
    shared = Supervision(say, Notifier(env), table)
    outcome = run_attempt(shared, tool, early.argv, early.env, number=1, status=early.status, started=early.started)
    from safe_llama.run import fast_record

    if outcome.retry or outcome.killed_for_memory is not None:  # the recorded plan failed for memory: next, plan
        fast_record.drop(early.path)
    if not outcome.retry:
        return outcome.exit_code
    from safe_llama.cmdline import launch_args
    from safe_llama.pipeline.options import launch_options

    if early.door == tool:  # a drop-in door: its words are the tool's
        args, given = list(door_args), {}
    else:
        request = launch_args.split(door_args)
        assert request is not None  # a record is only stored for words that were a launch
        args, given = list(request.args), dict(request.settings)
    settings, origins = launch_args.resolve_sourced(given, env)
    return run_attempts(tool, args, env, launch_options(settings, origins), first=outcome)
