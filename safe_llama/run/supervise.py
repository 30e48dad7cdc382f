"""Launching and supervising one llama.cpp child: its terminal or pipes, its signals, its start-up.

Owns the child process, the pty, signal forwarding, the byte relay and readiness probing; the only module
that starts llama.cpp for real work. Must not decide policy (what a line means is signatures.py's, whether
to retry is the caller's) and must never alter, delay or hold back a byte the child writes.

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
"""

from __future__ import annotations

import codecs
import contextlib
import ctypes
import enum
import errno
import fcntl
import os
import re
import select
import signal
import socket
import stat
import struct
import subprocess
import termios
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

from safe_llama.device.probe_host import oom_counters, oom_evidence
from safe_llama.device.proc import GUARD_ENV
from safe_llama.errors import ExitStatus, SafeLlamaError
from safe_llama.run.signatures import ESCAPES, Failure, Match, Scanner, SignatureTable, classify

if TYPE_CHECKING:
    import http.client  # imported by the first health check: cli and completion never need it

# Set in the child's environment; a safe-llama that finds it was started by safe-llama as "llama.cpp".

FORWARDED = (signal.SIGTERM, signal.SIGHUP, signal.SIGINT, signal.SIGQUIT, signal.SIGUSR1, signal.SIGUSR2)
STOP_SIGNALS = frozenset({signal.SIGTERM, signal.SIGHUP, signal.SIGINT, signal.SIGQUIT})

PR_SET_PDEATHSIG = 1
READ_SIZE = 1 << 16
HIGH_WATER = 1 << 20  # stop reading a source while this much of its output waits for the reader
# The same signal again this soon is one request sent twice (coreutils `timeout` signals its child, then
# its own group): merged, as the kernel merges a signal that is still pending. A person's second ^C or
# second `kill` comes later and is forwarded.
COALESCE = 0.1
DRAIN_IDLE = 0.25  # after the child exits: give up on pipes a grandchild keeps open after this quiet time
_LISTENING = re.compile(r"listening on https?://\S+:(\d+)")
# llama-server's own word that /health now answers 200 (tools/server/server.cpp, right after is_ready):
# `srv  llama_server: model loaded`. A server stopped a moment later was still ready.
_MODEL_LOADED = re.compile(r"srv +\w+: model loaded$", re.MULTILINE)


class Stream(enum.Enum):
    STDOUT = "stdout"
    STDERR = "stderr"
    COMBINED = "combined"  # stdout and stderr interleaved in one channel: a pty, or 2>&1


class Verdict(enum.Enum):
    CONTINUE = "continue"
    STOP_FAILED = "stop_failed"  # an allocation failure was printed: stop the child, report a failure


class Watcher(Protocol):
    """Sees the child's output during start-up. Called with every chunk, after it was passed on."""

    def output(self, stream: Stream, data: bytes) -> Verdict: ...

    def ready(self) -> None:
        """Start-up is over: output() will not be called again."""

    def conclude(self, returncode: int | None, oom_evidence: str | None = None) -> Failure | None:
        """The child ended before readiness (returncode None: we stopped it): what failed, if anything.
        oom_evidence: the memory counter that rose while it ran, if one did."""


class ReadinessProbe(Protocol):
    """Decides when start-up is over, from the output, from polling, or both."""

    def output(self, stream: Stream, data: bytes) -> bool:
        """True once this chunk shows the child is ready."""

    def poll_interval(self) -> float | None:
        """Seconds between check() calls from a helper thread; None: never call check()."""

    def check(self) -> bool:
        """A blocking readiness check (the HTTP /health request); True when ready."""


@dataclass(frozen=True)
class Outcome:
    """How one child run ended, and what the wrapper should do about it."""

    exit_code: int  # what the wrapper should exit with: the child's N, or 128+N for death by signal N
    returncode: int  # subprocess's convention: N, or -N for death by signal N
    ready: bool  # start-up finished (after that nothing was scanned, nothing may be retried)
    failure: Failure | None  # why start-up failed; None if ready, clean, or stopped by the user
    stopped_by_us: bool  # we signalled the child because of a STOP_FAILED verdict
    user_stop_signal: int | None  # SIGTERM/SIGHUP/SIGINT/SIGQUIT the user sent: never retry
    signals_forwarded: tuple[int, ...]  # every signal passed on to the child, in order
    pid: int
    used_pty: bool

    @property
    def retry(self) -> bool:
        """The one question of the retry loop: did start-up fail for lack of memory?"""
        return self.failure is not None and self.failure.memory and self.user_stop_signal is None


