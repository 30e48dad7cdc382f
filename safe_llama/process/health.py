"""The plain-HTTP question llama-server answers with its status: the words of `GET path` (HTTP/1.1, Connection:
close), the status code read from the answer's head, and one question asked without blocking (Check, for the
handed supervisor's watchdog, in its poll loop); readiness.py asks it over a blocking socket (start-up and the full
supervisor's watchdog).

Owns those words, the answer's reading and its bounds, and Check; must stay light (errno, select, socket): the
handed supervisor imports it while llama-server runs. http.client would import the email package and ssl into a
supervisor.
"""

from __future__ import annotations

import errno
import select
import socket

TYPE_CHECKING = False  # typing.TYPE_CHECKING without importing typing (mypy reads the name)
if TYPE_CHECKING:
    from typing import Any

ANSWER_LIMIT = 1 << 20  # bytes of a /health or /slots answer read before the connection is closed
HEAD_LIMIT = 4096  # bytes read for the status line
TIMEOUT = 1.0  # seconds each step of one question may take (connect, send, each read)


def request(host: str, path: str) -> bytes:
    """`GET path` to host (its Host header: `name:port`, `[v6]:port`, or `localhost` on a Unix socket)."""
    return f"GET {path} HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\n\r\n".encode("ascii")


def status_of(head: bytes) -> int | None:
    """The status code of an answer's first bytes (up to its first line end, HEAD_LIMIT at most); None when they
    are no HTTP/1.x status line."""
    words = head.split(b"\r\n", 1)[0].split(maxsplit=2)
    if len(words) < 2 or not words[0].startswith(b"HTTP/1.") or not words[1].isdigit() or len(words[1]) != 3:
        return None
    return int(words[1])


class Health:
    """llama-server's /health: on a Unix socket, or a host and port."""

    def __init__(self, path: str, unix_socket: str | None, host: str = "", port: int = 0) -> None:
        self.path, self.unix_socket, self.host, self.port = path, unix_socket, host, port


class Check:
    """One GET of /health without blocking the loop: connect, send, read the answer's status and the rest (at
    most ANSWER_LIMIT); each step within `timeout` seconds, as the full supervisor's blocking socket."""

    def __init__(self, address: Health, now: float, timeout: float) -> None:
        self.status: int | None = None
        self.done = False
        self.timeout = timeout
        self.deadline = now + timeout
        self.head = b""
        self.head_read = False
        self.read = 0
        self.sending = b""
        self.sock: socket.socket | None = None
        where: str | tuple[Any, ...]
        try:
            if address.unix_socket is not None:
                family, where, host = socket.AF_UNIX, address.unix_socket, "localhost"
            else:
                found = socket.getaddrinfo(address.host, address.port, type=socket.SOCK_STREAM)[0]
                family, where = found[0], found[4]
                host = f"[{address.host}]:{address.port}" if ":" in address.host else f"{address.host}:{address.port}"
            self.sock = socket.socket(family, socket.SOCK_STREAM | socket.SOCK_NONBLOCK | socket.SOCK_CLOEXEC)
            if self.sock.connect_ex(where) not in (0, errno.EINPROGRESS, errno.EAGAIN):
                self.finish()
                return
        except OSError:
            self.finish()
            return
        self.sending = request(host, address.path)

    def mask(self) -> int:
        return select.POLLOUT if self.sending else select.POLLIN

    def event(self, now: float) -> None:
        assert self.sock is not None
        self.deadline = now + self.timeout
        try:
            if self.sending:
                if self.sock.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR):
                    self.finish()
                    return
                self.sending = self.sending[self.sock.send(self.sending) :]
                return
            chunk = self.sock.recv(65536 if self.head_read else HEAD_LIMIT)
        except BlockingIOError:
            return
        except OSError:
            self.finish()
            return
        self.read += len(chunk)
        if not self.head_read:
            self.head += chunk
            if b"\r\n" in self.head or len(self.head) >= HEAD_LIMIT or not chunk:
                self.head_read = True
                self.status = status_of(self.head)
                if self.status is None:  # no HTTP: nothing more is read
                    self.finish()
                    return
        if not chunk or self.read >= ANSWER_LIMIT:
            self.finish()

    def finish(self) -> None:
        self.done = True
        if self.sock is not None:
            self.sock.close()
            self.sock = None
