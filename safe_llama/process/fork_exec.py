"""Starting a program as the supervised child: fork, the child's set-up, exec, and the exec's error read
back through a close-on-exec pipe (as subprocess does, without subprocess's 20 ms of imports).

Owns the one implementation of the child's set-up between fork and exec (death signal, own process group
or session, terminal foreground, default SIGPIPE/SIGXFSZ, an empty signal mask, no inherited descriptors
but 0-2, an OOM score above the supervisor's) and the signals the supervisor watches. Must stay light (os,
signal, ctypes): the early start (early.py) runs it before anything else is imported.
Must not watch the child: supervise.py does.
"""

from __future__ import annotations

import os
import signal

from safe_llama.constants import GUARD_ENV

TYPE_CHECKING = False  # typing.TYPE_CHECKING without importing typing (mypy reads the name)
if TYPE_CHECKING:  # collections.abc costs an import on the early path
    from collections.abc import Mapping, Sequence

PR_SET_PDEATHSIG = 1
FORWARDED = (signal.SIGTERM, signal.SIGHUP, signal.SIGINT, signal.SIGQUIT, signal.SIGUSR1, signal.SIGUSR2)
# the notify socket and watchdog are the wrapper's, not llama.cpp's (sdnotify.child_env)
WRAPPER_ONLY_ENV = ("NOTIFY_SOCKET", "WATCHDOG_USEC", "WATCHDOG_PID")
_TIOCSCTTY = 0x540E  # termios.TIOCSCTTY on Linux, without importing termios on the pipe path
# The supervisor must outlive its child under the kernel's OOM killer: to remember the kill, restore the
# terminal and give the exit code. The child's oom_score_adj is the supervisor's plus this (at most 1000): in a
# memory cgroup (a unit's MemoryMax=, a container) llama.cpp is chosen before safe-llama even while it is still
# small. A supervisor at -1000 (OOM_SCORE_ADJ_MIN: never killed; the shipped unit's OOMScoreAdjust=) gives its
# child 0 instead: a process the killer may not take that holds gigabytes makes it take everything else.
CHILD_OOM_SCORE_RAISE = 100
_NEVER_KILLED = -1000
_OOM_SCORE_ADJ = "/proc/self/oom_score_adj"


def forwardable() -> tuple[int, ...]:
    # A signal the wrapper was started with ignored (nohup's SIGHUP) stays ignored: the child inherits
    # that, and there is nothing to forward.
    return tuple(s for s in FORWARDED if signal.getsignal(s) != signal.SIG_IGN)


def watched_signals(pty_mode: bool) -> list[int]:
    """What the supervisor reads from its signalfd: the forwarded ones and job control (and SIGWINCH for a pty)."""
    watched = [*forwardable(), signal.SIGCHLD, signal.SIGCONT, signal.SIGTSTP]
    return [*watched, signal.SIGWINCH] if pty_mode else watched


def block_watched(pty_mode: bool) -> tuple[list[int], set[int]]:
    """Block the watched signals (and SIGTTOU: tcsetpgrp() and terminal writes from the background are
    allowed then); the watched list and the mask as it was."""
    watched = watched_signals(pty_mode)
    return watched, signal.pthread_sigmask(signal.SIG_BLOCK, [*watched, signal.SIGTTOU])


def restore_mask(mask: set[int]) -> None:
    signal.pthread_sigmask(signal.SIG_SETMASK, mask)


def supervised_env(env: Mapping[str, str], extra: Mapping[str, str], parent: int) -> dict[str, str]:
    """The child's environment: the wrapper's without its systemd variables, the plan's changes, the guard."""
    out = {k: v for k, v in env.items() if k not in WRAPPER_ONLY_ENV}
    out.update(extra)
    out[GUARD_ENV] = str(parent)
    return out


def same_file(fd_a: int, fd_b: int) -> bool:
    """Two descriptors on one file (stdout and stderr both a terminal, or 2>&1): the child gets one pipe."""
    try:
        a, b = os.fstat(fd_a), os.fstat(fd_b)
    except OSError:
        return False
    return (a.st_dev, a.st_ino) == (b.st_dev, b.st_ino)