def exit_code_for(returncode: int) -> int:
    """tini/dumb-init semantics: exit(N) gives N, death by signal N gives 128+N."""
    return 128 - returncode if returncode < 0 else returncode


# ---------------------------------------------------------------------------------------------------
# Watchers and probes
# ---------------------------------------------------------------------------------------------------


class SignatureWatcher:
    """Scans start-up output for error signatures (one line scanner per stream).

    Answers STOP_FAILED at the first allocation failure: the child may go on running after one (the
    OpenVINO GPU plugin does) and then cannot serve.
    """

    def __init__(self, table: SignatureTable) -> None:
        self._table = table
        self._scanners: dict[Stream, Scanner] = {}
        self.matches: list[Match] = []

    def output(self, stream: Stream, data: bytes) -> Verdict:
        scanner = self._scanners.get(stream)
        if scanner is None:
            scanner = self._scanners[stream] = Scanner(self._table)
        found = scanner.feed(data)
        self.matches.extend(found)
        return Verdict.STOP_FAILED if any(m.category == "alloc" for m in found) else Verdict.CONTINUE

    def ready(self) -> None:
        self._scanners.clear()

    def conclude(self, returncode: int | None, oom_evidence: str | None = None) -> Failure | None:
        for scanner in self._scanners.values():
            self.matches.extend(scanner.close())
        self._scanners.clear()
        return classify(self.matches, returncode, oom_evidence=oom_evidence)


class _CleanText:
    """A byte stream as text without colours or \\r, chunk by chunk (an escape split across chunks waits)."""

    def __init__(self) -> None:
        self._decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
        self._held = ""

    def push(self, data: bytes) -> str:
        text = self._held + self._decoder.decode(data)
        self._held = ""
        escape = text.rfind("\x1b")
        if escape >= 0 and len(text) - escape < 32 and not ESCAPES.match(text, escape):
            text, self._held = text[:escape], text[escape:]
        return ESCAPES.sub("", text).replace("\r", "")


class _Tail:
    """Recent clean text, enough to find a marker that a chunk boundary cut in two."""

    def __init__(self, keep: int) -> None:
        self._text = _CleanText()
        self._keep = keep
        self._tail = ""

    def push(self, data: bytes) -> str:
        """The kept tail followed by this chunk's text."""
        return self.add(self._text.push(data))

    def add(self, text: str) -> str:
        seen = self._tail + text
        self._tail = seen[-self._keep :]
        return seen


class PromptProbe:
    """llama-cli: ready when its `> ` prompt follows the `available commands:` banner.

    llama-cli prints the banner only after its in-process server answered /health, so every allocation
    is behind it. The prompt is `\\n> ` (colours around it on a terminal).
    """

    BANNER = "available commands:"

    def __init__(self) -> None:
        self._before = _Tail(keep=len(self.BANNER))
        self._after: _Tail | None = None

    def output(self, stream: Stream, data: bytes) -> bool:
        if stream is Stream.STDERR:
            return False
        if self._after is not None:
            return "\n> " in self._after.push(data)
        seen = self._before.push(data)
        at = seen.find(self.BANNER)
        if at < 0:
            return False
        self._after = _Tail(keep=2)
        return "\n> " in self._after.add(seen[at + len(self.BANNER) :])

    def poll_interval(self) -> float | None:
        return None

    def check(self) -> bool:
        return False


class GenerationProbe:
    """llama-completion: ready once generation has begun.

    Everything llama-completion allocates for start-up (weights, KV, compute buffers) is allocated when
    its context is created, and nothing reaches stdout before that: the prompt echo and the tokens come
    after. So the first byte on stdout (pipes) means ready. Where stdout and stderr share one channel (a
    pty), the log lines printed right after the context exists are used instead.
    """

    MARKERS = ("generate: n_ctx = ", "sampler seed: ")

    def __init__(self) -> None:
        self._tail = _Tail(keep=32)

    def output(self, stream: Stream, data: bytes) -> bool:
        if stream is Stream.STDOUT:
            return bool(data)
        seen = self._tail.push(data)
        return any(marker in seen for marker in self.MARKERS)

    def poll_interval(self) -> float | None:
        return None

    def check(self) -> bool:
        return False


