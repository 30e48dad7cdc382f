"""The supervision of a llama.cpp child that runs: its output relayed, each signal forwarded once, a stop asked
of a stopped child ended, job control in pipe mode, the child reaped, the drain after its exit, and its exit
code. Steady is that loop; supervise.py's start-up supervisor extends it (start-up, the pty), and the handed
supervisor (handed.py, the small process a ready llama-server's supervision moves to) runs it as it is, so what
runs after ready is one code in both.

Owns that loop and exit_code_for. Must not decide policy and must never alter, delay or hold back a byte the
child writes; must stay light (os, select, signal, time, and the light relay.py, signals.py and fork_exec.py;
messages.py only when a child is stopped): the handed supervisor imports it while llama-server runs.
"""

from __future__ import annotations

import os
import select
import signal
import time

from safe_llama.process.fork_exec import terminal_foreground
from safe_llama.process.relay import DRAIN_IDLE, HIGH_WATER, READ_SIZE, Relay
from safe_llama.process.signals import COALESCE, STOP_SIGNALS, TERMINAL_STOPS, is_stopped

TYPE_CHECKING = False  # typing.TYPE_CHECKING without importing typing (mypy reads the name)
if TYPE_CHECKING:
    from collections.abc import Callable
    from typing import Protocol

    from safe_llama.process.channels import Child

    class SignalSource(Protocol):
        """Where the watched signals are read from: a signalfd (signals.SignalFd) or a wake-up pipe (handed.py)."""

        fd: int

        def read(self) -> list[int]: ...


def exit_code_for(returncode: int) -> int:
    """tini/dumb-init semantics: exit(N) gives N, death by signal N gives 128+N."""
    return 128 - returncode if returncode < 0 else returncode


