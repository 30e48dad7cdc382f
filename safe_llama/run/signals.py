"""Signal policy and its OS parts: which signals are forwarded or mean "stop", signals read from a signalfd,
the child's set-up between fork and exec (death signal, own group or session, empty mask), job-control facts.

Owns what a signal is and how it is received. Must not decide when to send one: the loop in supervise.py does.
"""

from __future__ import annotations

import contextlib
import ctypes
import fcntl
import os
import signal
import struct
import termios
from collections.abc import Callable, Sequence
from dataclasses import dataclass

FORWARDED = (signal.SIGTERM, signal.SIGHUP, signal.SIGINT, signal.SIGQUIT, signal.SIGUSR1, signal.SIGUSR2)
STOP_SIGNALS = frozenset({signal.SIGTERM, signal.SIGHUP, signal.SIGINT, signal.SIGQUIT})
TERMINAL_STOPS = frozenset({signal.SIGTSTP, signal.SIGTTIN, signal.SIGTTOU})  # job control, not a plain SIGSTOP

PR_SET_PDEATHSIG = 1
# The same signal again this soon is one request sent twice (coreutils `timeout` signals its child, then
# its own group): merged, as the kernel merges a signal that is still pending. A person's second ^C or
# second `kill` comes later and is forwarded.
COALESCE = 0.1

_libc = ctypes.CDLL(None, use_errno=True)
_SIGINFO = struct.Struct("=Iii")  # ssi_signo, ssi_errno, ssi_code: the head of struct signalfd_siginfo
_SIGINFO_SIZE = 128


@dataclass(frozen=True)
class SigInfo:
    signo: int
    code: int  # SI_USER for kill(), SI_KERNEL (0x80) for the tty driver's


class SignalFd:
    """Signals as readable records (with their siginfo), for signals blocked in this thread."""

    def __init__(self, signals: Sequence[int]) -> None:
        word_bits = ctypes.sizeof(ctypes.c_ulong) * 8
        mask = (ctypes.c_ulong * (1024 // word_bits))()  # the kernel's sigset_t is 1024 bits in glibc
        for signo in signals:
            mask[(signo - 1) // word_bits] |= 1 << ((signo - 1) % word_bits)
        fd = _libc.signalfd(-1, ctypes.byref(mask), os.O_NONBLOCK | os.O_CLOEXEC)
        if fd < 0:
            err = ctypes.get_errno()
            raise OSError(err, os.strerror(err))
        self.fd: int = fd

    def read(self) -> list[SigInfo]:
        infos: list[SigInfo] = []
        while True:
            try:
                data = os.read(self.fd, _SIGINFO_SIZE * 16)
            except BlockingIOError:
                return infos
            for offset in range(0, len(data) - _SIGINFO_SIZE + 1, _SIGINFO_SIZE):
                signo, _err, code = _SIGINFO.unpack_from(data, offset)
                infos.append(SigInfo(signo, code))

    def close(self) -> None:
        os.close(self.fd)


def forwardable() -> tuple[int, ...]:
    # A signal the wrapper was started with ignored (nohup's SIGHUP) stays ignored: the child inherits
    # that, and there is nothing to forward.
    return tuple(s for s in FORWARDED if signal.getsignal(s) is not signal.SIG_IGN)


def child_setup(parent: int, controlling_tty: bool, foreground_fd: int | None) -> Callable[[], None]:
    """Runs in the child between fork and exec (no shell, no exec shim).

    controlling_tty: the child leads a new session whose terminal is its stdin (the pty). Otherwise it
    gets a process group of its own, made the terminal's foreground group when foreground_fd is given
    (SIGTTOU is still blocked here, so tcsetpgrp from the now-background group does not stop it).
    """
    prctl = _libc.prctl

    def setup() -> None:
        prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
        if os.getppid() != parent:  # the wrapper died before prctl took effect
            os.kill(os.getpid(), signal.SIGKILL)
        if controlling_tty:
            fcntl.ioctl(0, termios.TIOCSCTTY, 0)
        else:
            os.setpgid(0, 0)
            if foreground_fd is not None:
                with contextlib.suppress(OSError):
                    os.tcsetpgrp(foreground_fd, os.getpid())
        signal.pthread_sigmask(signal.SIG_SETMASK, [])  # the wrapper blocks signals it reads from signalfd

    return setup


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
