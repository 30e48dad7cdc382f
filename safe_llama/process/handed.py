"""The handed supervisor: once llama-server is ready, the full safe-llama replaces itself (os.execv: the same pid,
so systemd's MainPID, the signals people send and the child's parent stay what they were) with this small
process, which supervises the child as the full one would from then on (steady.Steady), feeds systemd's
watchdog while /health answers 200, and hands back how the child ended.

Owns the hand-off's exec and its words (the child's pid, its output pipes as inherited fds, the OOM watch's
figures, the /health address: plain ints and strings, no secret), their reading (each word bounded and
validated), the signals read through a wake-up pipe, and the watchdog's schedule (health.Check asks /health).
Must stay light (os, sys, signal; steady, relay, fork_exec, signals, channels, sdnotify, health): it runs
while llama-server does. Must not decide whether to hand off nor what the child's end means (the caller's).
"""

from __future__ import annotations

import math
import os
import signal
import stat
import sys
import time

from safe_llama.process import health
from safe_llama.process.channels import Child
from safe_llama.process.fork_exec import Proc, watched_signals
from safe_llama.process.health import Health
from safe_llama.process.relay import Stream, pipe_relay
from safe_llama.process.sdnotify import Notifier
from safe_llama.process.steady import Steady

TYPE_CHECKING = False  # typing.TYPE_CHECKING without importing typing (mypy reads the name)
if TYPE_CHECKING:
    from collections.abc import Callable, Mapping, Sequence

    from safe_llama.device.probe_host import OomWatch

# How the small process starts: -S (no site: it needs the standard library and its own package only, and a site
# whose .pth files import more would grow every supervisor; the end's imports are standard library too), -P (the
# working directory is not on its path), the folder that holds the package the full process runs added where it is
# not there already, then entry.handed (the door), which reads the words after the folder.
CODE = (
    "import sys\n"
    "if sys.argv[1] not in sys.path: sys.path.insert(0, sys.argv[1])\n"
    "from safe_llama.entry import handed; handed()"
)
MOST_WORDS = 64
MOST_COUNTERS = 16
MOST_TEXT = 4096  # one word's value: a path, a counter's name
END = "--"  # the hand-off's own words end here; the caller's follow (attempts/handoff.py's ending_words)


class HandOff:
    """What the full supervisor knows that the handed one needs, taken the moment it hands off."""

    def __init__(
        self,
        pid: int,
        tool: str,
        sources: Sequence[int | None],
        kill_after: float,
        last_forward: tuple[int, float],
        watch: OomWatch,
        mask_before: set[int],
    ) -> None:
        self.pid = pid
        self.tool = tool  # the binary's name, for the lines said of it
        self.sources = list(sources)  # the read ends of its stdout and stderr pipes (one: combined; None: closed)
        self.kill_after = kill_after
        self.last_forward = last_forward  # the last signal forwarded, and when (a duplicate is merged)
        self.watch = watch
        self.mask_before = mask_before  # the signal mask before supervision began, restored at its end


def words(hand_off: HandOff, address: Health | None, start: Sequence[str] = ()) -> list[str]:
    """The hand-off's words (see read_words); start: those of a hand-off at the spawn (attempts/at_spawn.py)."""
    watch = hand_off.watch
    out = [
        f"pid={hand_off.pid}",
        f"tool={hand_off.tool}",
        *(f"source={'-' if fd is None else fd}" for fd in hand_off.sources),
        f"kill_after={hand_off.kill_after!r}",
        f"last_forward={hand_off.last_forward[0]}:{hand_off.last_forward[1]!r}",
        f"mask={','.join(str(int(s)) for s in sorted(hand_off.mask_before)) or '-'}",
        f"since={watch.since!r}",
        *(f"counter={value}={name}" for name, value in sorted(watch.counters.items())),
    ]
    if watch.group is not None and watch.group_counter is not None:
        out += [f"group={watch.group}", f"group_counter={watch.group_counter}"]
    if address is not None:
        out.append(f"health_path={address.path}")
        if address.unix_socket is not None:
            out.append(f"health_unix={address.unix_socket}")
        else:
            out += [f"health_host={address.host}", f"health_port={address.port}"]
    return out + list(start)