def terminal_foreground(stdin_fd: int) -> int | None:
    """stdin a terminal where this process's group is in the foreground: that terminal (pipe mode gives the
    child's group the foreground, so the terminal's ^C and ^Z reach it alone)."""
    try:
        return stdin_fd if os.tcgetpgrp(stdin_fd) == os.getpgrp() else None
    except OSError:  # not a terminal, or not our controlling one
        return None


class Started:
    """A child started on pipes before the supervisor was imported (early.py), for channels.Child.adopt."""

    def __init__(
        self,
        pid: int,
        stdout_src: int,
        stderr_src: int | None,
        counters_before: dict[str, int],
        foreground: bool,
        mask_before: set[int],
    ) -> None:
        self.pid = pid
        self.stdout_src = stdout_src  # the read end of its stdout pipe (its stderr too when combined)
        self.stderr_src = stderr_src  # None: stdout and stderr are one file, read as one stream
        self.counters_before = counters_before  # the OOM counters read just before the fork
        self.foreground = foreground  # its group was made the terminal's foreground group
        self.mask_before = mask_before  # the signal mask before the watched signals were blocked


class Proc:
    """The started child, as much of subprocess.Popen as the supervisor uses (pid, returncode, wait)."""

    def __init__(self, pid: int) -> None:
        self.pid = pid
        self.returncode: int | None = None

    def wait(self) -> int:
        if self.returncode is None:
            _, status = os.waitpid(self.pid, 0)
            self.returncode = os.waitstatus_to_exitcode(status)
        return self.returncode


def child_oom_score_adj() -> bytes | None:
    """What the child writes to its oom_score_adj: this process's value raised by CHILD_OOM_SCORE_RAISE
    (at most 1000), or 0 under a supervisor the killer never takes; None where there is none to read."""
    try:
        fd = os.open(_OOM_SCORE_ADJ, os.O_RDONLY)
    except OSError:
        return None
    try:
        own = int(os.read(fd, 16))
    except (OSError, ValueError):
        return None
    finally:
        os.close(fd)
    return str(0 if own == _NEVER_KILLED else min(own + CHILD_OOM_SCORE_RAISE, 1000)).encode()


def spawn(
    argv: Sequence[str],
    env: Mapping[str, str],
    fds: tuple[int | None, int, int],
    *,
    parent: int,
    controlling_tty: bool,
    foreground_fd: int | None,
) -> Proc:
    """Fork and exec argv (never through a shell) with fds as its 0, 1, 2 (None: its stdin left as this
    process's, as subprocess's stdin=None); OSError (with the exec's errno) when it could not be executed,
    with no child left behind.

    controlling_tty: the child leads a new session whose terminal is its stdin (the pty). Otherwise it gets
    a process group of its own, made the terminal's foreground group when foreground_fd is given (SIGTTOU
    is still blocked in the child then, so tcsetpgrp from the now-background group does not stop it).
    Call with no other thread running (the child runs Python until exec).
    """
    import ctypes  # the death signal has no os.* function

    prctl = ctypes.CDLL(None, use_errno=True).prctl
    program = os.fsencode(argv[0])
    args = [os.fsencode(a) for a in argv]
    envb = {os.fsencode(k): os.fsencode(v) for k, v in env.items()}
    max_fd = os.sysconf("SC_OPEN_MAX")
    oom_score = child_oom_score_adj()
    err_read, err_write = os.pipe2(os.O_CLOEXEC)
    pid = os.fork()
    if pid == 0:  # pragma: no cover -- the child: exec or _exit, never return
        try:
            _child(prctl, parent, fds, err_write, max_fd, controlling_tty, foreground_fd, oom_score)
            os.execve(program, args, envb)  # noqa: S606 -- argv as a list, never through a shell
        except BaseException as err:
            code = err.errno if isinstance(err, OSError) and err.errno else 0
            os.write(err_write, str(code).encode())
        os._exit(255)
    os.close(err_write)
    report = b""
    try:
        while chunk := os.read(err_read, 64):
            report += chunk
    finally:
        os.close(err_read)
    if report:
        os.waitpid(pid, 0)
        code = int(report) if report.isdigit() else 0
        raise OSError(code, os.strerror(code) if code else "the child's set-up failed")
    if not controlling_tty:
        try:  # noqa: SIM105 -- as a shell does: both sides, whichever runs first (no contextlib: light)
            os.setpgid(pid, pid)
        except OSError:
            pass
    return Proc(pid)


