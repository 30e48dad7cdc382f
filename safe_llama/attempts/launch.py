"""Launch a llama.cpp tool with the plan, watch its start-up, retry smaller on an allocation failure,
remember what worked, and hand back the child's exit code.

Owns the shell of the attempt loop (run_attempts: it starts what attempt_loop.AttemptLoop decides, says its
lines, reads the GPU's free memory and the RPC workers' presence again when asked, and feeds each outcome
back), the remembered plan's recall, and the early start's takeover (adopted). Must not decide a retry
(attempt_loop.py and retry.py do); one attempt's body is attempt.py's, the process handling supervise.py's.

Over 400 lines on purpose: the launch's two ways in (planned, adopted) share its attempts' shell here.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, replace
from pathlib import Path
from typing import TYPE_CHECKING

from safe_llama.attempts import at_spawn, resume
from safe_llama.attempts.attempt import LaunchRecord, Supervision, kill_figures, remember_kill, run_attempt
from safe_llama.attempts.handoff import ending_words
from safe_llama.attempts.say import Say
from safe_llama.constants import RESUME_ENV
from safe_llama.errors import ExitStatus, ModelNotOnDisk, SafeLlamaError
from safe_llama.messages import WORKER_GONE
from safe_llama.paths import cache_dir, configs_dir
from safe_llama.process.sdnotify import Notifier, child_env
from safe_llama.state import check_cache
from safe_llama.units import human

if TYPE_CHECKING:  # the planner's side is imported where used: an early start may never need it
    from safe_llama.device.ledger import Entry
    from safe_llama.diagnosis.signatures import SignatureTable
    from safe_llama.pipeline.prepare import LaunchOptions, PlanOptions, Prepared
    from safe_llama.plan.lessons import Lessons
    from safe_llama.process.startup import Outcome
    from safe_llama.remembered.early import Early
    from safe_llama.remembered.record_window import Recorder

# Tools whose readiness comes after every allocation of their start-up, so a start that does not fit is
# seen and retried. llama-server too: it is ready once its task loop answers (readiness.HealthProbe), not
# at `model loaded`, after which a context just past ulimit -v still aborts (std::system_error, exit 134).
_READY_AFTER_EVERY_ALLOCATION = frozenset({"cli", "completion", "server"})


def _remember_key(prepared: Prepared, binary: Path) -> str:
    from safe_llama import state
    from safe_llama.remembered import remember

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


# failures llama.cpp ends with a line that names no remedy (a busy port: `couldn't bind HTTP server socket`,
# then exit 1): safe-llama says explain's words for them in one line
_SAID_AT_EXIT = ("http-bind",)


def _in_words(signature_id: str, line: str | None, env: Mapping[str, str]) -> str:
    """explain's what, the line that decided, why and the fix (configs/explain.toml), as one line."""
    from safe_llama.diagnosis.explain_words import load_words

    words = load_words(configs_dir(env) / "explain.toml").for_signature(signature_id, "not_memory")
    return f"{words['what']} ({' '.join((line or signature_id).split())}): {words['why']}; {words['fix']}"


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
    from safe_llama.device import ledger
    from safe_llama.device.binaries import find_binary
    from safe_llama.diagnosis.signatures import load_table
    from safe_llama.plan.lessons import Lessons
    from safe_llama.process.channels import check_not_nested

    raw_env = recorder.raw if recorder is not None else env
    say = Say(raw_env)
    check_not_nested(env)
    unusable = check_cache(cache_dir(env))
    if unusable is not None:
        options = replace(options, remember=False)
        say(f"{unusable}: running without caching or remembering plans", "warning")
    binary = find_binary(tool, env=env, explicit=options.plan.llama_bin, explicit_from=options.plan.llama_bin_from)
    table = load_table(
        Path(env["SAFE_LLAMA_SIGNATURES"]) if env.get("SAFE_LLAMA_SIGNATURES") else None, keep_in=cache_dir(env)
    )
    if first is None and RESUME_ENV in os.environ:  # back from a hand-off at the spawn whose start failed
        taken = resume.take(env)
        first = resume.outcome(taken, table) if taken is not None else None
    base_env = child_env(raw_env)
    folder = ledger.own_folder(env)
    entry = ledger.arrive(folder, tool) if folder is not None else None  # seen by those that start with it
    try:
        # the ledger's lock while this launch reads the others, plans and writes its entry: the next plans with it
        with ledger.locked(folder, say) if folder is not None else contextlib.nullcontext():
            # attempt 1 may hand off as it starts (its plan counts that); a retry's plan counts the full supervisor
            at_first = replace(options.plan, hand_off_at_spawn=at_spawn.eligible(tool, args, env, options, door))
            prepared, lessons = _prepare(tool, args, env, at_first, binary, say), Lessons()
            digest = None
            recalled = False  # a remembered plan was at hand: its use hangs on the budget, so no launch record
            # a model not downloaded yet (planned from its header read over HTTP) is remembered from its next start on
            if prepared is not None and options.remember and (prepared.source is None or prepared.source.on_disk):
                digest = _remember_key(prepared, binary)
                prepared, lessons, recalled = _recall(prepared, at_first, digest, env, say)
            _book(entry, prepared, tool)
        return _attempts(
            tool, args, env, options, say, binary, table, base_env, prepared, lessons, digest, recalled, entry,
            recorder=recorder, door=door, first=first,
        )  # fmt: skip
    finally:
        if entry is not None:
            entry.remove()