def _unix_socket(path: str, timeout: float) -> socket.socket:
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.settimeout(timeout)
    try:
        sock.connect(path)
    except OSError:
        sock.close()
        raise
    return sock


@dataclass
class HealthProbe:
    """llama-server: ready when it logs `model loaded`, or when GET {prefix}/health answers 200 (503 while
    the model loads), whichever comes first.

    With --port 0 the port is learnt from the `listening on http://HOST:PORT` line.
    """

    host: str = "127.0.0.1"
    port: int = 8080  # 0: not known yet
    path: str = "/health"
    https: bool = False
    unix_socket: str | None = None
    interval: float = 0.2
    timeout: float = 1.0
    _tail: _Tail = field(default_factory=lambda: _Tail(keep=128), init=False, repr=False, compare=False)

    def output(self, stream: Stream, data: bytes) -> bool:
        seen = self._tail.push(data)
        if self.port == 0 and self.unix_socket is None:
            found = _LISTENING.search(seen)
            if found is not None:
                self.port = int(found.group(1))
        return _MODEL_LOADED.search(seen) is not None

    def poll_interval(self) -> float | None:
        return self.interval

    def _connection(self) -> http.client.HTTPConnection:
        import http.client

        if self.unix_socket is not None:
            conn = http.client.HTTPConnection("localhost", timeout=self.timeout)
            conn.sock = _unix_socket(self.unix_socket, self.timeout)  # a connection given its socket uses it
            return conn
        if self.https:
            import ssl

            # The server's own certificate, on this machine: only its answer matters, not its identity.
            context = ssl.create_default_context()
            context.check_hostname = False
            context.verify_mode = ssl.CERT_NONE
            return http.client.HTTPSConnection(self.host, self.port, timeout=self.timeout, context=context)
        return http.client.HTTPConnection(self.host, self.port, timeout=self.timeout)

    def check(self) -> bool:
        import http.client

        if self.port == 0 and self.unix_socket is None:
            return False
        try:
            conn = self._connection()
        except OSError:
            return False
        try:
            conn.request("GET", self.path, headers={"Connection": "close"})
            response = conn.getresponse()
            response.read()
            return response.status == 200
        except (OSError, http.client.HTTPException):
            return False
        finally:
            conn.close()


def _last_value(argv: Sequence[str], *flags: str) -> str | None:
    """The value of the last occurrence of a flag (llama.cpp lets a later one win)."""
    value = None
    for i, arg in enumerate(argv[:-1]):
        if arg in flags:
            value = argv[i + 1]
    return value


def server_probe(argv: Sequence[str], env: Mapping[str, str]) -> HealthProbe:
    """A /health probe for the host, port and API prefix a llama-server argv/env will listen on.

    A flag on the command line beats its LLAMA_ARG_* twin; wildcard addresses are probed on loopback.
    """
    host = _last_value(argv, "--host") or env.get("LLAMA_ARG_HOST") or "127.0.0.1"
    port = _last_value(argv, "--port") or env.get("LLAMA_ARG_PORT") or "8080"
    prefix = _last_value(argv, "--api-prefix") or env.get("LLAMA_ARG_API_PREFIX") or ""
    key = _last_value(argv, "--ssl-key-file") or env.get("LLAMA_ARG_SSL_KEY_FILE")
    cert = _last_value(argv, "--ssl-cert-file") or env.get("LLAMA_ARG_SSL_CERT_FILE")
    first = next((h.strip() for h in host.split(",") if h.strip()), "127.0.0.1")
    path = prefix.rstrip("/") + "/health"
    if first.endswith(".sock"):
        return HealthProbe(unix_socket=first, path=path)
    first = first.strip("[]")
    loopback = {"0.0.0.0": "127.0.0.1", "": "127.0.0.1", "::": "::1"}  # noqa: S104 - mapping, not binding
    try:
        port_number = int(port)
    except ValueError:
        port_number = 8080  # llama.cpp itself refuses such a port; the probe will never answer
    return HealthProbe(host=loopback.get(first, first), port=port_number, path=path, https=bool(key and cert))


def probe_for(tool: str, argv: Sequence[str], env: Mapping[str, str]) -> ReadinessProbe:
    """The readiness probe of a llama.cpp tool: "server", "cli" or "completion"."""
    if tool == "server":
        return server_probe(argv, env)
    if tool == "cli":
        return PromptProbe()
    if tool == "completion":
        return GenerationProbe()
    raise ValueError(f"unknown llama.cpp tool: {tool}")


