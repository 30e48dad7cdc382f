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

Over 400 lines on purpose: _Supervisor is one state machine (the child, job control, readiness, the
signal queue, the drain after exit) whose states share fields; the stateless parts are already out.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import select
import signal
import termios
import time
from collections.abc import Callable, Mapping, Sequence

from safe_llama.constants import GUARD_ENV
from safe_llama.device.probe_host import OomWatch, judge_kill, oom_counters, watch_oom
from safe_llama.diagnosis.signatures import Failure
from safe_llama.messages import CHILD_CONTINUED, CHILD_STOPPED
from safe_llama.process.channels import Child
from safe_llama.process.fork_exec import Started, block_watched, forwardable, terminal_foreground
from safe_llama.process.readiness import ProbeThread, ReadinessProbe
from safe_llama.process.relay import DRAIN_IDLE, HIGH_WATER, READ_SIZE, Relay, Stream
from safe_llama.process.signals import (
    COALESCE,
    STOP_SIGNALS,
    TERMINAL_STOPS,
    SigInfo,
    SignalFd,
    is_stopped,
    signal_keys,
)
from safe_llama.process.startup import Outcome, StartupWatcher, Verdict, exit_code_for

# ---------------------------------------------------------------------------------------------------
# supervise_child()
# ---------------------------------------------------------------------------------------------------


