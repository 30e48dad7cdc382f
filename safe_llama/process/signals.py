"""Signal policy and its OS parts: which signals mean "stop", signals read from a signalfd, job-control facts
(which are forwarded, and the child's set-up between fork and exec, are fork_exec.py's: the early start needs them).

Owns what a signal is and how it is received. Must not decide when to send one: the loops in steady.py and
supervise.py do. Must stay light (os, signal, struct, termios; ctypes only for a signalfd): the handed supervisor
(handed.py) reads its policy while llama-server runs.
"""

from __future__ import annotations

import os
import signal
import struct
import termios

TYPE_CHECKING = False  # typing.TYPE_CHECKING without importing typing (mypy reads the name)
if TYPE_CHECKING:
    from collections.abc import Sequence

STOP_SIGNALS = frozenset({signal.SIGTERM, signal.SIGHUP, signal.SIGINT, signal.SIGQUIT})
TERMINAL_STOPS = frozenset({signal.SIGTSTP, signal.SIGTTIN, signal.SIGTTOU})  # job control, not a plain SIGSTOP

# The same signal again this soon is one request sent twice (coreutils `timeout` signals its child, then
# its own group): merged, as the kernel merges a signal that is still pending. A person's second ^C or
# second `kill` comes later and is forwarded.
COALESCE = 0.1

_SIGINFO = struct.Struct("=I")  # ssi_signo: the head of struct signalfd_siginfo
_SIGINFO_SIZE = 128


class SignalFd:
    """Signals as readable records (their numbers, in the order they came), for signals blocked in this thread."""

    def __init__(self, signals: Sequence[int]) -> None:
        import ctypes  # signalfd has no os.* function

        word_bits = ctypes.sizeof(ctypes.c_ulong) * 8
        mask = (ctypes.c_ulong * (1024 // word_bits))()  # the kernel's sigset_t is 1024 bits in glibc
        for signo in signals:
            mask[(signo - 1) // word_bits] |= 1 << ((signo - 1) % word_bits)
        fd = ctypes.CDLL(None, use_errno=True).signalfd(-1, ctypes.byref(mask), os.O_NONBLOCK | os.O_CLOEXEC)
        if fd < 0:
            err = ctypes.get_errno()
            raise OSError(err, os.strerror(err))
        self.fd: int = fd

    def read(self) -> list[int]:
        signos: list[int] = []
        while True:
            try:
                data = os.read(self.fd, _SIGINFO_SIZE * 16)
            except BlockingIOError:
                return signos
            for offset in range(0, len(data) - _SIGINFO_SIZE + 1, _SIGINFO_SIZE):
                signos.append(_SIGINFO.unpack_from(data, offset)[0])

    def close(self) -> None:
        os.close(self.fd)


def signal_keys(pty_fd: int) -> dict[bytes, int]:
    """The keys a pty turns into signals now (none when the child put it in raw mode)."""
    try:
        attrs = termios.tcgetattr(pty_fd)  # on Linux, the master reads the slave's settings
    except termios.error:
        return {}
    if not attrs[3] & termios.ISIG:
        return {}
    keys: dict[bytes, int] = {}
    for index, signo in (
        (termios.VINTR, signal.SIGINT),
        (termios.VQUIT, signal.SIGQUIT),
        (termios.VSUSP, signal.SIGTSTP),
    ):
        key = attrs[6][index]
        if isinstance(key, bytes) and key != b"\0":  # NUL: _POSIX_VDISABLE
            keys[key] = signo
    return keys


def is_stopped(pid: int) -> bool:
    """pid is stopped now (a stop already undone by a SIGCONT is not news)."""
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii", errors="replace") as f:
            return f.read().rsplit(")", 1)[1].split()[0] in ("T", "t")
    except (OSError, IndexError):
        return False