# ---------------------------------------------------------------------------------------------------
# Never finding ourselves as the llama.cpp binary (binaries.py compares real paths; this catches a
# PATH shim script that runs safe-llama again)
# ---------------------------------------------------------------------------------------------------


def check_not_nested(env: Mapping[str, str]) -> None:
    """Refuse to run when a safe-llama started this process as its llama.cpp (a PATH shim script)."""
    if GUARD_ENV in env:
        raise SafeLlamaError(
            f"safe-llama: started by safe-llama (pid {env[GUARD_ENV]}) in place of llama.cpp: "
            "a llama.cpp name on PATH leads back to safe-llama",
            ExitStatus.NOT_FOUND,
        )


# ---------------------------------------------------------------------------------------------------
# The OS side: signalfd, terminal, sinks
# ---------------------------------------------------------------------------------------------------

_libc = ctypes.CDLL(None, use_errno=True)
_SIGINFO = struct.Struct("=Iii")  # ssi_signo, ssi_errno, ssi_code: the head of struct signalfd_siginfo
_SIGINFO_SIZE = 128


@dataclass(frozen=True)
class _SigInfo:
    signo: int
    code: int  # SI_USER for kill(), SI_KERNEL (0x80) for the tty driver's


class _SignalFd:
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

    def read(self) -> list[_SigInfo]:
        infos: list[_SigInfo] = []
        while True:
            try:
                data = os.read(self.fd, _SIGINFO_SIZE * 16)
            except BlockingIOError:
                return infos
            for offset in range(0, len(data) - _SIGINFO_SIZE + 1, _SIGINFO_SIZE):
                signo, _err, code = _SIGINFO.unpack_from(data, offset)
                infos.append(_SigInfo(signo, code))

    def close(self) -> None:
        os.close(self.fd)


def _raw_attrs(attrs: list[Any]) -> list[Any]:
    """cfmakeraw(): no echo, no line editing, no signals from keys, no output processing, 8-bit."""
    raw = list(attrs)
    iflag, oflag, cflag, lflag = (int(raw[i]) for i in range(4))
    iflag &= ~(
        termios.IGNBRK
        | termios.BRKINT
        | termios.PARMRK
        | termios.ISTRIP
        | termios.INLCR
        | termios.IGNCR
        | termios.ICRNL
        | termios.IXON
    )
    oflag &= ~termios.OPOST
    lflag &= ~(termios.ECHO | termios.ECHONL | termios.ICANON | termios.ISIG | termios.IEXTEN)
    cflag = (cflag & ~(termios.CSIZE | termios.PARENB)) | termios.CS8
    cc = list(raw[6])
    cc[termios.VMIN] = 1
    cc[termios.VTIME] = 0
    raw[0:4] = [iflag, oflag, cflag, lflag]
    raw[6] = cc
    return raw


class _Terminal:
    """The user's terminal in pty mode: raw while the child runs, restored on every way out."""

    def __init__(self, in_fd: int, out_fd: int) -> None:
        self.in_fd = in_fd
        self.out_fd = out_fd
        self.saved: list[Any] = termios.tcgetattr(in_fd)
        self._raw = False

    def window_size(self) -> bytes:
        return fcntl.ioctl(self.out_fd, termios.TIOCGWINSZ, b"\0" * 8)

    def make_raw(self) -> None:
        termios.tcsetattr(self.in_fd, termios.TCSADRAIN, _raw_attrs(self.saved))
        self._raw = True

    def restore(self) -> None:
        if self._raw:
            self._raw = False
            termios.tcsetattr(self.in_fd, termios.TCSADRAIN, self.saved)


class _Sink:
    """Where a relay writes: never blocks the loop, never changes a file description others share.

    O_NONBLOCK on an inherited descriptor would leak into the shell that shares it, so pipes and
    terminals are reopened through /proc/self/fd (a private description of the same pipe or tty) and
    sockets are written with MSG_DONTWAIT. Regular files do not block and are written as they are.
    """

    def __init__(self, fd: int, *, private: bool = True) -> None:
        self.fd = fd
        self._own_fd: int | None = None
        self._sock: socket.socket | None = None
        if not private:
            return
        try:
            mode = os.fstat(fd).st_mode
        except OSError:
            return
        if stat.S_ISFIFO(mode) or stat.S_ISCHR(mode):
            with contextlib.suppress(OSError):
                self._own_fd = os.open(f"/proc/self/fd/{fd}", os.O_WRONLY | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC)
                self.fd = self._own_fd
        elif stat.S_ISSOCK(mode):
            with contextlib.suppress(OSError):
                self._sock = socket.socket(fileno=os.dup(fd))

    def write(self, data: memoryview) -> int:
        """Bytes written (0 if the reader is full). Raises OSError (EPIPE, EIO, ...) if it is gone."""
        try:
            if self._sock is not None:
                return self._sock.send(data, socket.MSG_DONTWAIT)
            return os.write(self.fd, data)
        except BlockingIOError:
            return 0

    def close(self) -> None:
        if self._own_fd is not None:
            os.close(self._own_fd)
            self._own_fd = None
        if self._sock is not None:
            self._sock.close()
            self._sock = None