def _book(entry: Entry | None, prepared: Prepared | None, tool: str) -> None:
    """This launch's entry in the ledger, from its plan (rewritten when a retry plans again)."""
    from safe_llama.pipeline.prepare import booking

    if entry is not None and (prepared is None or prepared.plan is None):
        entry.remove()  # llama.cpp runs as given: nothing reserved
    elif entry is not None and prepared is not None:
        _book_planned(entry, tool, booking(prepared))


def _book_planned(entry: Entry, tool: str, booked: tuple[str, str, str, int, int, str]) -> None:
    """Write the entry as PLANNED with a plan's booking (prepare.booking), made now or kept by a launch record."""
    from safe_llama.device import ledger
    from safe_llama.device.reservations import PLANNED, Launch

    start = ledger.start_time(os.getpid())
    if start is not None:
        entry.write(Launch(os.getpid(), start, tool, booked[0], PLANNED, *booked[1:]))


def _attempts(
    tool: str,
    args: Sequence[str],
    env: Mapping[str, str],
    options: LaunchOptions,
    say: Say,
    binary: Path,
    table: SignatureTable,
    base_env: dict[str, str],
    prepared: Prepared | None,
    lessons: Lessons,
    digest: str | None,
    recalled: bool,
    entry: Entry | None,
    *,
    recorder: Recorder | None,
    door: tuple[str, Sequence[str]] | None,
    first: Outcome | None,
) -> int:
    """The attempts, once planned (run_attempts' second half)."""
    from safe_llama.attempts.attempt_loop import AttemptLoop, Exit, FindWorker
    from safe_llama.cmdline.llama_args import redact_argv
    from safe_llama.pipeline.prepare import free_again, replan
    from safe_llama.process import workers

    raw_env = recorder.raw if recorder is not None else env
    shared = Supervision(say, Notifier(raw_env), table, entry.ready if entry is not None else None)
    if prepared is not None and first is None:  # an early start said them already
        for line in prepared.others.held_lines():
            _say(say, line, recorder)
        for line in prepared.announce:
            _say(say, line, recorder)
    loop = AttemptLoop(
        prepared,
        lessons,
        lambda again, taught: replan(again, options.plan, taught, env),
        args=args,
        attempts=options.attempts,
        predict=options.predict,
        search_band=tool in _READY_AFTER_EVERY_ALLOCATION,
        said=first is not None,
    )
    while True:
        start = loop.next_start()
        if loop.prepared is not prepared and entry is not None:
            _book(entry, loop.prepared, tool)  # a retry planned again
        attempt, prepared = start.number, loop.prepared
        for line in start.lines:
            _say(say, line, recorder if attempt == 1 else None)
        if start.give_up is not None:
            raise start.give_up
        if first is not None and attempt == 1:
            outcome = first
        else:
            shown = redact_argv(start.argv, keep_in=cache_dir(env))
            status = f"attempt {attempt}: {os.path.basename(binary)} " + " ".join(shown)[:200]
            store, record = None, None
            if prepared is not None and digest is not None and prepared.plan is not None and start.planned:
                store = (digest, prepared, env)
                if recorder is not None and door is not None and attempt == 1 and not recalled:
                    record = LaunchRecord(recorder, door, tool, args, start.argv, prepared, options.plan, status)
            ending = _ending(entry, prepared, digest, env) if options.hand_off else None
            spawn_words: list[str] = []
            if attempt == 1 and ending is not None and at_spawn.planned(prepared):
                spawn_words, ending = at_spawn.take_over(attempt, entry, store, ending)
                store, record = None, None  # put in place by the handed supervisor; no launch record
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
                ending=ending,
                at_spawn=spawn_words,
            )
        if outcome.killed_for_memory is not None and prepared is not None and prepared.plan is not None:
            remember_kill(*kill_figures(prepared), digest, outcome.killed_for_memory, env, say)
        verdict = loop.observe(outcome)
        failure = outcome.failure
        if isinstance(verdict, Exit) and failure is not None and failure.signature_id in _SAID_AT_EXIT:
            say(_in_words(failure.signature_id, failure.line, env), "error")
        if isinstance(verdict, FindWorker):
            found = workers.lost_worker(verdict.remote, verdict.fullness)
            assert found is not None
            verdict = loop.worker_found(*found)
        for message, level in verdict.lines:
            say(message, level)
        if isinstance(verdict, Exit):
            return verdict.code
        if verdict.wait_for is not None and not workers.wait_back(verdict.wait_for.endpoint, WORKER_WAIT):
            raise WORKER_GONE.error(
                ExitStatus.WORKER_UNAVAILABLE, worker=verdict.wait_for.label, wait=f"{WORKER_WAIT:.0f}"
            )
        if verdict.read_free_again and loop.prepared is not None:
            again, moved = free_again(loop.prepared, env)
            if moved:
                say(moved)
            loop.free_memory_read(again)