def high_pipe() -> tuple[int, int]:
    """A pipe whose ends are above 2, even when this process was started with 0, 1 or 2 closed."""
    ends = os.pipe()
    if min(ends) > 2:
        return ends
    import fcntl

    moved = (fcntl.fcntl(ends[0], fcntl.F_DUPFD_CLOEXEC, 3), fcntl.fcntl(ends[1], fcntl.F_DUPFD_CLOEXEC, 3))
    os.close(ends[0])
    os.close(ends[1])
    return moved


def spawn_on_pipes(
    argv: Sequence[str], env: Mapping[str, str], fds: tuple[int | None, int, int], foreground_fd: int | None
) -> tuple[Proc, int, int | None]:
    """spawn() in its own process group with stdout and stderr on pipes (one pipe when fds[1] and fds[2] are
    one file): the child, and the read ends of its stdout and stderr pipes (None: combined). OSError as spawn."""
    combined = same_file(fds[1], fds[2])
    out_src, out_sink = high_pipe()
    err_src, err_sink = (None, out_sink) if combined else high_pipe()
    try:
        proc = spawn(argv, env, (fds[0], out_sink, err_sink), parent=os.getpid(), controlling_tty=False,
                     foreground_fd=foreground_fd)  # fmt: skip
    except OSError:
        os.close(out_src)
        if err_src is not None:
            os.close(err_src)
        raise
    finally:
        os.close(out_sink)
        if err_sink != out_sink:
            os.close(err_sink)
    if foreground_fd is not None:
        try:  # noqa: SIM105 -- both sides, whichever runs first (the child's set-up does it too)
            os.tcsetpgrp(foreground_fd, proc.pid)
        except OSError:
            pass
    return proc, out_src, err_src


def kill_unseen(proc: Proc, out_src: int, err_src: int | None) -> None:
    """A child of spawn_on_pipes no longer wanted before any of its output was read: its process group killed,
    the child reaped, its pipes closed with whatever it wrote still in them (nothing of it reaches the user)."""
    try:  # noqa: SIM105 -- it may be gone already (the reap below takes its status either way)
        os.killpg(proc.pid, signal.SIGKILL)
    except OSError:
        pass
    proc.wait()
    os.close(out_src)
    if err_src is not None:
        os.close(err_src)


def _child(
    prctl: object,
    parent: int,
    fds: tuple[int | None, int, int],
    err_write: int,
    max_fd: int,
    controlling_tty: bool,
    foreground_fd: int | None,
    oom_score: bytes | None,
) -> None:  # pragma: no cover -- runs between fork and exec
    prctl(PR_SET_PDEATHSIG, int(signal.SIGKILL), 0, 0, 0)  # type: ignore[operator]
    if os.getppid() != parent:  # the wrapper died before prctl took effect
        os.kill(os.getpid(), signal.SIGKILL)
    if oom_score is not None:  # raising it needs no privilege; where it cannot be written, it stays as it is
        try:
            adj = os.open(_OOM_SCORE_ADJ, os.O_WRONLY)
            try:
                os.write(adj, oom_score)
            finally:
                os.close(adj)
        except OSError:
            pass
    if controlling_tty:
        os.setsid()
    # sources below 3 moved out of the way first, so one target's dup2 never overwrites another's source
    moved = [os.dup(fd) if fd is not None and fd < 3 and fd != target else fd for target, fd in enumerate(fds)]
    for target, fd in enumerate(moved):
        if fd is None:
            continue  # left as it is (it may be closed)
        if fd == target:
            os.set_inheritable(fd, True)
        else:
            os.dup2(fd, target)
    if controlling_tty:
        import fcntl

        fcntl.ioctl(0, _TIOCSCTTY, 0)
    else:
        os.setpgid(0, 0)
        if foreground_fd is not None:
            try:  # noqa: SIM105 -- no contextlib between fork and exec
                os.tcsetpgrp(foreground_fd, os.getpid())
            except OSError:
                pass
    os.closerange(3, err_write)
    os.closerange(err_write + 1, max_fd)
    # as subprocess's restore_signals: Python starts with SIGPIPE and SIGXFSZ ignored
    for signo in (signal.SIGPIPE, signal.SIGXFSZ):
        signal.signal(signo, signal.SIG_DFL)
    signal.pthread_sigmask(signal.SIG_SETMASK, [])  # the wrapper blocks signals it reads from signalfd
