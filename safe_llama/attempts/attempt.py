"""One attempt of a launch: start (or adopt) llama.cpp under supervision and hand back how it ended, with what
goes around it: the ready actions the signature watcher calls, the probe that keeps systemd's start
timeout pushed out, and the ready actions (remember the plan, write the launch record, tell systemd, feed its
watchdog), then the hand-off of a ready llama-server's supervision to the small handed supervisor (handing).

Owns run_attempt, the one attempt body of both launch.run_attempts and an early start's launch.adopted, and
its helpers (when an attempt hands off among them). Must not decide what to start or whether to retry: the
attempt loop and its decisions are attempt_loop.py's, the process handling supervise.py's.
"""

from __future__ import annotations

import os
import sys
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from safe_llama.attempts.say import Say
from safe_llama.messages import KILLED_NO_EVIDENCE
from safe_llama.process.health import Health
from safe_llama.process.sdnotify import Notifier
from safe_llama.units import human

if TYPE_CHECKING:
    from safe_llama.diagnosis.signatures import SignatureTable
    from safe_llama.pipeline.prepare import PlanOptions, Prepared
    from safe_llama.process.fork_exec import Started
    from safe_llama.process.handed import HandOff
    from safe_llama.process.readiness import ReadinessProbe
    from safe_llama.process.relay import Stream
    from safe_llama.process.startup import Outcome
    from safe_llama.remembered.record_window import Recorder

EXTEND_TIMEOUT = 30.0  # seconds systemd's start timeout is pushed out by, while llama.cpp loads
EXTEND_EVERY = 10.0


@dataclass(frozen=True)
class Supervision:
    """What every attempt of one launch shares: where its lines go, systemd's notifier, the error signatures."""

    say: Say
    notifier: Notifier
    table: SignatureTable
    ready: Callable[[], None] | None = None  # told when an attempt is ready (the ledger entry says so)


def run_attempt(
    shared: Supervision,
    tool: str,
    argv: Sequence[str],
    env: Mapping[str, str],
    *,
    number: int,
    status: str,
    store: tuple[str, Prepared, Mapping[str, str]] | None = None,
    record: Callable[[], None] | None = None,
    recorder: Recorder | None = None,
    started: Started | None = None,
    ending: Callable[[], list[str] | None] | None = None,
    at_spawn: Sequence[str] = (),
) -> Outcome:
    """Attempt `number`: argv (the binary first) with env, supervised until it exits; the ready actions run
    when its start-up is over. store: the plan to remember once ready, and record: the launch record to
    write then; recorder: the launch record's window, closed where the child starts; started: the child
    an early start already runs (remembered/early.py), adopted instead of spawned. ending: the words of what the
    caller does after a ready child's end (handoff.ending_words), asked once it is ready, for the handed
    supervisor this process then becomes (handing); None: no hand-off. at_spawn: the words of a hand-off as the
    child starts (attempts/at_spawn.py), tried at once instead of once it is ready."""
    from safe_llama.process import supervise
    from safe_llama.process.readiness import HealthProbe, probe_for
    from safe_llama.process.startup import StartupWatcher

    notifier = shared.notifier
    notifier.status(status)
    on_ready = ReadyActions(shared.say, notifier, number)
    on_ready.store, on_ready.record, on_ready.ledger = store, record, shared.ready
    probe = probe_for(tool, argv[1:], env)
    on_ready.health = probe.healthy if isinstance(probe, HealthProbe) else None
    notifier.extend_timeout(EXTEND_TIMEOUT)
    if recorder is not None:
        recorder.close()  # the window ends where attempt 1 starts
    outcome = supervise.supervise_child(
        argv,
        env,
        watcher=StartupWatcher(shared.table, on_ready),
        probe=NotifyingProbe(probe, notifier) if notifier.enabled else probe,
        started=started,
        say=lambda line: shared.say(line, "warning"),
        hand_off=handing(tool, probe, notifier, ending, at_spawn),
        hand_off_at_spawn=bool(at_spawn),
    )
    on_ready.stop_watchdog()
    if outcome.killed_without_evidence is not None:  # a person's `kill -9`, or an OOM kill nothing names
        why = outcome.killed_without_evidence
        shared.say(KILLED_NO_EVIDENCE.text(tool=os.path.basename(argv[0]), pid=outcome.pid, why=why), "warning")
    if outcome.ready:
        notifier.stopping()
    return outcome


def handing(
    tool: str,
    probe: ReadinessProbe,
    notifier: Notifier,
    ending: Callable[[], list[str] | None] | None,
    start: Sequence[str] = (),
) -> Callable[[HandOff], None] | None:
    """What supervise_child calls to hand off once the child is ready (process/handed.py): None where this attempt
    does not (not llama-server, no ending given, a TLS /health with systemd's watchdog on: http.client and ssl
    are not light). ending: the end's words, asked at the hand-off (None then: the launcher's hand_off setting,
    `--no-hand-off`, SAFE_LLAMA_HAND_OFF or `hand_off` in [launcher], says no)."""
    from safe_llama.process.readiness import HealthProbe

    if tool != "server" or ending is None or not isinstance(probe, HealthProbe):
        return None
    if (probe.https and notifier.watchdog_interval is not None) or not os.path.isabs(sys.executable or ""):
        return None
    address = Health(probe.path, probe.unix_socket, probe.host, probe.port)

    def hand(hand_off: HandOff) -> None:
        from safe_llama.process import handed

        try:
            words = ending()
        except Exception:  # the hand-off saves memory: never the reason a ready launch fails
            return
        if words is not None:
            handed.exec_handed(hand_off, address, words, start)

    return hand