def exec_handed(hand_off: HandOff, address: Health | None, ending: Sequence[str], start: Sequence[str] = ()) -> None:
    """Replace this process with the handed supervisor (never returns), the child's output pipes inherited for
    the exec alone; returns only when the exec failed or the small process would refuse its words (read here
    first, as it reads them), everything as it was. start: a hand-off at the spawn's own words (words())."""
    package = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    flags = [flag for flag, on in (("-E", sys.flags.ignore_environment), ("-s", sys.flags.no_user_site)) if on]
    own = words(hand_off, address, start)
    try:
        read_words(own)
    except ValueError:
        return
    argv = [sys.executable, *flags, "-S", "-P", "-c", CODE, package, *own, END, *ending]
    sources = [fd for fd in hand_off.sources if fd is not None]
    for stream in (sys.stdout, sys.stderr):
        try:  # noqa: SIM105 -- what safe-llama wrote is out before the exec
            stream.flush()
        except (OSError, ValueError):
            pass
    try:
        for fd in sources:
            os.set_inheritable(fd, True)
        os.execv(sys.executable, argv)  # noqa: S606 -- argv as a list, never through a shell
    except OSError:
        for fd in sources:
            os.set_inheritable(fd, False)


# ---------------------------------------------------------------------------------------------------
# the small process
# ---------------------------------------------------------------------------------------------------


class Handed:
    """The hand-off's words, read and checked."""

    def __init__(self) -> None:
        self.pid = 0
        self.tool = ""
        self.sources: list[int | None] = []
        self.kill_after = 0.0
        self.last_forward: tuple[int, float] = (0, 0.0)
        self.mask_before: set[int] = set()
        self.since = 0.0
        self.counters: dict[str, int] = {}
        self.group: str | None = None
        self.group_counter: str | None = None
        self.health: Health | None = None
        # handed off as it started (attempts/at_spawn.py): watched until ready (starting.py), what to say then, and
        # the ready actions prepared (each FINAL, whose FINAL.at-ready is put in place)
        self.start = False
        self.status = ""
        self.at_ready: list[str] = []


def _number(name: str, text: str, kind: type[int] | type[float], low: float, high: float) -> float:
    try:
        value = kind(text)
    except ValueError:
        raise ValueError(f"the hand-off's {name} is not a number: {text[:40]!r}") from None
    if not (math.isfinite(value) and low <= value <= high):
        raise ValueError(f"the hand-off's {name} is out of range: {text[:40]!r}")
    return value


def _text(name: str, text: str) -> str:
    if not (0 < len(text) <= MOST_TEXT and text.isprintable()):
        raise ValueError(f"the hand-off's {name} is empty, too long or not printable")
    return text


def _path(name: str, text: str) -> str:
    if not os.path.isabs(_text(name, text)):
        raise ValueError(f"the hand-off's {name} is not an absolute path: {text[:80]!r}")
    return text


def _child_pid(text: str) -> int:
    pid = int(_number("pid", text, int, 2, 1 << 22))
    try:  # WNOWAIT: a child that has ended stays to be reaped by the loop
        os.waitid(os.P_PID, pid, os.WEXITED | os.WSTOPPED | os.WCONTINUED | os.WNOHANG | os.WNOWAIT)
    except ChildProcessError:
        raise ValueError(f"the hand-off's pid {pid} is not this process's child") from None
    return pid


def _source(text: str) -> int | None:
    if text == "-":
        return None
    fd = int(_number("source", text, int, 3, 1 << 20))
    try:
        is_pipe = stat.S_ISFIFO(os.fstat(fd).st_mode)
    except OSError:
        is_pipe = False
    if not is_pipe:
        raise ValueError(f"the hand-off's source {fd} is not an open pipe")
    return fd