class _Relay:
    """One direction of bytes: a source fd, a sink, and what the sink has not taken yet."""

    def __init__(self, src: int, sink: _Sink, stream: Stream | None, *, owns_src: bool) -> None:
        self.src: int | None = src
        self.sink = sink
        self.stream = stream  # None: the user's input going to the child, never scanned
        self.owns_src = owns_src  # False for fds closed elsewhere: the user's stdin, the pty master
        self.queue = bytearray()
        self.broken = False  # the sink is gone: drop what comes

    def close_src(self) -> None:
        if self.src is not None and self.owns_src:
            os.close(self.src)
        self.src = None

    def push(self, data: bytes) -> None:
        """Pass data on now if the sink takes it, queue the rest (order kept)."""
        if self.broken:
            return
        if not self.queue:
            data = data[self._write(memoryview(data)) :]
        if not self.broken:
            self.queue += data

    def flush(self) -> None:
        if self.queue and not self.broken:
            with memoryview(self.queue) as view:  # released before the queue is resized
                written = self._write(view)
            if self.broken:
                self.queue.clear()
            else:
                del self.queue[:written]

    def _write(self, data: memoryview) -> int:
        total = 0
        try:
            while total < len(data):
                written = self.sink.write(data[total:])
                if written == 0:
                    break
                total += written
        except OSError:
            # The reader went away (EPIPE; EIO for a hung-up terminal). Closing our read end gives the
            # child its own EPIPE/SIGPIPE on its next write, as if it wrote there directly.
            self.broken = True
            self.close_src()
        return total


