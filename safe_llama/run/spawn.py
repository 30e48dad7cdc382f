"""Starting the llama.cpp child on pipes or on a pty of its own, and closing the channels to it.

Owns Popen, the pty pair, the relays' ends and what a failed exec means (127 not found, 126 not executable).
Must not wait for, signal or watch the child: the loop in supervise.py does.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import os
import subprocess
import termios
from collections.abc import Callable

from safe_llama.errors import ExitStatus, SafeLlamaError
from safe_llama.run.relay import Relay, Sink, Stream, Terminal, pipe_relay


def _spawn_error(binary: str, err: OSError) -> SafeLlamaError:
    if isinstance(err, FileNotFoundError) or err.errno in (errno.ENOENT, errno.ENOTDIR):
        return SafeLlamaError(f"safe-llama: {binary}: not found", ExitStatus.NOT_FOUND)
    reason = "not executable" if err.errno in (errno.EACCES, errno.EPERM) else (err.strerror or str(err))
    return SafeLlamaError(f"safe-llama: {binary}: cannot execute: {reason}", ExitStatus.NOT_EXECUTABLE)


def _take_fd(proc: subprocess.Popen[bytes], name: str) -> int:
    """Our own copy of one of Popen's pipe ends, its file object closed (so no one closes it twice)."""
    pipe = getattr(proc, name)
    fd = os.dup(pipe.fileno())
    pipe.close()
    setattr(proc, name, None)
    return fd


def _same_file(fd_a: int, fd_b: int) -> bool:
    try:
        a, b = os.fstat(fd_a), os.fstat(fd_b)
    except OSError:
        return False
    return (a.st_dev, a.st_ino) == (b.st_dev, b.st_ino)


class Child:
    """The child process and its channels, filled in as it starts: a failure half-way leaves close() all
    it must close."""

    def __init__(self, argv: list[str], env: dict[str, str], *, use_pty: bool, fds: tuple[int, int, int]) -> None:
        self.argv, self.env, self.use_pty = argv, env, use_pty
        self.stdin_fd, self.stdout_fd, self.stderr_fd = fds
        self.proc: subprocess.Popen[bytes] | None = None
        self.relays: list[Relay] = []  # the child's output on its way to the wrapper's stdout and stderr
        self.input_relay: Relay | None = None  # pty mode: the user's keys on their way to the pty
        self.master: int | None = None
        self.terminal: Terminal | None = None

    def start(self, setup: Callable[[], None]) -> None:
        """Spawn argv (never through a shell), setup running in the child before exec."""
        if self.use_pty:
            self._start_pty(setup)
        else:
            self._start_pipes(setup)
            assert self.proc is not None
            with contextlib.suppress(OSError):  # as a shell does: both sides, whichever runs first
                os.setpgid(self.proc.pid, self.proc.pid)

    def all_relays(self) -> list[Relay]:
        return [*self.relays, *([self.input_relay] if self.input_relay is not None else [])]

    def _popen(self, setup: Callable[[], None], stdin: int | None, stdout: int, stderr: int) -> subprocess.Popen[bytes]:
        try:
            return subprocess.Popen(
                self.argv,
                env=self.env,
                stdin=stdin,
                stdout=stdout,
                stderr=stderr,
                preexec_fn=setup,  # safe: spawned while this process runs no other thread
                start_new_session=self.use_pty,
            )
        except OSError as err:
            raise _spawn_error(self.argv[0], err) from None

    def _start_pipes(self, setup: Callable[[], None]) -> None:
        combined = _same_file(self.stdout_fd, self.stderr_fd)
        self.proc = proc = self._popen(
            setup,
            stdin=None if self.stdin_fd == 0 else self.stdin_fd,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT if combined else subprocess.PIPE,
        )
        out_stream = Stream.COMBINED if combined else Stream.STDOUT
        self.relays.append(pipe_relay(_take_fd(proc, "stdout"), self.stdout_fd, out_stream))
        if not combined:
            self.relays.append(pipe_relay(_take_fd(proc, "stderr"), self.stderr_fd, Stream.STDERR))

    def _start_pty(self, setup: Callable[[], None]) -> None:
        self.terminal = terminal = Terminal(self.stdin_fd, self.stdout_fd)
        master, slave = os.openpty()
        self.master = master
        try:
            termios.tcsetattr(slave, termios.TCSANOW, terminal.saved)
            fcntl.ioctl(slave, termios.TIOCSWINSZ, terminal.window_size())
            stderr_is_tty = os.isatty(self.stderr_fd)
            proc = self._popen(setup, stdin=slave, stdout=slave, stderr=slave if stderr_is_tty else subprocess.PIPE)
        finally:
            os.close(slave)
        self.proc = proc
        os.set_blocking(master, False)
        self.relays.append(Relay(master, Sink(self.stdout_fd), Stream.COMBINED, owns_src=False))
        if not stderr_is_tty:
            self.relays.append(pipe_relay(_take_fd(proc, "stderr"), self.stderr_fd, Stream.STDERR))
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
