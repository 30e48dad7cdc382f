"""Launch a llama.cpp tool with the plan, watch its start-up, retry smaller on an allocation failure,
remember what worked, and hand back the child's exit code.

Owns the attempt loop and what is said about it (one line per change, one per failed attempt). The
process handling is supervise.py's, the decisions the planner's.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from dataclasses import asdict, replace
from pathlib import Path
from typing import TYPE_CHECKING

from safe_llama.errors import ExitStatus, ModelNotOnDisk, SafeLlamaError
from safe_llama.paths import cache_dir
from safe_llama.run.attempt import EXTEND_TIMEOUT, LaunchRecord, NotifyingProbe, ReadyActions, Watcher, remember_kill
from safe_llama.run.say import Say
from safe_llama.run.sdnotify import Notifier, child_env
from safe_llama.state import check_cache
from safe_llama.units import human

if TYPE_CHECKING:  # the planner's side is imported where used: an early start may never need it
    from safe_llama.diagnosis.signatures import Failure
    from safe_llama.pipeline.prepare import LaunchOptions, PlanOptions, Prepared
    from safe_llama.run.early import Early
    from safe_llama.run.fast_record import Recorder
    from safe_llama.run.retry import Attempt
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


def run(
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
    from safe_llama.pipeline.prepare import final_argv, free_again, prepare, replan
    from safe_llama.run import remember, supervise
    from safe_llama.run.readiness import HealthProbe, probe_for
    from safe_llama.run.retry import Learned, learn

    raw_env = recorder.raw if recorder is not None else env
    say = Say(raw_env)
    supervise.check_not_nested(env)
    unusable = check_cache(cache_dir(env))
    if unusable is not None:
        options = replace(options, remember=False)
        say(f"{unusable}: running without caching or remembering plans", "warning")
    binary = find_binary(tool, env=env, explicit=options.plan.llama_bin)
    table = load_table(Path(env["SAFE_LLAMA_SIGNATURES"]) if env.get("SAFE_LLAMA_SIGNATURES") else None)
    notifier = Notifier(raw_env)
    base_env = child_env(raw_env)
    plan_options = options.plan
    try:
        prepared: Prepared | None = prepare(tool, args, env, plan_options, binary=binary)
    except ModelNotOnDisk as missing:  # llama.cpp downloads it; its own fitting stays on
        say(missing.message.removeprefix("safe-llama: "))
        prepared = None
    except SafeLlamaError as err:
        if err.status not in (ExitStatus.USAGE,):
            raise
        say(f"not planning ({err.message.removeprefix('safe-llama: ')}); running llama.cpp as given", "warning")
        prepared = None
    digest = None
    recalled = False  # a remembered plan was at hand: its use hangs on the budget, so no launch record
    if prepared is not None and options.remember:
        digest = _remember_key(prepared, binary)
        known = remember.recall(digest, env)
        if known is not None and known.learned_max_alloc is not None:  # the device's own limit: any budget
            plan_options = replace(plan_options, learned_max_alloc=known.learned_max_alloc)
            prepared = replan(prepared, plan_options, env)
        if known is not None and not remember.usable(known, prepared.target.host_budget.value):
            known = None  # the size was learned under a tighter budget than this launch has: plan afresh
        if known is not None and prepared.plan is not None and prepared.plan.kv.total_bytes > known.kv_bytes:
            # the plan would ask for more than what last started here: start from what worked
            plan_options = replace(plan_options, kv_cap=known.kv_bytes)
            prepared = replan(prepared, plan_options, env)
            why = "a larger plan was killed for lack of memory once ready" if known.after_oom else "it worked before"
            say(f"starting from the plan with {human(known.kv_bytes)} of KV: {why}")
            recalled = True
    if prepared is not None and first is None:  # an early start said them already
        for line in prepared.announce:
            if recorder is not None:
                recorder.say(say, line)
            else:
                say(line)
    attempt = 0
    last_kv: tuple[int, int, int] | None = None
    learned = Learned(max_alloc=plan_options.learned_max_alloc, kv_cap=plan_options.kv_cap)
    stepped = False  # this attempt's size is a step below an earlier failure
    while True:
        attempt += 1
        if prepared is None or (attempt == 1 and not options.predict):
            argv = list(args) if prepared is None else final_argv(_unplanned(prepared))
            extra_env: dict[str, str] = {}
            kv_now = None if prepared is None else _unplanned_footprint(prepared)
        else:
            if prepared.plan is None:
                assert prepared.error is not None
                if attempt == 1:
                    raise prepared.error
                raise SafeLlamaError(
                    f"{prepared.error.message} (after {attempt - 1} failed start(s))", ExitStatus.RETRIES_EXHAUSTED
                )
            if first is None or attempt > 1:  # an early start said them already
                for step in prepared.plan.steps:
                    if recorder is not None and attempt == 1:
                        recorder.say(say, step.reason)
                    else:
                        say(step.reason)
            argv = final_argv(prepared)
            extra_env = dict(prepared.plan.env_changes)
            kv_now = _footprint(prepared)
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
            status = f"attempt {attempt}: {os.path.basename(binary)} " + " ".join(redact_argv(argv))[:200]
            notifier.status(status)
            on_ready = ReadyActions(say, notifier, attempt)
            if (
                prepared is not None
                and digest is not None
                and prepared.plan is not None
                and attempt_is_planned(attempt, options)
            ):
                on_ready.store = (digest, prepared, plan_options, env)
                if recorder is not None and door is not None and attempt == 1 and not recalled:
                    on_ready.record = LaunchRecord(recorder, door, tool, args, argv, prepared, plan_options, status)
            probe = probe_for(tool, argv, {**base_env, **extra_env})
            on_ready.health = probe.healthy if isinstance(probe, HealthProbe) else None
            notifier.extend_timeout(EXTEND_TIMEOUT)
            if recorder is not None:
                recorder.close()  # the window ends where attempt 1 starts
            outcome = supervise.launch(
                [str(binary), *argv],
                {**base_env, **extra_env},
                watcher=Watcher(table, on_ready),
                probe=NotifyingProbe(probe, notifier) if notifier.enabled else probe,
            )
            on_ready.stop_watchdog()
            if outcome.ready:
                notifier.stopping()
        if outcome.killed_for_memory is not None and prepared is not None and prepared.plan is not None:
            remember_kill(prepared, digest, plan_options, outcome.killed_for_memory, env, say)
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
        if _worker_failed(failure) and prepared.plan is not None and prepared.target.remote:
            # an RPC worker stopped: the same KV with a smaller share for that worker is the next plan
            plan_options = _after_lost_worker(prepared, plan_options, failure, attempt, say)
            prepared = replan(prepared, plan_options, env)
            last_kv, stepped = None, False
            continue
        last_kv = kv_now
        lower = replan(prepared, replace(plan_options, kv_cap=None, margin_scale=1.0), env).plan
        lesson = learn(
            _attempted(prepared, kv_now, planned=attempt_is_planned(attempt, options), stepped=stepped),
            failure,
            learned,
            lower_kv=lower.kv.total_bytes if lower is not None else None,
            # the band only below a planned start that failed: after an unplanned one (--no-predict) the next
            # plan keeps the margin, as a predicted launch does
            search_band=prepared.target.address_space_budget
            and tool in _READY_AFTER_EVERY_ALLOCATION
            and attempt_is_planned(attempt, options),
        )
        learned = lesson.learned
        plan_options = replace(
            plan_options,
            learned_max_alloc=learned.max_alloc,
            compute_extra=learned.compute_extra,
            kv_cap=learned.kv_cap,
            margin_scale=_MARGIN_SCALE[learned.margin],
            device_cap=learned.device_cap,
        )
        say(f"attempt {attempt} failed: {failure.line or failure.kind}; retrying: {lesson.reason}", "warning")
        prepared, moved = free_again(prepared, env)
        if moved:
            say(moved)
        prepared = replan(prepared, plan_options, env)
        stepped = _cap_binds(prepared, plan_options, env)


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


def attempt_is_planned(attempt: int, options: LaunchOptions) -> bool:
    return options.predict or attempt > 1


def _attempted(prepared: Prepared, kv_now: tuple[int, int, int] | None, *, planned: bool, stepped: bool) -> Attempt:
    """The failed attempt as the retry's arithmetic sees it: its KV, and the compute estimate at its size."""
    from safe_llama.model.kv import plan_kv
    from safe_llama.plan.compute import compute_estimate
    from safe_llama.run.retry import Attempt

    kv = prepared.plan.kv if planned and prepared.plan is not None else plan_kv(prepared.facts, prepared.request.kv)
    kv_bytes = kv_now[2] if kv_now is not None else kv.total_bytes
    req = prepared.plan.settings.kv if prepared.plan is not None else prepared.request.kv
    target = prepared.target
    estimate = compute_estimate(prepared.facts, kv, req, kv_f16_copies=target.kv_f16_copies, costs=target.compute_costs)
    device = target.device if target.on_gpu and not target.integrated else None
    return Attempt(kv_bytes=kv_bytes, compute_estimate=estimate, stepped=stepped, device=device)