class Steady:
    """The loop around a running child (see the module's docstring). Subclasses add fds to watch (extra_fds,
    on_event), output to look at (seen), deadlines and timers."""

    def __init__(self, child: Child, kill_after: float) -> None:
        self.child = child
        self.use_pty = child.use_pty
        self.kill_after = kill_after
        self.returncode: int | None = None
        self.kill_sent = False
        self.user_stop: int | None = None
        self.forwarded: list[int] = []
        self.foreground_fd: int | None = None  # pipe mode: the terminal whose foreground the child holds
        self.child_stopped_by_us = False
        self.last_forward: tuple[int, float] = (0, 0.0)
        self.say: Callable[[str], None] | None = None  # safe-llama's own lines (a stopped child)
        self.stop_said = False  # the child's stop was said (a SIGSTOP not ours): its SIGCONT is said too
        self.stop_kill_at: float | None = None  # a stop asked of a stopped child: SIGKILL then if it still runs

    def _terminal_foreground(self) -> int | None:
        """Pipe mode, stdin a terminal where this process's group is in the foreground: that terminal."""
        return None if self.use_pty else terminal_foreground(self.child.stdin_fd)

    def _give_foreground(self) -> None:
        fd = self._terminal_foreground()
        if fd is not None and self.child.proc is not None and self.returncode is None:
            try:
                os.tcsetpgrp(fd, self.child.proc.pid)
                self.foreground_fd = fd
            except OSError:
                pass

    def _take_foreground(self) -> None:
        if self.foreground_fd is not None:
            try:  # noqa: SIM105 -- SIGTTOU is blocked: allowed from the background (no contextlib: light)
                os.tcsetpgrp(self.foreground_fd, os.getpgrp())
            except OSError:
                pass
            self.foreground_fd = None

    # -- the loop ------------------------------------------------------------------------------------

    def loop(self, signals: SignalSource) -> None:
        while not self._finished():
            self._poll_once(signals)

    def _finished(self) -> bool:
        if self.returncode is None:
            return False
        sources_open = any(r.src is not None and r.stream is not None for r in self.child.relays)
        pending = any(r.queue and not r.broken for r in self.child.relays)
        return not sources_open and not pending

    def extra_fds(self) -> dict[int, int]:
        """Other fds to poll, with their masks (the start-up probe's, the watchdog's health check)."""
        return {}

    def on_event(self, fd: int, mask: int) -> None:
        """One of extra_fds() is ready."""

    def seen(self, relay: Relay, data: bytes, now: float) -> None:
        """A chunk of the child's output, after it was passed on (start-up watching looks at it)."""

    def deadlines(self, now: float) -> list[float]:
        """More moments the loop must wake at while the child runs."""
        return []

    def timers(self, now: float) -> None:
        """The child runs: act on what is due now."""
        if self.stop_kill_at is not None and not self.kill_sent and now >= self.stop_kill_at:
            self._send(signal.SIGKILL)
            self.kill_sent = True

    def _poll_once(self, signals: SignalSource) -> None:
        extra = self.extra_fds()
        masks: dict[int, int] = {signals.fd: select.POLLIN, **extra}
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
            if fd == signals.fd:
                self._signals(signals.read())
            elif fd in extra:
                self.on_event(fd, mask)
            else:
                # A relay whose sink broke earlier in this loop has closed its source: skip it.
                if fd in readers and readers[fd].src == fd and mask & (select.POLLIN | select.POLLHUP | select.POLLERR):
                    self._read(readers[fd], now)
                if fd in writers and mask & (select.POLLOUT | select.POLLHUP | select.POLLERR):
                    writers[fd].flush()
        if self.returncode is None:
            self.timers(now)
        elif not events:
            # The child is gone and its output channels stayed quiet: a grandchild holds them open.
            for relay in self.child.relays:
                relay.close_src()

    def _timeout_ms(self) -> int:
        now = time.monotonic()
        deadlines: list[float] = []
        if self.returncode is None:
            deadlines = self.deadlines(now)
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
            self.user_input(relay, data)
            return
        relay.push(data)
        self.seen(relay, data, now)

    def user_input(self, relay: Relay, data: bytes) -> None:
        """The user's keys (pty mode), on their way to the child."""
        relay.push(data)

    def _send(self, signo: int) -> None:
        if self.child.proc is not None and self.returncode is None:
            try:  # noqa: SIM105 -- no contextlib: light
                os.kill(self.child.proc.pid, signo)
            except ProcessLookupError:
                pass

    # -- signals -------------------------------------------------------------------------------------

    def _signals(self, signos: list[int]) -> None:
        for signo in signos:
            if signo == signal.SIGCHLD:
                self._reap()
            elif signo == signal.SIGWINCH:
                self._resize()
            elif signo == signal.SIGCONT:
                self._resumed()
            elif signo == signal.SIGTSTP:
                self._suspend()
            else:
                self._forward(signo)

    def _forward(self, signo: int) -> None:
        if signo in STOP_SIGNALS and self.user_stop is None:
            self.user_stop = signo
        now = time.monotonic()
        last_signo, last_at = self.last_forward
        if signo == last_signo and now - last_at < COALESCE:
            return
        if self.returncode is None:  # the child is in no group a sender knows of: it gets it from us only
            self._send(signo)
            self.forwarded.append(signo)
            self.last_forward = (signo, now)
            if signo in STOP_SIGNALS:
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
            import fcntl
            import termios

            try:  # noqa: SIM105 -- no contextlib: light
                fcntl.ioctl(self.child.master, termios.TIOCSWINSZ, self.child.terminal.window_size())
            except OSError:
                pass

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
            import termios

            try:  # noqa: SIM105 -- no contextlib: light
                self.child.terminal.make_raw()
            except (OSError, termios.error):
                pass
            self._resize()  # the window may have changed while we were stopped
        if self.foreground_fd is None:
            self._give_foreground()  # `fg` made us the foreground job again (`bg` did not)
        self.child_stopped_by_us = False
        self._signal_child_group(signal.SIGCONT)

    def _signal_child_group(self, signo: int) -> None:
        if self.child.proc is not None and self.returncode is None:
            try:  # noqa: SIM105 -- no contextlib: light
                os.killpg(self.child.proc.pid, signo)
            except (ProcessLookupError, PermissionError):
                pass

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
                from safe_llama.messages import CHILD_CONTINUED  # a stop said before: messages is loaded then

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
            from safe_llama.messages import CHILD_STOPPED  # only now: the handed supervisor stays light till then

            self.say(CHILD_STOPPED.text(tool=self._tool(), pid=pid, signal=signal.Signals(signo).name))
        self.stop_said = True
        if self.user_stop is not None:
            self._end_stopped()

    def _tool(self) -> str:
        return os.path.basename(self.child.argv[0])

    def killed_unasked(self) -> bool:
        """The child died of a SIGKILL that was neither ours nor asked for: a kill that may be for memory."""
        return self.user_stop is None and self.returncode == -signal.SIGKILL and not self.kill_sent
