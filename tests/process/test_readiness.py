"""Tests for safe_llama/process/readiness.py: each tool's probe on recorded and live output, and the address
llama-server's /health is probed on (llama.cpp's own reading of --host, --port and their LLAMA_ARG_* twins).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pexpect
import pytest

from safe_llama.process.readiness import GenerationProbe, HealthProbe, PromptProbe, probe_for, server_probe
from safe_llama.process.relay import Stream
from tests import FIXTURES
from tests.llama_run import free_port
from tests.process.supervision import driver_argv, in_pty, run_driver

LOGS = FIXTURES / "logs"


@pytest.mark.parametrize(
    ("argv", "env", "expected"),
    [
        ([], {}, HealthProbe("127.0.0.1", 8080, "/health")),
        (["--port", "9000"], {"LLAMA_ARG_PORT": "7000"}, HealthProbe("127.0.0.1", 9000, "/health")),
        ([], {"LLAMA_ARG_PORT": "7000", "LLAMA_ARG_HOST": "0.0.0.0"}, HealthProbe("127.0.0.1", 7000, "/health")),  # noqa: S104
        (["--host", "::", "--port", "1"], {}, HealthProbe("::1", 1, "/health")),
        (["--host", "[::1]", "--port", "2"], {}, HealthProbe("::1", 2, "/health")),
        (["--host", "10.0.0.5, 127.0.0.1"], {}, HealthProbe("10.0.0.5", 8080, "/health")),
        (["--port", "1", "--port", "2"], {}, HealthProbe("127.0.0.1", 2, "/health")),
        (["--api-prefix", "/v1/"], {}, HealthProbe("127.0.0.1", 8080, "/v1/health")),
        ([], {"LLAMA_ARG_API_PREFIX": "/x"}, HealthProbe("127.0.0.1", 8080, "/x/health")),
        (
            ["--ssl-key-file", "k.pem", "--ssl-cert-file", "c.pem"],
            {},
            HealthProbe("127.0.0.1", 8080, "/health", https=True),
        ),
        (["--host", "/run/llama.sock"], {}, HealthProbe(unix_socket="/run/llama.sock")),
        (["--port", "0"], {}, HealthProbe("127.0.0.1", 0, "/health")),
        (["-m", "model.gguf", "--port"], {}, HealthProbe("127.0.0.1", 8080, "/health")),  # flag without value
        pytest.param(
            [],
            {"LLAMA_ARG_HOST": "/run/x.sock", "LLAMA_ARG_API_PREFIX": "/api"},
            HealthProbe(unix_socket="/run/x.sock", path="/api/health"),
            id="socket-from-env",
        ),
        pytest.param(["--host", "10.1.1.1"], {"LLAMA_ARG_HOST": "/x.sock"}, HealthProbe("10.1.1.1"), id="flag-wins"),
        pytest.param(
            [],
            {"LLAMA_ARG_SSL_KEY_FILE": "k.pem", "LLAMA_ARG_SSL_CERT_FILE": "c.pem"},
            HealthProbe(https=True),
            id="tls-from-env",
        ),
        pytest.param(["--ssl-key-file", "k.pem"], {}, HealthProbe(https=False), id="tls-needs-a-certificate-too"),
        pytest.param(["--port", "9000x"], {}, HealthProbe("127.0.0.1", 9000), id="port-read-by-std-stoi"),
        pytest.param(["--api_prefix", "/u"], {}, HealthProbe(path="/u/health"), id="underscore-spelling"),
    ],
)
def test_server_probe_reads_host_port_prefix(argv: list[str], env: dict[str, str], expected: HealthProbe) -> None:
    probe = server_probe(argv, env)
    assert (probe.host, probe.port, probe.path, probe.https, probe.unix_socket) == (
        expected.host,
        expected.port,
        expected.path,
        expected.https,
        expected.unix_socket,
    )


def test_health_probe_learns_port_zero_from_the_log() -> None:
    probe = server_probe(["--port", "0"], {})
    assert probe.check() is False  # no port yet: no request
    line = b"0.00.800.000 I srv  llama_server: listening on http://127.0.0.1:43123\n"
    assert probe.output(Stream.STDERR, line[:40]) is False
    assert probe.output(Stream.STDERR, line[40:]) is False  # ready only by /health
    assert probe.port == 43123


def test_health_probe_is_not_ready_at_model_loaded() -> None:
    """The real log of a server that logged `model loaded` and then aborted (RLIMIT_AS): its output alone
    never makes it ready, and with nothing answering, neither does the wait."""
    now = [0.0]
    probe = HealthProbe("127.0.0.1", free_port(), settle=1.0, _clock=lambda: now[0])
    assert probe.output(Stream.COMBINED, _fixture("server-thread-sliver.log")) is False
    assert probe.check() is False  # /slots does not answer: loaded, not yet serving
    now[0] = 1.0
    assert probe.check() is True  # it outlived the settle time: the supervisor saw no exit


@pytest.mark.slow
def test_health_probe_serving_when_the_task_loop_answers() -> None:
    """A server whose GET /slots answers 200 serves at once; /health alone only says it loaded."""
    import http.server
    import threading

    answers = {"/health": 200, "/slots": 503}

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            self.send_response(answers.get(self.path, 404))
            self.end_headers()

        def log_message(self, *args: object) -> None:
            pass

    server = http.server.HTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        probe = HealthProbe("127.0.0.1", server.server_address[1], settle=3600)
        assert probe.check() is False  # /health 200: loaded
        assert probe.check() is False  # the task loop does not answer yet
        answers["/slots"] = 200
        assert probe.check() is True
        assert probe.healthy() is True
    finally:
        server.shutdown()


def test_probe_for_each_tool() -> None:
    assert isinstance(probe_for("server", [], {}), HealthProbe)
    assert isinstance(probe_for("cli", [], {}), PromptProbe)
    assert isinstance(probe_for("completion", [], {}), GenerationProbe)
    with pytest.raises(ValueError, match="unknown"):
        probe_for("embedding", [], {})


def _fixture(name: str) -> bytes:
    return (LOGS / name).read_bytes().split(b"\n", 1)[1]


def _ready_offset(make: Callable[[], Any], stream: Stream, data: bytes, cut: int) -> bool:
    probe = make()
    return bool(probe.output(stream, data[:cut]) or probe.output(stream, data[cut:]))


@pytest.mark.parametrize(
    ("name", "stream"),
    [("cli-ready.stdout.log", Stream.STDOUT), ("cli-ready.pty.log", Stream.COMBINED)],
)
def test_prompt_probe_on_real_llama_cli_output(name: str, stream: Stream) -> None:
    data = _fixture(name)
    prompt_at = data.index(b"> ", data.index(b"available commands:"))
    for cut in range(0, len(data) + 1, 7):
        assert _ready_offset(PromptProbe, stream, data, cut), cut
        if cut <= prompt_at:
            assert not PromptProbe().output(stream, data[:cut]), cut


def test_prompt_probe_not_ready_on_a_failed_start() -> None:
    probe = PromptProbe()
    assert not probe.output(Stream.STDOUT, _fixture("cli-kv-oom.stdout.log"))
    assert not probe.output(Stream.STDERR, b"available commands:\n\n> ")  # stderr is not the prompt


def test_generation_probe() -> None:
    assert GenerationProbe().output(Stream.STDOUT, b"T")
    assert not GenerationProbe().output(Stream.STDOUT, b"")
    ready_log = _fixture("completion-ready.log")
    for cut in range(0, len(ready_log) + 1, 5):
        assert _ready_offset(GenerationProbe, Stream.COMBINED, ready_log, cut)
    assert not GenerationProbe().output(Stream.STDERR, _fixture("completion-kv-oom.log"))


# ---------------------------------------------------------------------------------------------------
# The real llama.cpp (slow)
# ---------------------------------------------------------------------------------------------------


@pytest.mark.slow
def test_real_completion_ready_when_generation_begins(
    scripts: dict[str, Path], tmp_path: Path, llama_bin: Path, bundled_model: Path
) -> None:
    completion = [str(llama_bin / "llama-completion"), "-m", str(bundled_model), "-c", "4096"]
    completion += ["-p", "The sky is", "-n", "8", "-no-cnv"]
    rc, stdout, _, outcome = run_driver(scripts, tmp_path, completion, probe="completion", timeout=60)
    assert rc == 0 and stdout.startswith(b"The sky is")
    assert outcome["ready"] is True and outcome["failure"] is None


@pytest.mark.slow
def test_real_cli_in_a_terminal_ready_at_its_prompt(
    scripts: dict[str, Path], tmp_path: Path, llama_bin: Path, bundled_model: Path
) -> None:
    out = tmp_path / "outcome.json"
    cli = [str(llama_bin / "llama-cli"), "-m", str(bundled_model), "-c", "4096", "-n", "8"]
    with in_pty(driver_argv(scripts, {"out": str(out), "probe": "cli"}, *cli)) as term:
        term.expect("available commands:", timeout=60)
        term.expect("> ")
        term.sendline("/exit")
        term.expect(pexpect.EOF, timeout=30)
        term.wait()
    outcome = json.loads(out.read_text())
    assert outcome["used_pty"] is True and outcome["ready"] is True
    assert outcome["exit_code"] == 0 == term.exitstatus and outcome["tty_restored"] is True


@pytest.mark.parametrize(
    ("answer", "status"),
    [
        pytest.param(b'HTTP/1.1 200 OK\r\nContent-Length: 15\r\n\r\n{"status":"ok"}', 200, id="health"),
        pytest.param(b"HTTP/1.1 503 Service Unavailable\r\n\r\n" + b"x" * 300_000, 503, id="a-long-body"),
        pytest.param(b"HTTP/1.0 404 Not Found\r\n\r\n", 404, id="http-1.0"),
        pytest.param(b"SSH-2.0-OpenSSH_9.2\r\n", None, id="not-http"),
        pytest.param(b"", None, id="closed-at-once"),
    ],
)
def test_http_status_reads_the_status_line(answer: bytes, status: int | None) -> None:
    """The one request a readiness check sends, answered over a socket pair (the other end plays the server)."""
    import socket
    import threading

    from safe_llama.process.readiness import http_status

    ours, theirs = socket.socketpair()
    asked: list[bytes] = []

    def serve() -> None:
        with theirs:
            asked.append(theirs.recv(4096))
            theirs.sendall(answer)

    server = threading.Thread(target=serve)
    server.start()
    with ours:
        ours.settimeout(5)
        assert http_status(ours, "127.0.0.1:8080", "/health") == status
    server.join()
    assert asked == [b"GET /health HTTP/1.1\r\nHost: 127.0.0.1:8080\r\nConnection: close\r\n\r\n"]


def test_http_status_does_not_wait_for_a_rest_that_never_ends() -> None:
    """A server that keeps the connection open after its status line: the status counts once the socket's
    timeout ends the read of the rest."""
    import socket

    from safe_llama.process.readiness import http_status

    ours, theirs = socket.socketpair()
    with ours, theirs:
        theirs.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\npartial")
        ours.settimeout(0.05)
        assert http_status(ours, "localhost", "/slots") == 200
