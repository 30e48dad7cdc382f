"""Starting the llama.cpp child on pipes or on a pty of its own, and closing the channels to it.

Owns the pty pair, the pipes, the relays' ends and what a failed exec means (127 not found, 126 not
executable), and the refusal to start when a PATH shim led back to safe-llama; the fork and the child's
set-up are fork_exec.py's. Must not wait for, signal or watch the
child: the loop in supervise.py does.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import os
import termios
from collections.abc import Mapping

from safe_llama.constants import GUARD_ENV
from safe_llama.errors import ExitStatus, SafeLlamaError
from safe_llama.process import fork_exec
from safe_llama.process.fork_exec import Proc, Started
from safe_llama.process.relay import Relay, Sink, Stream, Terminal, pipe_relay


def spawn_error(binary: str, err: OSError) -> SafeLlamaError:
    if isinstance(err, FileNotFoundError) or err.errno in (errno.ENOENT, errno.ENOTDIR):
        return SafeLlamaError(f"safe-llama: {binary}: not found", ExitStatus.NOT_FOUND)
    reason = "not executable" if err.errno in (errno.EACCES, errno.EPERM) else (err.strerror or str(err))
    return SafeLlamaError(f"safe-llama: {binary}: cannot execute: {reason}", ExitStatus.NOT_EXECUTABLE)


def check_not_nested(env: Mapping[str, str]) -> None:
    """Refuse to run when a safe-llama started this process as its llama.cpp: a PATH shim script that runs
    safe-llama again (binaries.py compares real paths, which a script passes)."""
    if GUARD_ENV in env:
        raise SafeLlamaError(
            f"safe-llama: started by safe-llama (pid {env[GUARD_ENV]}) in place of llama.cpp: "
            "a llama.cpp name on PATH leads back to safe-llama",
            ExitStatus.NOT_FOUND,
        )


class Child:
    """The child process and its channels, filled in as it starts: a failure half-way leaves close() all
    it must close."""

    def __init__(self, argv: list[str], env: dict[str, str], *, use_pty: bool, fds: tuple[int, int, int]) -> None:
        self.argv, self.env, self.use_pty = argv, env, use_pty
        self.stdin_fd, self.stdout_fd, self.stderr_fd = fds
        self.proc: Proc | None = None
        self.relays: list[Relay] = []  # the child's output on its way to the wrapper's stdout and stderr
        self.input_relay: Relay | None = None  # pty mode: the user's keys on their way to the pty
        self.master: int | None = None
        self.terminal: Terminal | None = None

    def start(self, foreground_fd: int | None) -> None:
        """Spawn argv (never through a shell): on a new session on the pty, or in a group of its own whose
        terminal foreground it takes when foreground_fd is given."""
        if self.use_pty:
            self._start_pty()
        else:
            self._start_pipes(foreground_fd)

    def adopt(self, started: Started) -> None:
        """Take over a child already started on pipes (by early.start, with fork_exec's set-up)."""
        self.proc = Proc(started.pid)
        out_stream = Stream.STDOUT if started.stderr_src is not None else Stream.COMBINED
        self.relays.append(pipe_relay(started.stdout_src, self.stdout_fd, out_stream))
        if started.stderr_src is not None:
            self.relays.append(pipe_relay(started.stderr_src, self.stderr_fd, Stream.STDERR))

    def all_relays(self) -> list[Relay]:
        return [*self.relays, *([self.input_relay] if self.input_relay is not None else [])]

    def _spawn(self, fds: tuple[int | None, int, int], foreground_fd: int | None) -> Proc:
        try:
            return fork_exec.spawn(
                self.argv,
                self.env,
                fds,
                parent=os.getpid(),
                controlling_tty=self.use_pty,
                foreground_fd=foreground_fd,
            )
        except OSError as err:
            raise spawn_error(self.argv[0], err) from None

    def _start_pipes(self, foreground_fd: int | None) -> None:
        try:
            stdin = None if self.stdin_fd == 0 else self.stdin_fd  # 0: inherited as it is (maybe closed)
            proc, out_src, err_src = fork_exec.spawn_on_pipes(
                self.argv, self.env, (stdin, self.stdout_fd, self.stderr_fd), foreground_fd
            )
        except OSError as err:
            raise spawn_error(self.argv[0], err) from None
        self.adopt(Started(proc.pid, out_src, err_src, {}, foreground_fd is not None, set()))

    def _start_pty(self) -> None:
        self.terminal = terminal = Terminal(self.stdin_fd, self.stdout_fd)
        master, slave = os.openpty()
        self.master = master
        err_sink: int | None = None
        try:
            termios.tcsetattr(slave, termios.TCSANOW, terminal.saved)
            fcntl.ioctl(slave, termios.TIOCSWINSZ, terminal.window_size())
            stderr_is_tty = os.isatty(self.stderr_fd)
            if not stderr_is_tty:
                err_src, err_sink = fork_exec.high_pipe()
                self.relays.append(pipe_relay(err_src, self.stderr_fd, Stream.STDERR))
            self.proc = self._spawn((slave, slave, slave if err_sink is None else err_sink), None)
        finally:
            os.close(slave)
            if err_sink is not None:
                os.close(err_sink)
        os.set_blocking(master, False)
        self.relays.insert(0, Relay(master, Sink(self.stdout_fd), Stream.COMBINED, owns_src=False))
        self.input_relay = Relay(self.stdin_fd, Sink(master, private=False), None, owns_src=False)
        terminal.make_raw()

    def close(self) -> None:
        """The terminal as it was, every channel closed (the child already gone: the loop waited for it)."""
        if self.terminal is not None:
            with contextlib.suppress(termios.error):
                self.terminal.restore()
        for relay in self.all_relays():
            relay.close_src()
            relay.sink.close()
        if self.master is not None:
            os.close(self.master)
            self.master = None