class ReadyActions:
    """What happens the moment start-up is over: remember the plan, tell systemd, keep its watchdog fed
    while llama-server's /health answers 200 (and only then: systemd restarts a server that stops)."""

    def __init__(self, say: Say, notifier: Notifier, attempt: int) -> None:
        self.say = say
        self.notifier = notifier
        self.attempt = attempt
        self.store: tuple[str, Prepared, Mapping[str, str]] | None = None
        self.record: Callable[[], None] | None = None  # the launch record, once the plan is remembered
        self.health: Callable[[], bool] | None = None
        self.ledger: Callable[[], None] | None = None  # the launch's ledger entry, marked ready
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def __call__(self) -> None:
        if self.store is not None:
            digest, prepared, env = self.store
            if remember_plan(digest, prepared, env) and self.record is not None:
                self.record()
        self.notifier.ready(f"ready (attempt {self.attempt})")
        if self.ledger is not None:
            self.ledger()
        interval = self.notifier.watchdog_interval
        if interval is not None:
            # started from inside supervise.supervise_child, so the thread inherits its blocked signal mask
            self._thread = threading.Thread(target=self._watchdog, args=(interval,), daemon=True)
            self._thread.start()

    def _watchdog(self, interval: float) -> None:
        while not self._stop.wait(interval):
            if self.health is None or self.health():
                self.notifier.watchdog()

    def stop_watchdog(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(5)


class NotifyingProbe:
    """The readiness probe, plus EXTEND_TIMEOUT_USEC to systemd while loading goes on."""

    def __init__(self, inner: ReadinessProbe, notifier: Notifier) -> None:
        self._inner = inner
        self._notifier = notifier
        self._last = time.monotonic()

    def output(self, stream: Stream, data: bytes) -> bool:
        return self._inner.output(stream, data)

    def poll_interval(self) -> float | None:
        inner = self._inner.poll_interval()
        return EXTEND_EVERY / 4 if inner is None else min(inner, EXTEND_EVERY / 4)

    def check(self) -> bool:
        now = time.monotonic()
        if now - self._last >= EXTEND_EVERY:
            self._notifier.extend_timeout(EXTEND_TIMEOUT)
            self._last = now
        return self._inner.check()


def remember_plan(digest: str, prepared: Prepared, env: Mapping[str, str]) -> bool:
    return remembered_after_ready(digest, prepared, env) is not None


def remembered_after_ready(digest: str, prepared: Prepared, env: Mapping[str, str], suffix: str = "") -> str | None:
    """The plan remembered as one that became ready (suffix: written beside its file, put in place by the handed
    supervisor once it is: attempts/at_spawn.py); the file it is kept in, None where it could not be written."""
    from safe_llama.remembered import remember

    assert prepared.plan is not None
    record = remember.after_ready(
        remember.recall(digest, env),
        prepared.plan.kv.total_bytes,
        prepared.target.learned_max_alloc,
        prepared.target.host_budget.value,
    )
    try:
        return str(remember.store(digest, record, env, suffix))
    except OSError as err:
        Say(env)(f"could not remember the plan: {err.strerror}", "warning")
        return None


def kill_figures(prepared: Prepared) -> tuple[int, int | None, int]:
    """What remember_kill needs of a plan: its KV, the largest allocation it learned, its host budget."""
    assert prepared.plan is not None
    return prepared.plan.kv.total_bytes, prepared.target.learned_max_alloc, prepared.target.host_budget.value


def remember_kill(
    kv: int,
    learned_max_alloc: int | None,
    budget: int,
    digest: str | None,
    evidence: str,
    env: Mapping[str, str],
    say: Say,
) -> None:
    """A ready llama.cpp was killed for lack of memory (a request touched more than the plan held, its KV kv,
    kill_figures): the next start with the same key plans a KV below it (policy: oom_after_ready_kv_share), so a
    service manager's restart does not meet the same kill at the next long request."""
    from safe_llama.paths import config_dir, configs_dir
    from safe_llama.plan.policy import load_policy
    from safe_llama.remembered import remember

    where = f"llama.cpp was killed for lack of memory after it was ready ({evidence}) with {human(kv)} of KV"
    if digest is None:
        say(f"{where}; not remembered (remembering is off)", "error")
        return
    share = load_policy(configs_dir(env) / "planner.toml", config_dir(env) / "config.toml").oom_after_ready_kv_share
    record = remember.after_kill(kv, share, learned_max_alloc, budget)
    try:
        remember.store(digest, record, env)
    except OSError as err:
        say(f"{where}; could not remember it: {err.strerror}", "error")
        return
    say(f"{where}; the next start plans at most {human(record.kv_bytes)} of KV", "error")


class LaunchRecord:
    """Writes the launch record of attempt 1 when it is ready (fast_record.py)."""

    def __init__(
        self,
        recorder: Recorder,
        door: tuple[str, Sequence[str]],
        tool: str,
        user_args: Sequence[str],
        argv: Sequence[str],
        prepared: Prepared,
        options: PlanOptions,
        status: str,
    ) -> None:
        self.recorder, self.door, self.tool, self.user_args = recorder, door, tool, user_args
        self.argv, self.prepared, self.options, self.status = argv, prepared, options, status

    def __call__(self) -> None:
        try:
            from safe_llama.remembered import fast_record

            door, door_args = self.door
            record = fast_record.build(
                self.recorder,
                tool=self.tool,
                user_args=self.user_args,
                door_args=door_args,
                argv=self.argv,
                prepared=self.prepared,
                options=self.options,
                status=self.status,
            )
            if record is not None:
                fast_record.store(record, door, door_args, self.recorder.raw)
        except Exception:  # a record is an optimisation: never the reason a ready launch fails
            return
