"""Launching and supervising one llama.cpp child: the loop that relays its bytes, forwards its signals and
watches its start-up until it ends.

Owns the child's life from spawn to reap: when to read and write (relay.py moves the bytes), when to
forward, stop or suspend (signals.py says what a signal is), when start-up is over (readiness.py) and
whether it failed (startup.py's watcher; the Outcome is startup.py's too); channels.py starts the child.
supervise_child() is the one way llama.cpp is started for real work. Must not decide policy (what a line means
is signatures.py's, whether to retry is the caller's) and must never alter, delay or hold back a byte the
child writes.

Built on the standard library (subprocess, pty/termios, poll, a signalfd through ctypes) rather than
pexpect/ptyprocess: those fork a pty child only (no separate stdout/stderr pipes), cannot set
PR_SET_PDEATHSIG or an empty signal mask in the child, and pexpect's interact() swallows an escape
character and can drop output at exit (pexpect #120). Linux only, like PR_SET_PDEATHSIG and signalfd.

The child always runs in a process group of its own (as `tini -g` does), so safe-llama is the only one
who signals it: `kill -TERM -PGID`, `timeout`, a shell's `kill %1` reach safe-llama's group only, and each
signal reaches the child once, forwarded. Where safe-llama is the terminal's foreground job in pipe mode
(stdin a terminal), the child's group is made the foreground one, so the terminal's ^C and ^Z reach the
child alone, exactly as they reach a bare llama.cpp; when the child stops, safe-llama stops too, so the
shell sees its job stopped. In pty mode the child leads its own session on the pty.

What runs once the child runs (relaying, forwarding, job control, reaping, the drain) is steady.py's Steady,
which _Supervisor extends with start-up; once a llama-server is ready and nothing of its own is pending, the
caller's hand_off may move its supervision to the small handed supervisor (handed.py), which runs Steady too.
"""

from __future__ import annotations

import contextlib
import os
import select
import signal
import time
from collections.abc import Callable, Mapping, Sequence

from safe_llama.constants import GUARD_ENV
from safe_llama.device.probe_host import OomWatch, judge_kill, oom_counters, watch_oom
from safe_llama.diagnosis.signatures import Failure
from safe_llama.messages import AT_SPAWN_FAILED
from safe_llama.process.channels import Child
from safe_llama.process.fork_exec import Started, block_watched
from safe_llama.process.handed import HandOff
from safe_llama.process.readiness import ProbeThread, ReadinessProbe
from safe_llama.process.relay import Relay, Stream
from safe_llama.process.signals import STOP_SIGNALS, SignalFd, is_stopped, signal_keys
from safe_llama.process.startup import Outcome, StartupWatcher, Verdict
from safe_llama.process.steady import Steady, exit_code_for

TYPE_CHECKING = False  # typing.TYPE_CHECKING without importing typing (mypy reads the name)
if TYPE_CHECKING:
    from safe_llama.process.steady import SignalSource

# once ready, the seconds the hand-off waits for the relays to drain (a reader slower than that: no hand-off)
HAND_OFF_WAIT = 5.0
HAND_OFF_RETRY = 0.005  # seconds between tries of a hand-off that waits for the child's output to be passed on

# ---------------------------------------------------------------------------------------------------
# supervise_child()
# ---------------------------------------------------------------------------------------------------


