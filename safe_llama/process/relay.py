"""Moving the child's bytes: the user's terminal in raw mode, sinks that never block, relays that queue.

Owns byte order, back-pressure (HIGH_WATER) and what a vanished reader means (the child gets its EPIPE).
Must never alter, delay or hold back a byte, and must not look at what the bytes say. Must stay light (no typing):
the handed supervisor (handed.py) relays through it while llama-server runs.
"""

from __future__ import annotations

import contextlib
import enum
import fcntl
import os
import socket
import stat
import termios

TYPE_CHECKING = False  # typing.TYPE_CHECKING without importing typing (mypy reads the name)
if TYPE_CHECKING:
    from typing import Any

READ_SIZE = 1 << 16
HIGH_WATER = 1 << 20  # stop reading a source while this much of its output waits for the reader
DRAIN_IDLE = 0.25  # after the child exits: give up on pipes a grandchild keeps open after this quiet time


class Stream(enum.Enum):
    STDOUT = "stdout"
    STDERR = "stderr"
    COMBINED = "combined"  # stdout and stderr interleaved in one channel: a pty, or 2>&1


def raw_attrs(attrs: list[Any]) -> list[Any]:
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


class Terminal:
    """The user's terminal in pty mode: raw while the child runs, restored on every way out."""

    def __init__(self, in_fd: int, out_fd: int) -> None:
        self.in_fd = in_fd
        self.out_fd = out_fd
        self.saved: list[Any] = termios.tcgetattr(in_fd)
        self._raw = False

    def window_size(self) -> bytes:
        return fcntl.ioctl(self.out_fd, termios.TIOCGWINSZ, b"\0" * 8)

    def make_raw(self) -> None:
        termios.tcsetattr(self.in_fd, termios.TCSADRAIN, raw_attrs(self.saved))
        self._raw = True

    def restore(self) -> None:
        if self._raw:
            self._raw = False
            termios.tcsetattr(self.in_fd, termios.TCSADRAIN, self.saved)


class Sink:
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


class Relay:
    """One direction of bytes: a source fd, a sink, and what the sink has not taken yet."""

    def __init__(self, src: int, sink: Sink, stream: Stream | None, *, owns_src: bool) -> None:
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


def pipe_relay(src: int, dst: int, stream: Stream) -> Relay:
    """A relay from one of the child's output pipes (ours to close) to one of the wrapper's fds."""
    os.set_blocking(src, False)
    with contextlib.suppress(OSError):  # a bigger pipe: fewer wake-ups under heavy output
        fcntl.fcntl(src, fcntl.F_SETPIPE_SZ, HIGH_WATER)
    return Relay(src, Sink(dst), stream, owns_src=True)