def _cap_binds(prepared: Prepared, options: PlanOptions, env: Mapping[str, str]) -> bool:
    """Whether the KV cap, not a limit, sized the plan: the attempt is then a step below a failure."""
    from safe_llama.pipeline.prepare import replan

    if prepared.plan is None or options.kv_cap is None:
        return False
    free = replan(prepared, replace(options, kv_cap=None), env).plan
    return free is None or free.kv.total_bytes > prepared.plan.kv.total_bytes


def _unplanned(prepared: Prepared) -> Prepared:
    return replace(prepared, plan=None)


def _footprint(prepared: Prepared) -> tuple[int, int, int]:
    """(bytes planned on the local GPU, KV bytes on the device, KV bytes in all): each attempt must be smaller
    than the last in one of them."""
    from safe_llama.plan.memory import memory_by_place

    assert prepared.plan is not None
    total = prepared.plan.kv.total_bytes
    on_device = prepared.target.on_gpu and not prepared.plan.settings.stateful
    places = memory_by_place(prepared.facts, prepared.plan.settings, prepared.target)
    device = sum(places.get(prepared.target.device or "", {}).values())
    return (device, total if on_device else 0, total)


def _unplanned_footprint(prepared: Prepared) -> tuple[int, int, int]:
    from safe_llama.model.kv import plan_kv

    total = plan_kv(prepared.facts, prepared.request.kv).total_bytes
    on_device = total if prepared.target.on_gpu else 0
    return (on_device, on_device, total)