class _Supervisor(Steady):
    """Steady's loop, with start-up watched (the watcher's verdict, the readiness probe and its thread, the stop
    of a start that failed), the pty's keys and the hand-off once ready."""

    def __init__(
        self,
        child: Child,
        watcher: StartupWatcher,
        probe: ReadinessProbe | None,
        stop_grace: float,
        kill_after: float,
    ) -> None:
        super().__init__(child, kill_after)
        self.watcher, self.probe = watcher, probe
        self.stop_grace = stop_grace
        self.probe_thread: ProbeThread | None = None
        self.ready = False
        self.failing_since: float | None = None
        self.term_sent_at: float | None = None
        self.memory_counters: Callable[[], Mapping[str, int]] = oom_counters
        self.oom_watch: OomWatch | None = None
        self.hand_off: Callable[[HandOff], None] | None = None
        self.hand_off_until: float | None = None  # ready: the hand-off is tried until then
        self.at_spawn = False  # the hand-off is tried from the spawn on, not once ready (attempts/at_spawn.py)
        self.mask_before: set[int] = set()  # the signal mask before supervision: the handed one restores it at its end

    def spawn(self, started: Started | None) -> None:
        since = time.monotonic()
        if started is not None:  # attempt 1 started early (early.py), with the same set-up
            counters: Mapping[str, int] = started.counters_before
            self.child.adopt(started)
            if started.foreground:
                self.foreground_fd = self.child.stdin_fd
        else:
            counters = self.memory_counters()
            foreground = self._terminal_foreground()
            self.child.start(foreground)
            if foreground is not None:
                self._give_foreground()
        assert self.child.proc is not None
        pid = self.child.proc.pid
        self.oom_watch = watch_oom(pid, since, counters, members={os.getpid(), pid})

    # -- the loop ------------------------------------------------------------------------------------

    def run(self, sigfd: SignalFd) -> None:
        assert self.child.proc is not None
        if self.at_spawn and self.hand_off is not None:
            self.hand_off_until = time.monotonic() + HAND_OFF_WAIT  # the handed supervisor watches start-up
        elif self.probe is not None:
            interval = self.probe.poll_interval()
            if interval is not None:
                self.probe_thread = ProbeThread(self.probe, interval)
        self.loop(sigfd)

    def _poll_once(self, signals: SignalSource) -> None:
        super()._poll_once(signals)
        if self.hand_off_until is not None:
            self._try_hand_off()

    def extra_fds(self) -> dict[int, int]:
        return {} if self.probe_thread is None else {self.probe_thread.read_fd: select.POLLIN}

    def on_event(self, fd: int, mask: int) -> None:
        os.read(fd, 1)
        self._become_ready()

    def seen(self, relay: Relay, data: bytes, now: float) -> None:
        if not self.ready and relay.stream is not None:
            self._startup_output(relay.stream, data, now)

    def deadlines(self, now: float) -> list[float]:
        deadlines: list[float] = [now + HAND_OFF_RETRY] if self.hand_off_until is not None else []
        if self.failing_since is not None and self.term_sent_at is None:
            deadlines.append(self.failing_since + self.stop_grace)
        if self.term_sent_at is not None and not self.kill_sent:
            deadlines.append(self.term_sent_at + self.kill_after)
        return deadlines

    def user_input(self, relay: Relay, data: bytes) -> None:
        """Keys go to the pty as they are, except the suspend key (^Z) while the child's pty makes signals.

        The child leads its own session, so the kernel discards a terminal SIGTSTP for it (an orphaned
        process group): the wrapper does what a shell's job control would, for both processes. ^C and ^\\
        pass through, and are remembered as the user's stop request.
        """
        keys = {} if self.child.master is None else signal_keys(self.child.master)
        for key, signo in keys.items():
            if signo != signal.SIGTSTP and key in data and self.user_stop is None:
                self.user_stop = signo
        suspend = next((key for key, signo in keys.items() if signo == signal.SIGTSTP), None)
        while suspend is not None and suspend in data:
            before, _, data = data.partition(suspend)
            relay.push(before)
            self._suspend()
        relay.push(data)

    def _startup_output(self, stream: Stream, data: bytes, now: float) -> None:
        if self.watcher.output(stream, data) is Verdict.STOP_FAILED and self.failing_since is None:
            self.failing_since = now
        if self.probe is not None and self.probe.output(stream, data):
            self._become_ready()

    def _become_ready(self) -> None:
        if self.ready or self.failing_since is not None:
            return
        self.ready = True
        self.watcher.ready()
        if self.probe_thread is not None:
            self.probe_thread.halt()
        if self.hand_off is not None:
            self.hand_off_until = time.monotonic() + HAND_OFF_WAIT

    def timers(self, now: float) -> None:
        super().timers(now)
        if self.failing_since is None or self.child.proc is None:
            return
        if self.term_sent_at is None and now >= self.failing_since + self.stop_grace:
            self._send(signal.SIGTERM)
            self.term_sent_at = now
        elif self.term_sent_at is not None and not self.kill_sent and now >= self.term_sent_at + self.kill_after:
            self._send(signal.SIGKILL)
            self.kill_sent = True

    # -- the hand-off --------------------------------------------------------------------------------

    def _try_hand_off(self) -> None:
        """Once ready, with nothing of its own pending, the supervision moves to the handed supervisor (the
        callback execs it and does not return); tried until hand_off_until, then never."""
        assert self.hand_off_until is not None and self.hand_off is not None
        if time.monotonic() > self.hand_off_until:
            self.hand_off_until = None  # its output did not drain in time: this supervisor stays
            if self.at_spawn and self.say is not None:
                self.say(AT_SPAWN_FAILED.text())
            return
        if not self._quiet():
            return
        self.hand_off_until = None  # tried once: an exec that failed leaves this supervisor at work
        proc, watch = self.child.proc, self.oom_watch
        assert proc is not None and watch is not None
        sources = [r.src if r.src is not None and not r.broken else None for r in self.child.relays]
        self.hand_off(
            HandOff(proc.pid, self._tool(), sources, self.kill_after, self.last_forward, watch, self.mask_before)
        )
        if self.at_spawn and self.say is not None:  # still here: the exec failed, or its words were refused
            self.say(AT_SPAWN_FAILED.text())

    def _quiet(self) -> bool:
        """Nothing but relaying and forwarding left to do: pipe mode with no terminal's foreground, the child
        running and not stopped, no stop asked or under way, no output waiting for its reader."""
        proc = self.child.proc
        return (
            (self.ready or self.at_spawn)
            and proc is not None
            and self.returncode is None
            and not self.use_pty
            and self.foreground_fd is None
            and self.child.input_relay is None
            and not os.isatty(self.child.stdin_fd)
            and (self.child.stdin_fd, self.child.stdout_fd, self.child.stderr_fd) == (0, 1, 2)
            and all(_is_open(fd) for fd in (0, 1, 2))  # else the small process's own fds could take their numbers
            and len(self.child.relays) in (1, 2)
            and self.user_stop is None
            and self.failing_since is None
            and self.term_sent_at is None
            and not self.kill_sent
            and self.stop_kill_at is None
            and not self.stop_said
            and not self.child_stopped_by_us
            and not any(r.queue for r in self.child.relays if not r.broken)
            and not is_stopped(proc.pid)
        )

    # -- the end -------------------------------------------------------------------------------------

    def outcome(self) -> Outcome:
        assert self.child.proc is not None and self.returncode is not None
        failure: Failure | None = None
        stopped_by_us = self.term_sent_at is not None
        evidence, no_evidence = None, None
        if self.killed_unasked():
            assert self.oom_watch is not None
            evidence, why = judge_kill(self.oom_watch, self.memory_counters(), alone={os.getpid()})
            no_evidence = None if evidence is not None else why
        if not self.ready and self.user_stop is None:
            failure = self.watcher.conclude(None if stopped_by_us else self.returncode, evidence)
        killed_for_memory = evidence if self.ready else None
        return Outcome(
            exit_code=exit_code_for(self.returncode),
            returncode=self.returncode,
            ready=self.ready,
            failure=failure,
            stopped_by_us=stopped_by_us,
            user_stop_signal=self.user_stop,
            signals_forwarded=tuple(self.forwarded),
            pid=self.child.proc.pid,
            used_pty=self.use_pty,
            killed_for_memory=killed_for_memory,
            killed_without_evidence=no_evidence,
        )

    def cleanup(self) -> None:
        self._take_foreground()
        if self.probe_thread is not None:
            self.probe_thread.close()
            self.probe_thread = None
        if self.child.proc is not None and self.returncode is None:
            # Leaving on an exception: the child must not outlive the loop that relays its output.
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.child.proc.pid, signal.SIGKILL)
            self.returncode = self.child.proc.wait()
        self.child.close()