class _ProbeThread:
    """Runs a probe's blocking check() off the relay loop; a byte on a pipe says "ready"."""

    def __init__(self, probe: ReadinessProbe, interval: float) -> None:
        self._probe = probe
        self._interval = interval
        self._stop = threading.Event()
        self.read_fd, self._write_fd = os.pipe()
        self._thread = threading.Thread(target=self._run, name="safe-llama-readiness", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(self._interval):
            if self._probe.check():
                os.write(self._write_fd, b"r")
                return

    def halt(self) -> None:
        """Stop checking (an answer in flight is left to finish: the relay loop must not wait for it)."""
        self._stop.set()

    def close(self) -> None:
        self._stop.set()
        self._thread.join()
        os.close(self.read_fd)
        os.close(self._write_fd)


def _forwardable() -> tuple[int, ...]:
    # A signal the wrapper was started with ignored (nohup's SIGHUP) stays ignored: the child inherits
    # that, and there is nothing to forward.
    return tuple(s for s in FORWARDED if signal.getsignal(s) is not signal.SIG_IGN)


def _child_setup(parent: int, controlling_tty: bool, foreground_fd: int | None) -> Callable[[], None]:
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


def _is_stopped(pid: int) -> bool:
    """pid is stopped now (a stop already undone by a SIGCONT is not news)."""
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii", errors="replace") as f:
            return f.read().rsplit(")", 1)[1].split()[0] in ("T", "t")
    except (OSError, IndexError):
        return False


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


# ---------------------------------------------------------------------------------------------------
# launch()
# ---------------------------------------------------------------------------------------------------


class _Supervisor:
    def __init__(
        self,
        argv: list[str],
        env: dict[str, str],
        watcher: Watcher,
        probe: ReadinessProbe | None,
        use_pty: bool,
        fds: tuple[int, int, int],
        stop_grace: float,
        kill_after: float,
    ) -> None:
        self.argv, self.env, self.watcher, self.probe = argv, env, watcher, probe
        self.use_pty = use_pty
        self.stdin_fd, self.stdout_fd, self.stderr_fd = fds
        self.stop_grace, self.kill_after = stop_grace, kill_after
        self.forwardable = _forwardable()
        self.proc: subprocess.Popen[bytes] | None = None
        self.returncode: int | None = None
        self.relays: list[_Relay] = []
        self.input_relay: _Relay | None = None
        self.master: int | None = None
        self.terminal: _Terminal | None = None
        self.probe_thread: _ProbeThread | None = None
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
        self.counters_before: Mapping[str, int] = {}

    def _terminal_foreground(self) -> int | None:
        """Pipe mode, stdin a terminal where this process's group is in the foreground: that terminal."""
        if self.use_pty:
            return None
        try:
            return self.stdin_fd if os.tcgetpgrp(self.stdin_fd) == os.getpgrp() else None
        except OSError:  # not a terminal, or not our controlling one
            return None

    def _give_foreground(self) -> None:
        fd = self._terminal_foreground()
        if fd is not None and self.proc is not None and self.returncode is None:
            with contextlib.suppress(OSError):
                os.tcsetpgrp(fd, self.proc.pid)
                self.foreground_fd = fd

    def _take_foreground(self) -> None:
        if self.foreground_fd is not None:
            with contextlib.suppress(OSError):  # SIGTTOU is blocked: allowed from the background
                os.tcsetpgrp(self.foreground_fd, os.getpgrp())
            self.foreground_fd = None

    # -- spawning ------------------------------------------------------------------------------------

    def spawn(self) -> None:
        self.counters_before = self.memory_counters()
        foreground = self._terminal_foreground()
        setup = _child_setup(os.getpid(), controlling_tty=self.use_pty, foreground_fd=foreground)
        if self.use_pty:
            self._spawn_pty(setup)
        else:
            self._spawn_pipes(setup)
            assert self.proc is not None
            with contextlib.suppress(OSError):  # as a shell does: both sides, whichever runs first
                os.setpgid(self.proc.pid, self.proc.pid)
            if foreground is not None:
                self._give_foreground()

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

    def _spawn_pipes(self, setup: Callable[[], None]) -> None:
        combined = _same_file(self.stdout_fd, self.stderr_fd)
        self.proc = proc = self._popen(
            setup,
            stdin=None if self.stdin_fd == 0 else self.stdin_fd,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT if combined else subprocess.PIPE,
        )
        out_stream = Stream.COMBINED if combined else Stream.STDOUT
        self.relays.append(self._out_relay(_take_fd(proc, "stdout"), self.stdout_fd, out_stream))
        if not combined:
            self.relays.append(self._out_relay(_take_fd(proc, "stderr"), self.stderr_fd, Stream.STDERR))

    def _spawn_pty(self, setup: Callable[[], None]) -> None:
        self.terminal = terminal = _Terminal(self.stdin_fd, self.stdout_fd)
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
        self.relays.append(_Relay(master, _Sink(self.stdout_fd), Stream.COMBINED, owns_src=False))
        if not stderr_is_tty:
            self.relays.append(self._out_relay(_take_fd(proc, "stderr"), self.stderr_fd, Stream.STDERR))
        self.input_relay = _Relay(self.stdin_fd, _Sink(master, private=False), None, owns_src=False)
        terminal.make_raw()

    def _out_relay(self, src: int, dst: int, stream: Stream) -> _Relay:
        os.set_blocking(src, False)
        with contextlib.suppress(OSError):  # a bigger pipe: fewer wake-ups under heavy output
            fcntl.fcntl(src, fcntl.F_SETPIPE_SZ, HIGH_WATER)
        return _Relay(src, _Sink(dst), stream, owns_src=True)

    # -- the loop ------------------------------------------------------------------------------------

    def run(self, sigfd: _SignalFd) -> None:
        assert self.proc is not None
        if self.probe is not None:
            interval = self.probe.poll_interval()
            if interval is not None:
                self.probe_thread = _ProbeThread(self.probe, interval)
        while not self._finished():
            self._poll_once(sigfd)

    def _finished(self) -> bool:
        if self.returncode is None:
            return False
        sources_open = any(r.src is not None and r.stream is not None for r in self.relays)
        pending = any(r.queue and not r.broken for r in self.relays)
        return not sources_open and not pending

    def _poll_once(self, sigfd: _SignalFd) -> None:
        masks: dict[int, int] = {sigfd.fd: select.POLLIN}
        if self.probe_thread is not None:
            masks[self.probe_thread.read_fd] = select.POLLIN
        readers: dict[int, _Relay] = {}
        writers: dict[int, _Relay] = {}
        for relay in self._all_relays():
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
            for relay in self.relays:
                relay.close_src()

    def _all_relays(self) -> list[_Relay]:
        return [*self.relays, *([self.input_relay] if self.input_relay is not None else [])]

    def _timeout_ms(self) -> int:
        now = time.monotonic()
        deadlines: list[float] = []
        if self.returncode is None:
            if self.failing_since is not None and self.term_sent_at is None:
                deadlines.append(self.failing_since + self.stop_grace)
            if self.term_sent_at is not None and not self.kill_sent:
                deadlines.append(self.term_sent_at + self.kill_after)
        else:
            deadlines.append(now + DRAIN_IDLE)
        if not deadlines:
            return -1
        return max(0, int((min(deadlines) - now) * 1000) + 1)

    def _read(self, relay: _Relay, now: float) -> None:
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
                self.input_relay = None
            return
        if relay.stream is None:
            self._user_input(relay, data)
            return
        relay.push(data)
        if not self.ready:
            self._startup_output(relay.stream, data, now)

    def _user_input(self, relay: _Relay, data: bytes) -> None:
        """Keys go to the pty as they are, except the suspend key (^Z) while the child's pty makes signals.

        The child leads its own session, so the kernel discards a terminal SIGTSTP for it (an orphaned
        process group): the wrapper does what a shell's job control would, for both processes. ^C and ^\\
        pass through, and are remembered as the user's stop request.
        """
        keys = self._signal_keys()
        for key, signo in keys.items():
            if signo != signal.SIGTSTP and key in data and self.user_stop is None:
                self.user_stop = signo
        suspend = next((key for key, signo in keys.items() if signo == signal.SIGTSTP), None)
        while suspend is not None and suspend in data:
            before, _, data = data.partition(suspend)
            relay.push(before)
            self._suspend()
        relay.push(data)

    def _signal_keys(self) -> dict[bytes, int]:
        """The keys the child's pty turns into signals now (none when the child put it in raw mode)."""
        if self.master is None:
            return {}
        try:
            attrs = termios.tcgetattr(self.master)  # on Linux, the slave's settings
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
        if self.failing_since is None or self.proc is None:
            return
        if self.term_sent_at is None and now >= self.failing_since + self.stop_grace:
            self._send(signal.SIGTERM)
            self.term_sent_at = now
        elif self.term_sent_at is not None and not self.kill_sent and now >= self.term_sent_at + self.kill_after:
            self._send(signal.SIGKILL)
            self.kill_sent = True

    def _send(self, signo: int) -> None:
        if self.proc is not None and self.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.proc.pid, signo)

    # -- signals -------------------------------------------------------------------------------------

    def _signals(self, infos: list[_SigInfo]) -> None:
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

    def _forward(self, info: _SigInfo) -> None:
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

    def _resize(self) -> None:
        if self.terminal is not None and self.master is not None:
            with contextlib.suppress(OSError):
                fcntl.ioctl(self.master, termios.TIOCSWINSZ, self.terminal.window_size())

    def _suspend(self) -> None:
        """Job control: stop the child, give the terminal back as it was, stop; resume: undo."""
        self.child_stopped_by_us = True
        self._signal_child_group(signal.SIGSTOP)
        self._stop_self()

    def _stop_self(self) -> None:
        self._take_foreground()
        if self.terminal is not None:
            self.terminal.restore()
        os.kill(os.getpid(), signal.SIGSTOP)
        self._resumed()

    def _resumed(self) -> None:
        if self.terminal is not None:
            with contextlib.suppress(OSError, termios.error):
                self.terminal.make_raw()
            self._resize()  # the window may have changed while we were stopped
        if self.foreground_fd is None:
            self._give_foreground()  # `fg` made us the foreground job again (`bg` did not)
        self.child_stopped_by_us = False
        self._signal_child_group(signal.SIGCONT)

    def _signal_child_group(self, signo: int) -> None:
        if self.proc is not None and self.returncode is None:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(self.proc.pid, signo)

    def _reap(self) -> None:
        if self.proc is None or self.returncode is not None:
            return
        try:
            pid, status = os.waitpid(self.proc.pid, os.WNOHANG | (0 if self.use_pty else os.WUNTRACED))
        except ChildProcessError:
            return
        if pid == 0:
            return
        if os.WIFSTOPPED(status):
            # The terminal's ^Z (or a read from it in the background) stopped the child's group: stop as
            # well, so the shell sees the job stopped and gets its terminal back. A plain SIGSTOP (a user's
            # `kill -STOP`, a debugger) is not job control: safe-llama keeps running (and systemd's watchdog
            # pings pause while /health does not answer).
            terminal_stop = os.WSTOPSIG(status) in (signal.SIGTSTP, signal.SIGTTIN, signal.SIGTTOU)
            if terminal_stop and not self.child_stopped_by_us and _is_stopped(pid):
                self._stop_self()
            return
        self.returncode = os.waitstatus_to_exitcode(status)
        self.proc.returncode = self.returncode
        self._take_foreground()

    # -- the end -------------------------------------------------------------------------------------

    def outcome(self) -> Outcome:
        assert self.proc is not None and self.returncode is not None
        failure: Failure | None = None
        stopped_by_us = self.term_sent_at is not None
        if not self.ready and self.user_stop is None:
            evidence = None
            if self.returncode == -signal.SIGKILL and not self.kill_sent:
                evidence = oom_evidence(self.counters_before, self.memory_counters())
            failure = self.watcher.conclude(None if stopped_by_us else self.returncode, evidence)
        return Outcome(
            exit_code=exit_code_for(self.returncode),
            returncode=self.returncode,
            ready=self.ready,
            failure=failure,
            stopped_by_us=stopped_by_us,
            user_stop_signal=self.user_stop,
            signals_forwarded=tuple(self.forwarded),
            pid=self.proc.pid,
            used_pty=self.use_pty,
        )

    def cleanup(self) -> None:
        self._take_foreground()
        if self.probe_thread is not None:
            self.probe_thread.close()
            self.probe_thread = None
        if self.proc is not None and self.returncode is None:
            # Leaving on an exception: the child must not outlive the loop that relays its output.
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.proc.pid, signal.SIGKILL)
            self.returncode = self.proc.wait()
        if self.terminal is not None:
            with contextlib.suppress(termios.error):
                self.terminal.restore()
        for relay in self._all_relays():
            relay.close_src()
            relay.sink.close()
        if self.master is not None:
            os.close(self.master)
            self.master = None


