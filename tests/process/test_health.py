"""Tests for safe_llama/process/health.py: the status line read from an answer's head, and one non-blocking GET
(Check) against a real socket that answers as llama-server does, polled as the handed supervisor polls it."""

from __future__ import annotations

import select
import socket
import threading
import time

import pytest

from safe_llama.process import health


@pytest.mark.parametrize(
    ("head", "status"),
    [
        pytest.param(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\n{}", 200, id="ok"),
        pytest.param(b"HTTP/1.1 503 Service Unavailable\r\n", 503, id="loading"),
        pytest.param(b"HTTP/1.0 404 Not Found\r\n", 404, id="http-1.0"),
        pytest.param(b"SSH-2.0-OpenSSH\r\n", None, id="not-http"),
        pytest.param(b"HTTP/1.1 20 OK\r\n", None, id="two-digits"),
        pytest.param(b"", None, id="nothing"),
    ],
)
def test_status_of(head: bytes, status: int | None) -> None:
    assert health.status_of(head) == status


def test_the_request_names_the_host_and_closes() -> None:
    assert health.request("[::1]:8080", "/v1/health") == (
        b"GET /v1/health HTTP/1.1\r\nHost: [::1]:8080\r\nConnection: close\r\n\r\n"
    )


def _serve_once(answer: bytes | None) -> tuple[int, list[bytes]]:
    """A listening socket that takes one connection and answers it (None: never answers); its port and what it got."""
    server = socket.create_server(("127.0.0.1", 0))
    got: list[bytes] = []

    def run() -> None:
        conn, _ = server.accept()
        with conn:
            got.append(conn.recv(4096))
            if answer is None:
                time.sleep(1.5)
                return
            conn.sendall(answer)
        server.close()

    threading.Thread(target=run, daemon=True).start()
    return server.getsockname()[1], got


def _ask(check: health.Check, limit: float = 5.0) -> None:
    began = time.monotonic()
    while not check.done and time.monotonic() - began < limit:
        assert check.sock is not None
        poller = select.poll()
        poller.register(check.sock.fileno(), check.mask())
        if poller.poll(50):
            check.event(time.monotonic())
        elif time.monotonic() >= check.deadline:
            check.finish()


@pytest.mark.parametrize(("answer", "status"), [(b"HTTP/1.1 200 OK\r\n\r\n{}", 200), (b"HTTP/1.1 503 x\r\n\r\n", 503)])
def test_a_check_reads_the_status_without_blocking(answer: bytes, status: int) -> None:
    port, got = _serve_once(answer)
    check = health.Check(health.Health("/health", None, "127.0.0.1", port), time.monotonic(), health.TIMEOUT)
    _ask(check)
    assert check.done and check.status == status and check.sock is None
    assert got == [health.request(f"127.0.0.1:{port}", "/health")]


@pytest.mark.slow
def test_a_server_that_does_not_answer_is_not_healthy() -> None:
    """A stopped llama-server: the kernel accepts the connection, nothing answers within the timeout."""
    port, _ = _serve_once(None)
    check = health.Check(health.Health("/health", None, "127.0.0.1", port), time.monotonic(), 0.3)
    _ask(check)
    assert check.done and check.status is None


def test_nothing_listening_is_not_healthy() -> None:
    check = health.Check(health.Health("/health", "/nonexistent/llama.sock"), time.monotonic(), health.TIMEOUT)
    assert check.done and check.status is None