def launch(tool: str, args: list[str], given: dict[str, str], *, door: tuple[str, Sequence[str]] | None = None) -> int:
    """The supervised launch with safe-llama's own options resolved (flags over SAFE_LLAMA_* over the config
    file); callers have already handed no-model invocations to llama.cpp (`passthrough.pass_through_early`).
    door: which door was used and its words, to key a launch record for the next start (early.py)."""
    from safe_llama.cmdline import launch_args
    from safe_llama.pipeline.options import launch_options

    if door is None:
        settings, origins = launch_args.resolve_sourced(given, os.environ)
        return run(tool, args, os.environ, launch_options(settings, origins))
    from safe_llama.run.fast_record import Recorder

    with Recorder(os.environ) as recorder:
        settings, origins = launch_args.resolve_sourced(given, recorder.env)
        options = launch_options(settings, origins)
        return run(tool, args, recorder.env, options, recorder=recorder, door=door)


def adopted(early: Early, door_args: list[str]) -> int:
    """Attempt 1 started early from a launch record, supervised as run() supervises its own; when it fails
    for memory the record is dropped and run() goes on from there (plans, learns, retries)."""
    from safe_llama.diagnosis.signatures import load_table
    from safe_llama.run import supervise
    from safe_llama.run.readiness import HealthProbe, probe_for

    env = os.environ
    tool = early.tool
    say = Say(env)
    for message, level in early.lines:
        say(message, level)
    table = load_table(Path(env["SAFE_LLAMA_SIGNATURES"]) if env.get("SAFE_LLAMA_SIGNATURES") else None)
    notifier = Notifier(env)
    notifier.status(early.status)
    on_ready = ReadyActions(say, notifier, 1)
    probe = probe_for(tool, early.argv[1:], early.env)
    on_ready.health = probe.healthy if isinstance(probe, HealthProbe) else None
    notifier.extend_timeout(EXTEND_TIMEOUT)
    outcome = supervise.launch(
        early.argv,
        early.env,
        watcher=Watcher(table, on_ready),
        probe=NotifyingProbe(probe, notifier) if notifier.enabled else probe,
        started=early.started,
    )
    on_ready.stop_watchdog()
    if outcome.ready:
        notifier.stopping()
    if not outcome.retry:
        return outcome.exit_code
    from safe_llama.cmdline import launch_args
    from safe_llama.pipeline.options import launch_options
    from safe_llama.run import fast_record

    fast_record.drop(early.path)
    if early.door == tool:  # a drop-in door: its words are the tool's
        args, given = list(door_args), {}
    else:
        request = launch_args.split(door_args)
        assert request is not None  # a record is only stored for words that were a launch
        args, given = list(request.args), dict(request.settings)
    settings, origins = launch_args.resolve_sourced(given, env)
    return run(tool, args, env, launch_options(settings, origins), first=outcome)