def read_words(given: Sequence[str]) -> Handed:
    """The words exec_handed wrote, each checked: ValueError (one line naming the word) otherwise."""
    if len(given) > MOST_WORDS:
        raise ValueError(f"the hand-off has {len(given)} words (at most {MOST_WORDS})")
    handed = Handed()
    seen: set[str] = set()
    host, port, path, unix = "", 0, "", None
    for word in given:
        name, eq, value = word.partition("=")
        if not eq:
            raise ValueError(f"the hand-off's word {word[:40]!r} is not NAME=VALUE")
        if name in seen and name not in ("source", "counter", "at_ready"):
            raise ValueError(f"the hand-off names {name} twice")
        seen.add(name)
        if name == "pid":
            handed.pid = _child_pid(value)
        elif name == "tool":
            handed.tool = _text(name, value)
        elif name == "source" and len(handed.sources) < 2:
            handed.sources.append(_source(value))
        elif name == "kill_after":
            handed.kill_after = _number(name, value, float, 0.0, 3600.0)
        elif name == "last_forward":
            signo, _, at = value.partition(":")
            handed.last_forward = (int(_number(name, signo, int, 0, 64)), _number(name, at, float, 0.0, 1e12))
        elif name == "mask":
            signos = [] if value == "-" else value.split(",")
            handed.mask_before = {int(_number(name, s, int, 1, 64)) for s in signos[:64]}
        elif name == "since":
            handed.since = _number(name, value, float, 0.0, 1e12)
        elif name == "counter" and len(handed.counters) < MOST_COUNTERS:
            count, _, counter = value.partition("=")
            handed.counters[_text(name, counter)] = int(_number(name, count, int, 0, 1 << 62))
        elif name == "group":
            handed.group = _path(name, value)
        elif name == "group_counter":
            handed.group_counter = _text(name, value)
        elif name == "health_path":
            path = _text(name, value)
        elif name == "health_unix":  # as llama-server was given it: relative to the same working directory
            unix = _text(name, value)
        elif name == "health_host":
            host = _text(name, value)
        elif name == "health_port":
            port = int(_number(name, value, int, 1, 65535))
        elif name == "start" and value == "1":
            handed.start = True
        elif name == "status":
            handed.status = _text(name, value)
        elif name == "at_ready" and len(handed.at_ready) < 2:
            handed.at_ready.append(_path(name, value))
        else:
            raise ValueError(f"the hand-off's word {name[:40]!r} is not one it knows (or one too many)")
    if not handed.pid or not handed.tool or not handed.sources or "kill_after" not in seen:
        raise ValueError("the hand-off lacks the child's pid, its name, its output or kill_after")
    if path:
        handed.health = Health(path, unix, host, port)
    if handed.start and (handed.health is None or not handed.status):
        raise ValueError("the hand-off at the spawn lacks the /health address or the status to say when ready")
    return handed


class WakeupSignals:
    """The watched signals through a wake-up pipe (signal.set_wakeup_fd: a byte, the signal's number, each time
    one comes), where supervise.py reads a signalfd. They came blocked across the exec: unblocked only once
    their handlers are set, so none is lost or acted on by default."""

    def __init__(self, signals: Sequence[int]) -> None:
        self.signals = list(signals)
        self.fd, self._write_fd = os.pipe()
        os.set_blocking(self.fd, False)
        os.set_blocking(self._write_fd, False)
        for signo in self.signals:
            signal.signal(signo, _noted)
        signal.set_wakeup_fd(self._write_fd, warn_on_full_buffer=False)
        signal.pthread_sigmask(signal.SIG_UNBLOCK, self.signals)

    def read(self) -> list[int]:
        signos: list[int] = []
        while True:
            try:
                data = os.read(self.fd, 512)
            except BlockingIOError:
                return signos
            if not data:
                return signos
            signos.extend(data)

    def close(self, mask_before: set[int]) -> None:
        """The signals as the full supervisor leaves them: their default actions, the mask as it was."""
        signal.set_wakeup_fd(-1)
        for signo in self.signals:
            signal.signal(signo, signal.default_int_handler if signo == signal.SIGINT else signal.SIG_DFL)
        signal.pthread_sigmask(signal.SIG_SETMASK, mask_before)
        os.close(self.fd)
        os.close(self._write_fd)