def _ending(
    entry: Entry | None, prepared: Prepared | None, digest: str | None, env: Mapping[str, str]
) -> Callable[[], list[str] | None]:
    """What this launch does after a ready child's end, in words for the handed supervisor: the ledger entry it
    removes (as written by then), the OOM kill it remembers."""
    kill = kill_figures(prepared) if prepared is not None and prepared.plan is not None else None
    return lambda: ending_words(
        env, ledger=str(entry.path) if entry is not None and entry.written else None, kill=kill, digest=digest
    )


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
) -> tuple[Prepared, Lessons, bool]:
    """The plan with what was remembered under this key: (prepared, the lessons it was planned with, whether
    a KV size was used)."""
    from safe_llama.pipeline.prepare import replan
    from safe_llama.remembered import remember

    lessons = prepared.target.lessons
    known = remember.recall(digest, env)
    if known is not None and known.learned_max_alloc is not None:  # the device's own limit: any budget
        lessons = replace(lessons, learned_max_alloc=known.learned_max_alloc)
        prepared = replan(prepared, options, lessons, env)
    if known is not None and not remember.usable(known, prepared.target.host_budget.value):
        known = None  # the size was learned under a tighter budget than this launch has: plan afresh
    if known is not None and prepared.plan is not None and prepared.plan.kv.total_bytes > known.kv_bytes:
        # the plan would ask for more than what last started here: start from what worked
        lessons = replace(lessons, kv_cap=known.kv_bytes)
        prepared = replan(prepared, options, lessons, env)
        why = "a larger plan was killed for lack of memory once ready" if known.after_oom else "it worked before"
        say(f"starting from the plan with {human(known.kv_bytes)} of KV: {why}")
        return prepared, lessons, True
    return prepared, lessons, False


WORKER_WAIT = 30.0  # seconds a worker that stopped may take to answer again (systemd restarts it in 0.1 s)


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
    from safe_llama.remembered.record_window import Recorder

    with Recorder(os.environ) as recorder:
        settings, origins = launch_args.resolve_sourced(given, recorder.env)
        options = launch_options(settings, origins)
        return run_attempts(tool, args, recorder.env, options, recorder=recorder, door=door)


def _hand_off_on(early: Early, door_args: list[str]) -> bool:
    """The launcher's hand_off setting for an early start's words (read once it is ready: a start pays nothing)."""
    from safe_llama.cmdline import launch_args, own_options

    try:
        request = None if early.door == early.tool else launch_args.split(door_args)
        given = {} if request is None else dict(request.settings)  # a drop-in door: the tool's words alone
        settings, _ = launch_args.resolve_sourced(given, os.environ)
    except SafeLlamaError:
        return False
    return own_options.flag(settings, "hand_off") is not False


def adopted(early: Early, door_args: list[str]) -> int:
    """Attempt 1 started early from a launch record, supervised as run_attempts() supervises its own; when it
    fails for memory the record is dropped and run_attempts() goes on from there (plans, learns, retries; a log
    cut short: the same plan again, the record kept).
    Its ledger entry (the reservation the record kept, as _book writes it) comes right after the spawn, not
    before: the ledger is imported only here, once the child runs, so the early start itself stays light; it is
    marked ready with the child, removed at the end (or by the handed supervisor), and a retry books again."""
    from safe_llama.device import ledger

    folder = ledger.own_folder(os.environ)
    entry = ledger.arrive(folder, early.tool) if folder is not None else None
    try:
        if entry is not None:
            _book_planned(entry, early.tool, early.booked)
        return _adopted(early, door_args, entry)
    finally:
        if entry is not None:
            entry.remove()


def _adopted(early: Early, door_args: list[str], entry: Entry | None) -> int:
    """adopted()'s supervision of the early child, once its entry (None: no ledger folder) is written."""
    from safe_llama.diagnosis.signatures import load_table

    env, tool, say = os.environ, early.tool, Say(os.environ)
    for message, level in early.lines:
        say(message, level)
    table = load_table(
        Path(env["SAFE_LLAMA_SIGNATURES"]) if env.get("SAFE_LLAMA_SIGNATURES") else None, keep_in=cache_dir(env)
    )
    shared = Supervision(say, Notifier(env), table, entry.ready if entry is not None else None)

    def ending() -> list[str] | None:  # the entry as written by the hand-off: the handed supervisor removes it
        written = str(entry.path) if entry is not None and entry.written else None
        return ending_words(env, ledger=written, record=early.path) if _hand_off_on(early, door_args) else None

    outcome = run_attempt(
        shared, tool, early.argv, early.env, number=1, status=early.status, started=early.started, ending=ending
    )
    from safe_llama.remembered import fast_record

    if outcome.retry or outcome.killed_for_memory is not None:  # the recorded plan failed for memory: next, plan
        fast_record.drop(early.path)
    if not outcome.retry and not (outcome.failure is not None and outcome.failure.kind == "log_cut"):
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