def _is_open(fd: int) -> bool:
    try:
        os.fstat(fd)
    except OSError:
        return False
    return True


def supervise_child(
    argv: Sequence[str | os.PathLike[str]],
    env: Mapping[str, str],
    *,
    watcher: StartupWatcher,
    probe: ReadinessProbe | None = None,
    use_pty: bool | None = None,
    stdin_fd: int = 0,
    stdout_fd: int = 1,
    stderr_fd: int = 2,
    stop_grace: float = 2.0,
    kill_after: float = 5.0,
    memory_counters: Callable[[], Mapping[str, int]] | None = None,
    started: Started | None = None,
    say: Callable[[str], None] | None = None,
    hand_off: Callable[[HandOff], None] | None = None,
    hand_off_at_spawn: bool = False,
) -> Outcome:
    """Run argv (never through a shell) until it exits, passing bytes and signals through.

    use_pty None: a pty when stdin and stdout are terminals, pipes otherwise. The watcher sees start-up
    output until the probe says ready; after a STOP_FAILED verdict the child gets stop_grace seconds to
    exit by itself, then SIGTERM, then SIGKILL after kill_after more. Call from the main thread of a
    process with no other threads that might take the forwarded signals. A binary that is missing or
    not executable raises SafeLlamaError (127 / 126), with no child left behind. memory_counters: what
    tells an OOM kill from a user's SIGKILL (default: the cgroup's and the kernel's OOM counters; only
    evidence naming the child counts, see probe_host.OomWatch). started: the child already running on
    pipes (early.py started it with argv and env, its watched signals blocked since), supervised from here
    on. say: where a stop of the child (SIGSTOP) and its SIGCONT are said, as they happen. A stop asked
    (SIGTERM, SIGINT, SIGHUP, SIGQUIT) while the child is stopped gets it SIGCONT, and SIGKILL kill_after
    seconds later if it has not ended: safe-llama never waits on a stopped child. hand_off: called once
    the child is ready, in pipe mode with stdin no terminal, nothing pending (no stop asked, the child not
    stopped, its output passed on: waited for HAND_OFF_WAIT at most), with what the handed supervisor needs; it
    execs that supervisor and never returns, or returns and this one goes on. hand_off_at_spawn: called as soon
    as the child runs, not once it is ready (the handed supervisor watches its start-up: process/starting.py).
    """
    args = [os.fspath(a) for a in argv]
    if not args:
        raise ValueError("supervise_child() needs a program to run")
    pty_mode = started is None and (use_pty if use_pty is not None else os.isatty(stdin_fd) and os.isatty(stdout_fd))
    child = Child(args, {**env, GUARD_ENV: str(os.getpid())}, use_pty=pty_mode, fds=(stdin_fd, stdout_fd, stderr_fd))
    supervisor = _Supervisor(child, watcher, probe, stop_grace, kill_after)
    supervisor.say = say
    supervisor.hand_off = hand_off
    supervisor.at_spawn = hand_off_at_spawn and hand_off is not None and not pty_mode
    if memory_counters is not None:
        supervisor.memory_counters = memory_counters
    watched, old_mask = block_watched(pty_mode)
    if started is not None:
        old_mask = started.mask_before
    supervisor.mask_before = old_mask
    sigfd: SignalFd | None = None
    try:
        sigfd = SignalFd(watched)
        supervisor.spawn(started)
        supervisor.run(sigfd)
        for signo in sigfd.read():  # came with the child's end: remember a stop, nothing to forward
            if signo in STOP_SIGNALS and supervisor.user_stop is None:
                supervisor.user_stop = signo
        return supervisor.outcome()
    finally:
        supervisor.cleanup()
        if sigfd is not None:
            sigfd.close()
        signal.pthread_sigmask(signal.SIG_SETMASK, old_mask)