def _noted(signo: int, frame: object) -> None:
    """A watched signal's handler: the wake-up byte says it."""


class Watched(Steady):
    """Steady, with systemd's watchdog fed every interval while /health answers 200 (ReadyActions' duty in the
    full supervisor): the first check at once, the next `interval` seconds after each one ends."""

    ready = True  # the child serves (a child handed off as it started: once starting.Starting says so)

    def __init__(self, child: Child, kill_after: float, notifier: Notifier, address: Health | None) -> None:
        super().__init__(child, kill_after)
        self.notifier = notifier
        self.address = address
        self.interval = notifier.watchdog_interval if address is not None else None
        self.next_check = time.monotonic()
        self.check: health.Check | None = None

    def extra_fds(self) -> dict[int, int]:
        if self.check is None or self.check.sock is None:
            return {}
        return {self.check.sock.fileno(): self.check.mask()}

    def on_event(self, fd: int, mask: int) -> None:
        if self.check is not None:
            self.check.event(time.monotonic())

    def deadlines(self, now: float) -> list[float]:
        if self.interval is None:
            return []
        return [self.next_check if self.check is None else self.check.deadline]

    def timers(self, now: float) -> None:
        super().timers(now)
        if self.interval is None or self.address is None:
            return
        if self.check is None and now >= self.next_check:
            self.check = health.Check(self.address, now, health.TIMEOUT)
        if self.check is not None and not self.check.done and now >= self.check.deadline:
            self.check.finish()
        if self.check is not None and self.check.done:
            if self.check.status == 200:
                self.notifier.watchdog()
            self.check = None
            self.next_check = time.monotonic() + self.interval

    def close(self) -> None:
        if self.check is not None:
            self.check.finish()
            self.check = None
        self.notifier.close()
        if self.child.proc is not None and self.returncode is None:
            # Leaving on an exception: the child must not outlive the loop that relays its output (as supervise.py).
            try:  # noqa: SIM105 -- no contextlib: light
                os.kill(self.child.proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            self.returncode = self.child.proc.wait()
        self.child.close()


def supervise(
    handed: Handed,
    env: Mapping[str, str],
    say: Callable[[str], None],
    watched: Callable[[Child, float, Notifier, Health | None], Watched] = Watched,
) -> Watched:
    """Supervise the handed child until it has ended and its output is passed on; the supervisor, for its end.
    say: where a stop of the child and its SIGCONT are said (as the full supervisor says them); watched: the
    supervisor's kind (a child handed off as it started: starting.Starting)."""
    child = Child([handed.tool], {}, use_pty=False, fds=(0, 1, 2))
    child.proc = Proc(handed.pid)
    streams = (Stream.STDOUT, Stream.STDERR) if len(handed.sources) == 2 else (Stream.COMBINED,)
    for src, sink, stream in zip(handed.sources, (1, 2), streams, strict=False):
        if src is not None:
            child.relays.append(pipe_relay(src, sink, stream))
    steady = watched(child, handed.kill_after, Notifier(env), handed.health)
    steady.last_forward = handed.last_forward
    steady.say = say
    wakeup = WakeupSignals(watched_signals(False))
    try:
        steady.loop(wakeup)
    finally:
        wakeup.close(handed.mask_before)
        steady.close()
    return steady