class _Supervisor:
    def __init__(
        self,
        child: Child,
        watcher: StartupWatcher,
        probe: ReadinessProbe | None,
        stop_grace: float,
        kill_after: float,
    ) -> None:
        self.child, self.watcher, self.probe = child, watcher, probe
        self.use_pty = child.use_pty
        self.stop_grace, self.kill_after = stop_grace, kill_after
        self.forwardable = forwardable()
        self.returncode: int | None = None
        self.probe_thread: ProbeThread | None = None
        self.ready = False
        self.failing_since: float | None = None
        self.term_sent_at: float | None = None
        self.kill_sent = False
        self.user_stop: int | None = None
        self.forwarded: list[int] = []
        self.foreground_fd: int | None = None  # pipe mode: the terminal whose foreground the child holds
        self.child_stopped_by_us = False
        self.last_forward: tuple[int, float] = (0, 0.0)
        self.memory_counters: Callable[[], Mapping[str, int]] = oom_counters
        self.oom_watch: OomWatch | None = None
        self.say: Callable[[str], None] | None = None  # safe-llama's own lines (a stopped child)
        self.stop_said = False  # the child's stop was said (a SIGSTOP not ours): its SIGCONT is said too
        self.stop_kill_at: float | None = None  # a stop asked of a stopped child: SIGKILL then if it still runs

    def _terminal_foreground(self) -> int | None:
        """Pipe mode, stdin a terminal where this process's group is in the foreground: that terminal."""
        return None if self.use_pty else terminal_foreground(self.child.stdin_fd)

    def _give_foreground(self) -> None:
        fd = self._terminal_foreground()
        if fd is not None and self.child.proc is not None and self.returncode is None:
            with contextlib.suppress(OSError):
                os.tcsetpgrp(fd, self.child.proc.pid)
                self.foreground_fd = fd

    def _take_foreground(self) -> None:
        if self.foreground_fd is not None:
            with contextlib.suppress(OSError):  # SIGTTOU is blocked: allowed from the background
                os.tcsetpgrp(self.foreground_fd, os.getpgrp())
            self.foreground_fd = None

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
        if self.probe is not None:
            interval = self.probe.poll_interval()
            if interval is not None:
                self.probe_thread = ProbeThread(self.probe, interval)
        while not self._finished():
            self._poll_once(sigfd)

    def _finished(self) -> bool:
        if self.returncode is None:
            return False
        sources_open = any(r.src is not None and r.stream is not None for r in self.child.relays)
        pending = any(r.queue and not r.broken for r in self.child.relays)
        return not sources_open and not pending

    def _poll_once(self, sigfd: SignalFd) -> None:
        masks: dict[int, int] = {sigfd.fd: select.POLLIN}
        if self.probe_thread is not None:
            masks[self.probe_thread.read_fd] = select.POLLIN
        readers: dict[int, Relay] = {}
        writers: dict[int, Relay] = {}
        for relay in self.child.all_relays():
            if relay.src is not None and len(relay.queue) < HIGH_WATER:
                readers[relay.src] = relay
                masks[relay.src] = masks.get(relay.src, 0) | select.POLLIN
            if relay.queue and not relay.broken:
                writers[relay.sink.fd] = relay
                masks[relay.sink.fd] = masks.get(relay.sink.fd, 0) | select.POLLOUT
        poller = select.poll()
        for fd, mask in masks.items():
            poller.register(fd, mask)
        events = poller.poll(self._timeout_ms())
        now = time.monotonic()
        for fd, mask in events:
            if fd == sigfd.fd:
                self._signals(sigfd.read())
            elif self.probe_thread is not None and fd == self.probe_thread.read_fd:
                os.read(fd, 1)
                self._become_ready()
            else:
                # A relay whose sink broke earlier in this loop has closed its source: skip it.
                if fd in readers and readers[fd].src == fd and mask & (select.POLLIN | select.POLLHUP | select.POLLERR):
                    self._read(readers[fd], now)
                if fd in writers and mask & (select.POLLOUT | select.POLLHUP | select.POLLERR):
                    writers[fd].flush()
        if self.returncode is None:
            self._timers(now)
        elif not events:
            # The child is gone and its output channels stayed quiet: a grandchild holds them open.
            for relay in self.child.relays:
                relay.close_src()

    def _timeout_ms(self) -> int:
        now = time.monotonic()
        deadlines: list[float] = []
        if self.returncode is None:
            if self.failing_since is not None and self.term_sent_at is None:
                deadlines.append(self.failing_since + self.stop_grace)
            if self.term_sent_at is not None and not self.kill_sent:
                deadlines.append(self.term_sent_at + self.kill_after)
            if self.stop_kill_at is not None and not self.kill_sent:
                deadlines.append(self.stop_kill_at)
        else:
            deadlines.append(now + DRAIN_IDLE)
        if not deadlines:
            return -1
        return max(0, int((min(deadlines) - now) * 1000) + 1)

    def _read(self, relay: Relay, now: float) -> None:
        if relay.src is None:
            return
        try:
            data = os.read(relay.src, READ_SIZE)
        except BlockingIOError:
            return
        except OSError:  # EIO: the pty's last slave closed
            data = b""
        if not data:
            relay.close_src()
            if relay.stream is None:
                self.child.input_relay = None
            return
        if relay.stream is None:
            self._user_input(relay, data)
            return
        relay.push(data)
        if not self.ready:
            self._startup_output(relay.stream, data, now)

    def _user_input(self, relay: Relay, data: bytes) -> None:
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

    def _timers(self, now: float) -> None:
        if self.stop_kill_at is not None and not self.kill_sent and now >= self.stop_kill_at:
            self._send(signal.SIGKILL)
            self.kill_sent = True
        if self.failing_since is None or self.child.proc is None:
            return
        if self.term_sent_at is None and now >= self.failing_since + self.stop_grace:
            self._send(signal.SIGTERM)
            self.term_sent_at = now
        elif self.term_sent_at is not None and not self.kill_sent and now >= self.term_sent_at + self.kill_after:
            self._send(signal.SIGKILL)
            self.kill_sent = True

    def _send(self, signo: int) -> None:
        if self.child.proc is not None and self.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.child.proc.pid, signo)

    # -- signals -------------------------------------------------------------------------------------

    def _signals(self, infos: list[SigInfo]) -> None:
        for info in infos:
            if info.signo == signal.SIGCHLD:
                self._reap()
            elif info.signo == signal.SIGWINCH:
                self._resize()
            elif info.signo == signal.SIGCONT:
                self._resumed()
            elif info.signo == signal.SIGTSTP:
                self._suspend()
            else:
                self._forward(info)

    def _forward(self, info: SigInfo) -> None:
        if info.signo in STOP_SIGNALS and self.user_stop is None:
            self.user_stop = info.signo
        now = time.monotonic()
        last_signo, last_at = self.last_forward
        if info.signo == last_signo and now - last_at < COALESCE:
            return
        if self.returncode is None:  # the child is in no group a sender knows of: it gets it from us only
            self._send(info.signo)
            self.forwarded.append(info.signo)
            self.last_forward = (info.signo, now)
            if info.signo in STOP_SIGNALS:
                self._end_stopped()

    def _end_stopped(self) -> None:
        """A stop was asked and the child is stopped (a SIGSTOP not ours): the signal waits in its queue until
        SIGCONT, so it gets SIGCONT now, and SIGKILL if it has not ended kill_after seconds later."""
        proc = self.child.proc
        if proc is None or self.returncode is not None or self.stop_kill_at is not None or self.child_stopped_by_us:
            return
        if not (self.stop_said or is_stopped(proc.pid)):
            return
        self.stop_kill_at = time.monotonic() + self.kill_after
        self._signal_child_group(signal.SIGCONT)

    def _resize(self) -> None:
        if self.child.terminal is not None and self.child.master is not None:
            with contextlib.suppress(OSError):
                fcntl.ioctl(self.child.master, termios.TIOCSWINSZ, self.child.terminal.window_size())

    def _suspend(self) -> None:
        """Job control: stop the child, give the terminal back as it was, stop; resume: undo."""
        self.child_stopped_by_us = True
        self._signal_child_group(signal.SIGSTOP)
        self._stop_self()

    def _stop_self(self) -> None:
        self._take_foreground()
        if self.child.terminal is not None:
            self.child.terminal.restore()
        os.kill(os.getpid(), signal.SIGSTOP)
        self._resumed()

    def _resumed(self) -> None:
        if self.child.terminal is not None:
            with contextlib.suppress(OSError, termios.error):
                self.child.terminal.make_raw()
            self._resize()  # the window may have changed while we were stopped
        if self.foreground_fd is None:
            self._give_foreground()  # `fg` made us the foreground job again (`bg` did not)
        self.child_stopped_by_us = False
        self._signal_child_group(signal.SIGCONT)

    def _signal_child_group(self, signo: int) -> None:
        if self.child.proc is not None and self.returncode is None:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(self.child.proc.pid, signo)

    def _reap(self) -> None:
        proc = self.child.proc
        if proc is None or self.returncode is not None:
            return
        try:
            pid, status = os.waitpid(proc.pid, os.WNOHANG | os.WUNTRACED | os.WCONTINUED)
        except ChildProcessError:
            return
        if pid == 0:
            return
        if os.WIFSTOPPED(status):
            self._stopped(pid, os.WSTOPSIG(status))
            return
        if os.WIFCONTINUED(status):
            if self.stop_said and self.say is not None:
                self.say(CHILD_CONTINUED.text(tool=self._tool(), pid=pid))
            self.stop_said = False
            return
        self.returncode = os.waitstatus_to_exitcode(status)
        proc.returncode = self.returncode
        self._take_foreground()

    def _stopped(self, pid: int, signo: int) -> None:
        """The child stopped. The terminal's ^Z (or a read from it in the background) in pipe mode stopped
        its group: stop as well, so the shell sees the job stopped and gets its terminal back. Any other stop
        not ours (a user's `kill -STOP`, a debugger) is not job control: safe-llama keeps running and says it
        (systemd's watchdog pings pause while /health does not answer); a stop asked before goes on."""
        if self.child_stopped_by_us or not is_stopped(pid):  # ours, or undone by a SIGCONT already
            return
        if signo in TERMINAL_STOPS and not self.use_pty:
            self._stop_self()
            return
        if not self.stop_said and self.say is not None:
            self.say(CHILD_STOPPED.text(tool=self._tool(), pid=pid, signal=signal.Signals(signo).name))
        self.stop_said = True
        if self.user_stop is not None:
            self._end_stopped()

    def _tool(self) -> str:
        return os.path.basename(self.child.argv[0])

    # -- the end -------------------------------------------------------------------------------------

    def outcome(self) -> Outcome:
        assert self.child.proc is not None and self.returncode is not None
        failure: Failure | None = None
        stopped_by_us = self.term_sent_at is not None
        evidence, no_evidence = None, None
        if self.user_stop is None and self.returncode == -signal.SIGKILL and not self.kill_sent:
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
    seconds later if it has not ended: safe-llama never waits on a stopped child.
    """
    args = [os.fspath(a) for a in argv]
    if not args:
        raise ValueError("supervise_child() needs a program to run")
    pty_mode = started is None and (use_pty if use_pty is not None else os.isatty(stdin_fd) and os.isatty(stdout_fd))
    child = Child(args, {**env, GUARD_ENV: str(os.getpid())}, use_pty=pty_mode, fds=(stdin_fd, stdout_fd, stderr_fd))
    supervisor = _Supervisor(child, watcher, probe, stop_grace, kill_after)
    supervisor.say = say
    if memory_counters is not None:
        supervisor.memory_counters = memory_counters
    watched, old_mask = block_watched(pty_mode)
    if started is not None:
        old_mask = started.mask_before
    sigfd: SignalFd | None = None
    try:
        sigfd = SignalFd(watched)
        supervisor.spawn(started)
        supervisor.run(sigfd)
        for info in sigfd.read():  # came with the child's end: remember a stop, nothing to forward
            if info.signo in STOP_SIGNALS and supervisor.user_stop is None:
                supervisor.user_stop = info.signo
        return supervisor.outcome()
    finally:
        supervisor.cleanup()
        if sigfd is not None:
            sigfd.close()
        signal.pthread_sigmask(signal.SIG_SETMASK, old_mask)