def launch(
    argv: Sequence[str | os.PathLike[str]],
    env: Mapping[str, str],
    *,
    watcher: Watcher,
    probe: ReadinessProbe | None = None,
    use_pty: bool | None = None,
    stdin_fd: int = 0,
    stdout_fd: int = 1,
    stderr_fd: int = 2,
    stop_grace: float = 2.0,
    kill_after: float = 5.0,
    memory_counters: Callable[[], Mapping[str, int]] | None = None,
) -> Outcome:
    """Run argv (never through a shell) until it exits, passing bytes and signals through.

    use_pty None: a pty when stdin and stdout are terminals, pipes otherwise. The watcher sees start-up
    output until the probe says ready; after a STOP_FAILED verdict the child gets stop_grace seconds to
    exit by itself, then SIGTERM, then SIGKILL after kill_after more. Call from the main thread of a
    process with no other threads that might take the forwarded signals. A binary that is missing or
    not executable raises SafeLlamaError (127 / 126), with no child left behind. memory_counters: what
    tells an OOM kill from a user's SIGKILL (default: the cgroup's and the kernel's OOM counters).
    """
    args = [os.fspath(a) for a in argv]
    if not args:
        raise ValueError("launch() needs a program to run")
    pty_mode = use_pty if use_pty is not None else os.isatty(stdin_fd) and os.isatty(stdout_fd)
    child_env = {**env, GUARD_ENV: str(os.getpid())}
    supervisor = _Supervisor(
        args, child_env, watcher, probe, pty_mode, (stdin_fd, stdout_fd, stderr_fd), stop_grace, kill_after
    )
    if memory_counters is not None:
        supervisor.memory_counters = memory_counters
    watched = [*supervisor.forwardable, signal.SIGCHLD, signal.SIGCONT, signal.SIGTSTP]
    if pty_mode:
        watched += [signal.SIGWINCH]
    # SIGTTOU blocked, not watched: tcsetpgrp() and terminal writes from the background are allowed then.
    old_mask = signal.pthread_sigmask(signal.SIG_BLOCK, [*watched, signal.SIGTTOU])
    sigfd: _SignalFd | None = None
    try:
        sigfd = _SignalFd(watched)
        supervisor.spawn()
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
