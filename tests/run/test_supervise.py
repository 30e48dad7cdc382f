"""Tests for safe_llama/run/supervise.py: the child's terminal or pipes, signals, exit codes, start-up watching.

The wrapper side runs as a separate process (DRIVER, calling launch() as the CLI does) so that signals,
terminals and SIGKILL can be aimed at it. Behaviours no real llama.cpp shows on demand (a signal log, all
256 byte values, an allocation error printed by a process that keeps running) come from FAKE, a fake
llama.cpp; everything that can run for real runs the pinned llama.cpp on the bundled model (slow tests).
Numbers in test names refer to /work/shared/reference/wrapper-behaviour.md.
"""

from __future__ import annotations

import contextlib
import json
import os
import shlex
import signal
import socket
import subprocess
import sys
import termios
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pexpect
import pytest

from safe_llama.device.proc import GUARD_ENV
from safe_llama.errors import ExitStatus, SafeLlamaError
from safe_llama.run.signatures import load_table
from safe_llama.run.supervise import (
    GenerationProbe,
    HealthProbe,
    PromptProbe,
    SignatureWatcher,
    Stream,
    Verdict,
    check_not_nested,
    exit_code_for,
    probe_for,
    server_probe,
)
from tests import FIXTURES, ROOT

REPO = ROOT
LOGS = FIXTURES / "logs"
OPENVINO_LINE = next(line for line in (LOGS / "openvino-seed.log").read_text().splitlines() if "[GPU] Exceeded" in line)
BAD_MAGIC_LOG = (LOGS / "server-bad-magic.log").read_bytes().split(b"\n", 1)[1]

DRIVER = """\
# test driver (not a fake): the wrapper, calling safe_llama.run.supervise.launch() the way the CLI does.
import dataclasses, json, os, sys, termios
from safe_llama.errors import SafeLlamaError
from safe_llama.run.signatures import load_table
from safe_llama.run.supervise import SignatureWatcher, launch, probe_for


class RaisingWatcher(SignatureWatcher):
    def output(self, stream, data):
        raise RuntimeError("watcher failed")


opts = json.loads(sys.argv[1])
argv = sys.argv[2:]
if "stdout_to" in opts:
    fd = os.open(opts["stdout_to"], os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
    os.dup2(fd, 1)
    os.close(fd)
if opts.get("stdin_null"):
    fd = os.open(os.devnull, os.O_RDONLY)
    os.dup2(fd, 0)
    os.close(fd)
tty_before = termios.tcgetattr(0) if os.isatty(0) else None
watcher = (RaisingWatcher if opts.get("raise_in_watcher") else SignatureWatcher)(load_table())
probe = probe_for(opts["probe"], argv, os.environ) if opts.get("probe") else None
result = {}
code = 0
try:
    outcome = launch(
        argv, os.environ, watcher=watcher, probe=probe, use_pty=opts.get("pty"),
        stop_grace=opts.get("grace", 2.0), kill_after=opts.get("kill_after", 5.0),
    )
    result = dataclasses.asdict(outcome)
    result["retry"] = outcome.retry
    result["reaped"] = not os.path.exists(f"/proc/{outcome.pid}")
    code = outcome.exit_code
except SafeLlamaError as err:
    sys.stderr.write(err.message + "\\n")
    result = {"error": err.message}
    code = int(err.status)
except RuntimeError as err:
    result = {"exception": str(err)}
    code = 70
if tty_before is not None:
    result["tty_restored"] = termios.tcgetattr(0) == tty_before
with open(opts["out"], "w") as f:
    json.dump(result, f)
sys.exit(code)
"""

FAKE = """\
# FAKE llama.cpp for tests: shows on demand what the real one cannot (signal log, all byte values, ...).
import json, os, signal, sys, time

mode, args = sys.argv[1], sys.argv[2:]
NAMES = {s: s.name[3:] for s in (signal.SIGTERM, signal.SIGHUP, signal.SIGINT, signal.SIGQUIT,
                                 signal.SIGUSR1, signal.SIGUSR2)}


def log(text):
    with open(args[0], "a") as f:
        f.write(text + "\\n")


def out(data, fd=1):
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view):]


if mode == "signals":  # log every forwardable signal; exit 0 on SIGTERM
    done = []
    def handler(signo, frame):
        log(NAMES[signo])
        if signo == signal.SIGTERM:
            done.append(1)
    for s in NAMES:
        signal.signal(s, handler)
    log(f"ready {os.getpid()}")
    while not done:
        time.sleep(0.02)
    log("shutdown")
elif mode == "tty":  # a terminal program: size on start and on SIGWINCH; cooked lines or raw bytes
    import fcntl, struct, termios, tty
    def size(*_):
        rows, cols = struct.unpack("HHHH", fcntl.ioctl(1, termios.TIOCGWINSZ, b"\\0" * 8))[:2]
        out(f"size {rows}x{cols}\\r\\n".encode())
    signal.signal(signal.SIGWINCH, size)
    signal.signal(signal.SIGINT, lambda *_: (log("INT"), out(b"got INT\\r\\n")))
    signal.signal(signal.SIGCONT, lambda *_: out(b"cont\\r\\n"))
    log(f"ready {os.getpid()}")
    out(f"tty {os.isatty(0)} {os.isatty(1)} {os.isatty(2)}\\r\\n".encode())
    size()
    if args[1:] == ["raw"]:
        tty.setraw(0)
        out(b"ready\\r\\n")
        while (key := os.read(0, 1)) != b"q":
            out(f"key {key.hex()}\\r\\n".encode())
    else:
        out(b"ready\\r\\n")
        for line in sys.stdin:
            if line.strip() == "quit":
                break
            out(f"line {line.strip()}\\r\\n".encode())
elif mode == "bytes":  # every byte value, many times, on both streams, in odd-sized writes
    data = bytes(range(256)) * 64
    for i in range(0, len(data), 1000):
        out(data[i:i + 1000])
        out(data[::-1][i:i + 1000], 2)
elif mode == "cat":  # stdin to stdout, then say EOF came
    while chunk := os.read(0, 65536):
        out(chunk)
    out(b"EOF\\n", 2)
    sys.exit(7)
elif mode == "big":  # 1 MiB without a newline, then exit at once (nothing may be lost)
    out(b"x" * (1 << 20) + b"END")
    os._exit(0)
elif mode == "flood":  # write until the reader goes away, like `yes` (a C program: SIGPIPE not ignored)
    signal.signal(signal.SIGPIPE, signal.SIG_DFL)
    while True:
        out(b"y" * 65536)
elif mode == "trickle":  # one byte, no newline, a pause
    out(b"A")
    time.sleep(3)
    out(b"B")
elif mode == "interleave":
    for i in range(200):
        out(f"o{i}\\n".encode())
        out(f"e{i}\\n".encode(), 2)
elif mode == "argv":
    out(json.dumps({"argv": args, "guard": os.environ.get(args[0])}).encode())
elif mode == "exit":
    sys.exit(int(args[0]))
elif mode == "kill":
    os.kill(os.getpid(), int(args[0]))
elif mode == "sigmask":
    with open("/proc/self/status") as f:
        out("".join(l for l in f if l.startswith(("SigBlk", "SigIgn"))).encode())
elif mode == "sleep":  # note our pid, then wait to be killed
    log(f"ready {os.getpid()}")
    time.sleep(60)
elif mode == "alloc-and-run":  # an allocation error printed by a process that keeps running (OpenVINO)
    if args[2:] == ["ignore-term"]:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
    log(f"ready {os.getpid()}")
    out(f"0.00.500.000 E {args[1]}\\n".encode(), 2)
    time.sleep(60)
elif mode == "replay":  # print a recorded log on stderr and exit like the real process did
    with open(args[0], "rb") as f:
        out(f.read().split(b"\\n", 1)[1], 2)
    sys.exit(int(args[1]))
elif mode == "loading":  # still loading: nothing on stdout; optionally a memory line on SIGTERM
    if args[1:] == ["alloc-on-term"]:
        def on_term(signo, frame):
            out(b"E ggml_aligned_malloc: insufficient memory (attempted to allocate 100.00 MB)\\n", 2)
            sys.exit(1)
        signal.signal(signal.SIGTERM, on_term)
    log(f"ready {os.getpid()}")
    time.sleep(60)
elif mode == "server":  # /health 503 while "loading", then 200; an allocation line after readiness
    import http.server, threading
    port, t0 = int(args[1]), time.monotonic()
    class Health(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            loading = time.monotonic() - t0 < 0.6
            self.send_response(503 if loading else 200)
            self.end_headers()
            if not loading:
                threading.Timer(0.3, lambda: out(b"E ggml_aligned_malloc: insufficient memory (x)\\n", 2)).start()
        def log_message(self, *a):
            pass
    server = http.server.HTTPServer(("127.0.0.1", port), Health)
    signal.signal(signal.SIGTERM, lambda *_: threading.Thread(target=server.shutdown).start())
    log(f"ready {os.getpid()}")
    server.serve_forever()
"""


# ---------------------------------------------------------------------------------------------------
# Helpers
# ---------------------------------------------------------------------------------------------------


@pytest.fixture
def scripts(tmp_path: Path) -> dict[str, Path]:
    paths = {"driver": tmp_path / "driver.py", "fake": tmp_path / "fake.py"}
    paths["driver"].write_text(DRIVER)
    paths["fake"].write_text(FAKE)
    return paths


def driver_env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("LLAMA_ARG_", "SAFE_LLAMA_"))}
    env["PYTHONPATH"] = str(REPO)
    return env


def driver_argv(scripts: dict[str, Path], opts: dict[str, Any], *child: str) -> list[str]:
    return [sys.executable, str(scripts["driver"]), json.dumps(opts), *child]


def fake(scripts: dict[str, Path], mode: str, *args: str) -> list[str]:
    return [sys.executable, str(scripts["fake"]), mode, *args]


def run_driver(
    scripts: dict[str, Path],
    tmp_path: Path,
    child: list[str],
    *,
    stdin: bytes = b"",
    timeout: float = 30,
    stderr: int = subprocess.PIPE,
    **opts: Any,
) -> tuple[int, bytes, bytes, dict[str, Any]]:
    out = tmp_path / "outcome.json"
    proc = subprocess.run(
        driver_argv(scripts, {"out": str(out), **opts}, *child),
        input=stdin,
        stdout=subprocess.PIPE,
        stderr=stderr,
        env=driver_env(),
        timeout=timeout,
    )
    return proc.returncode, proc.stdout, proc.stderr or b"", json.loads(out.read_text())


def wait_for(condition: Callable[[], Any], timeout: float = 10.0, what: str = "condition") -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = condition()
        if value:
            return value
        time.sleep(0.02)
    raise AssertionError(f"timed out waiting for {what}")


def log_lines(path: Path) -> list[str]:
    return path.read_text().splitlines() if path.exists() else []


def child_pid(log: Path) -> int:
    line = wait_for(lambda: next((x for x in log_lines(log) if x.startswith("ready ")), None), what="child")
    return int(line.split()[1])


def alive(pid: int) -> bool:
    """True while pid runs (a zombie or a reused pid that is not ours does not count)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


def state(pid: int) -> str:
    return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@contextlib.contextmanager
def spawned(argv: list[str], **kwargs: Any) -> Iterator[subprocess.Popen[bytes]]:
    proc = subprocess.Popen(argv, env=driver_env(), **kwargs)
    try:
        yield proc
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.wait()


@contextlib.contextmanager
def in_pty(argv: list[str], rows: int = 24, cols: int = 80) -> Iterator[pexpect.spawn]:
    child = pexpect.spawn(argv[0], argv[1:], env=driver_env(), dimensions=(rows, cols), timeout=20)
    try:
        yield child
    finally:
        if child.isalive():
            child.kill(signal.SIGKILL)
        child.close(force=True)


def lflag(fd: int) -> int:
    return int(termios.tcgetattr(fd)[3])


# ---------------------------------------------------------------------------------------------------
# Pure parts: exit codes, probes, the watcher
# ---------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(("returncode", "code"), [(0, 0), (1, 1), (130, 130), (255, 255), (-9, 137), (-15, 143)])
def test_exit_code_for(returncode: int, code: int) -> None:
    assert exit_code_for(returncode) == code


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


def test_signature_watcher_stops_at_an_allocation_failure() -> None:
    watcher = SignatureWatcher(load_table())
    assert watcher.output(Stream.STDERR, b"0.00.1.000 I load: loading\nE ggml_aligned_") is Verdict.CONTINUE
    assert watcher.output(Stream.STDOUT, b"unrelated stdout\n") is Verdict.CONTINUE  # a separate line
    assert (
        watcher.output(Stream.STDERR, b"malloc: insufficient memory (attempted to allocate 1.00 MB)\n")
        is Verdict.STOP_FAILED
    )
    failure = watcher.conclude(1)
    assert failure is not None and failure.memory and failure.signature_id == "cpu-aligned-malloc"


def test_signature_watcher_reads_the_last_line_without_newline() -> None:
    watcher = SignatureWatcher(load_table())
    assert watcher.output(Stream.STDERR, b"error: invalid argument: --x") is Verdict.CONTINUE
    failure = watcher.conclude(1)
    assert failure is not None and not failure.memory and failure.signature_id == "invalid-argument"


def test_check_not_nested() -> None:
    check_not_nested({})
    with pytest.raises(SafeLlamaError) as err:
        check_not_nested({GUARD_ENV: "123"})
    assert err.value.status == ExitStatus.NOT_FOUND and "123" in err.value.message


# ---------------------------------------------------------------------------------------------------
# 1-3: signals
# ---------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("to_group", [False, True], ids=["to-wrapper", "to-its-group"])
def test_1_each_signal_reaches_the_child_exactly_once(scripts: dict[str, Path], tmp_path: Path, to_group: bool) -> None:
    """Sent to the wrapper's pid, or to its whole process group (`kill -SIG -PGID`): once either way."""
    log, out = tmp_path / "signals.log", tmp_path / "outcome.json"
    argv = driver_argv(scripts, {"out": str(out)}, *fake(scripts, "signals", str(log)))
    sent = [signal.SIGUSR1, signal.SIGUSR2, signal.SIGHUP, signal.SIGINT, signal.SIGQUIT, signal.SIGTERM]
    with spawned(argv, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, start_new_session=True) as proc:
        pid = child_pid(log)
        assert os.getpgid(pid) == pid != os.getpgid(proc.pid)  # a group of its own
        for n, signo in enumerate(sent, start=1):
            os.killpg(proc.pid, signo) if to_group else proc.send_signal(signo)
            wait_for(lambda: len(log_lines(log)) >= n + 1, what=f"{signo.name} logged")  # noqa: B023 - used at once
        assert proc.wait(timeout=10) == 0
    assert log_lines(log)[1:] == [*(s.name[3:] for s in sent), "shutdown"]
    outcome = json.loads(out.read_text())
    assert outcome["signals_forwarded"] == [int(s) for s in sent]
    assert outcome["user_stop_signal"] == signal.SIGHUP  # the first stop request; never retried
    assert outcome["failure"] is None and outcome["retry"] is False


def test_2_ctrl_c_in_pipe_mode_reaches_the_child_once_from_the_terminal(
    scripts: dict[str, Path], tmp_path: Path
) -> None:
    # A terminal on stdin, stdout to a file: pipe mode; the child's group holds the terminal's foreground,
    # so ^C reaches it from the terminal, as it reaches a bare llama-cli, and the wrapper does not see it.
    log, out = tmp_path / "signals.log", tmp_path / "outcome.json"
    opts = {"out": str(out), "stdout_to": str(tmp_path / "stdout")}
    with in_pty(driver_argv(scripts, opts, *fake(scripts, "signals", str(log)))) as term:
        pid = child_pid(log)
        assert os.getpgid(pid) == pid != os.getpgid(term.pid)
        assert os.tcgetpgrp(term.child_fd) == pid
        term.sendintr()
        wait_for(lambda: "INT" in log_lines(log), what="INT logged")
        time.sleep(0.3)  # a double forward would show up by now
        term.kill(signal.SIGTERM)
        term.expect(pexpect.EOF)
        term.wait()
    assert log_lines(log)[1:] == ["INT", "TERM", "shutdown"]
    outcome = json.loads(out.read_text())
    assert outcome["used_pty"] is False
    assert outcome["signals_forwarded"] == [signal.SIGTERM]
    assert outcome["user_stop_signal"] == signal.SIGTERM


def test_2_ctrl_c_with_the_terminal_not_on_stdin_is_forwarded_once(scripts: dict[str, Path], tmp_path: Path) -> None:
    # The terminal is only the controlling one: its ^C reaches the wrapper's group, the wrapper forwards it.
    log, out = tmp_path / "signals.log", tmp_path / "outcome.json"
    opts = {"out": str(out), "stdout_to": str(tmp_path / "stdout"), "stdin_null": True}
    with in_pty(driver_argv(scripts, opts, *fake(scripts, "signals", str(log)))) as term:
        child_pid(log)
        term.sendintr()
        wait_for(lambda: "INT" in log_lines(log), what="INT logged")
        time.sleep(0.3)
        term.kill(signal.SIGTERM)
        term.expect(pexpect.EOF)
        term.wait()
    assert log_lines(log)[1:] == ["INT", "TERM", "shutdown"]
    outcome = json.loads(out.read_text())
    assert outcome["signals_forwarded"] == [signal.SIGINT, signal.SIGTERM]
    assert outcome["exit_code"] == 0


def test_1_timeout_sends_one_sigterm(scripts: dict[str, Path], tmp_path: Path) -> None:
    # coreutils timeout signals its child, then its whole process group: the child must get one.
    log, out = tmp_path / "signals.log", tmp_path / "outcome.json"
    argv = [
        "timeout",
        "-s",
        "TERM",
        "1.5",
        *driver_argv(scripts, {"out": str(out)}, *fake(scripts, "signals", str(log))),
    ]
    proc = subprocess.run(argv, env=driver_env(), stdin=subprocess.DEVNULL, timeout=30, check=False)
    assert proc.returncode == 124  # timeout's own "timed out"
    assert log_lines(log)[1:] == ["TERM", "shutdown"]
    assert json.loads(out.read_text())["exit_code"] == 0


def test_1_shell_job_kill_sends_one_sigterm(scripts: dict[str, Path], tmp_path: Path) -> None:
    # bash's `kill %1` signals the job's process group.
    log, out = tmp_path / "signals.log", tmp_path / "outcome.json"
    command = " ".join(
        shlex.quote(a) for a in driver_argv(scripts, {"out": str(out)}, *fake(scripts, "signals", str(log)))
    )
    script = (
        f"set -m; {command} </dev/null & "
        f"for i in $(seq 200); do grep -q ready {shlex.quote(str(log))} 2>/dev/null && break; sleep 0.05; done; "
        "kill %1; wait %1; echo rc=$?"
    )
    proc = subprocess.run(["bash", "-c", script], env=driver_env(), capture_output=True, timeout=30, check=False)
    assert b"rc=0" in proc.stdout
    assert log_lines(log)[1:] == ["TERM", "shutdown"]


def test_2_ctrl_c_in_pty_mode_is_the_byte(scripts: dict[str, Path], tmp_path: Path) -> None:
    log, out = tmp_path / "signals.log", tmp_path / "outcome.json"
    with in_pty(driver_argv(scripts, {"out": str(out)}, *fake(scripts, "tty", str(log)))) as term:
        term.expect("ready")
        term.sendcontrol("c")  # 0x03 through our raw terminal, the child's pty makes it a SIGINT
        term.expect("got INT")
        term.sendline("quit")
        term.expect(pexpect.EOF)
        term.wait()
    assert log_lines(log)[1:] == ["INT"]
    outcome = json.loads(out.read_text())
    assert outcome["used_pty"] is True and outcome["signals_forwarded"] == []
    assert outcome["user_stop_signal"] == signal.SIGINT  # seen as a key: never a retry
    assert outcome["exit_code"] == 0


def test_3_stop_while_loading_is_forwarded_and_never_a_retry(scripts: dict[str, Path], tmp_path: Path) -> None:
    log, out = tmp_path / "log", tmp_path / "outcome.json"
    argv = driver_argv(scripts, {"out": str(out), "probe": "completion"}, *fake(scripts, "loading", str(log)))
    with spawned(argv, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL) as proc:
        child_pid(log)
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=10) == 128 + signal.SIGTERM
    outcome = json.loads(out.read_text())
    assert outcome["ready"] is False and outcome["signals_forwarded"] == [signal.SIGTERM]
    assert outcome["user_stop_signal"] == signal.SIGTERM
    assert outcome["failure"] is None and outcome["retry"] is False


def test_3_memory_line_printed_on_the_way_out_of_a_user_stop_is_not_retried(
    scripts: dict[str, Path], tmp_path: Path
) -> None:
    log, out = tmp_path / "log", tmp_path / "outcome.json"
    argv = driver_argv(scripts, {"out": str(out)}, *fake(scripts, "loading", str(log), "alloc-on-term"))
    with spawned(argv, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE) as proc:
        child_pid(log)
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=10) == 1
        assert proc.stderr is not None and b"insufficient memory" in proc.stderr.read()
    outcome = json.loads(out.read_text())
    assert outcome["user_stop_signal"] == signal.SIGTERM
    assert outcome["failure"] is None and outcome["retry"] is False


# ---------------------------------------------------------------------------------------------------
# 4-6: job control, signal mask, the wrapper's death
# ---------------------------------------------------------------------------------------------------


def test_4_ctrl_z_suspends_and_resume_resizes(scripts: dict[str, Path], tmp_path: Path) -> None:
    log, out = tmp_path / "log", tmp_path / "outcome.json"
    with in_pty(driver_argv(scripts, {"out": str(out)}, *fake(scripts, "tty", str(log)))) as term:
        term.expect("size 24x80")
        term.expect("ready")
        child = child_pid(log)
        wait_for(lambda: not lflag(term.child_fd) & termios.ICANON, what="raw terminal")
        term.sendcontrol("z")
        wait_for(lambda: state(term.pid) == "T" and state(child) == "T", what="both stopped")
        assert lflag(term.child_fd) & termios.ICANON and lflag(term.child_fd) & termios.ECHO  # usable
        term.setwinsize(40, 120)
        os.kill(term.pid, signal.SIGCONT)  # what the shell's `fg` does
        term.expect("size 40x120")
        assert state(child) != "T"
        wait_for(lambda: not lflag(term.child_fd) & termios.ICANON, what="raw again")
        term.sendline("still here")
        term.expect("line still here")
        term.sendline("quit")
        term.expect(pexpect.EOF)
        term.wait()
    assert term.exitstatus == 0
    assert json.loads(out.read_text())["tty_restored"] is True


def test_4_sigtstp_to_the_wrapper_in_pty_mode(scripts: dict[str, Path], tmp_path: Path) -> None:
    log, out = tmp_path / "log", tmp_path / "outcome.json"
    with in_pty(driver_argv(scripts, {"out": str(out)}, *fake(scripts, "tty", str(log)))) as term:
        term.expect("ready")
        child = child_pid(log)
        os.kill(term.pid, signal.SIGTSTP)
        wait_for(lambda: state(term.pid) == "T" and state(child) == "T", what="both stopped")
        assert lflag(term.child_fd) & termios.ICANON
        os.kill(term.pid, signal.SIGCONT)
        term.expect("cont")
        term.sendline("quit")
        term.expect(pexpect.EOF)
        term.wait()
    assert json.loads(out.read_text())["exit_code"] == 0


@pytest.mark.parametrize("pty_mode", [False, True], ids=["pipes", "pty"])
def test_4_job_control_in_an_interactive_shell(scripts: dict[str, Path], tmp_path: Path, pty_mode: bool) -> None:
    log, out = tmp_path / "log", tmp_path / "outcome.json"
    opts: dict[str, Any] = {"out": str(out)} if pty_mode else {"out": str(out), "stdout_to": str(tmp_path / "so")}
    child = fake(scripts, "tty", str(log)) if pty_mode else fake(scripts, "signals", str(log))
    command = " ".join(shlex.quote(arg) for arg in driver_argv(scripts, opts, *child))
    env = {**driver_env(), "PS1": "PROMPT$ "}
    shell = pexpect.spawn("bash", ["--norc", "--noprofile", "-i"], env=env, dimensions=(24, 80), timeout=20)
    wrapper = 0
    try:
        shell.expect("PROMPT\\$ ")
        shell.sendline(command)
        pid = child_pid(log)
        wrapper = int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])  # its parent
        if pty_mode:
            shell.expect("ready")
        shell.sendcontrol("z")
        shell.expect("Stopped")
        shell.expect("PROMPT\\$ ")
        wait_for(lambda: state(wrapper) == "T" and state(pid) == "T", what="both stopped")
        shell.setwinsize(30, 100)
        shell.sendline("fg")
        if pty_mode:
            shell.expect("size 30x100")
            shell.sendline("quit")
        else:
            wait_for(lambda: state(pid) != "T" and state(wrapper) != "T", what="running again")
            os.kill(wrapper, signal.SIGTERM)
        shell.expect("PROMPT\\$ ")
        shell.sendline("exit")
        shell.expect(pexpect.EOF)
    finally:
        shell.close(force=True)
        if wrapper and alive(wrapper):  # a failed test must not leave the job behind (its child dies with it)
            os.kill(wrapper, signal.SIGKILL)
    outcome = json.loads(out.read_text())
    assert outcome["exit_code"] == 0 and outcome["used_pty"] is pty_mode
    if pty_mode:
        assert outcome["tty_restored"] is True


def test_5_child_starts_with_an_empty_signal_mask(scripts: dict[str, Path], tmp_path: Path) -> None:
    direct = subprocess.run(fake(scripts, "sigmask"), capture_output=True, check=True, stdin=subprocess.DEVNULL)
    _, stdout, _, _ = run_driver(scripts, tmp_path, fake(scripts, "sigmask"))
    assert stdout == direct.stdout
    assert b"SigBlk:\t0000000000000000" in stdout


@pytest.mark.parametrize("pty_mode", [False, True], ids=["pipes", "pty"])
def test_6_sigkill_of_the_wrapper_kills_the_child(scripts: dict[str, Path], tmp_path: Path, pty_mode: bool) -> None:
    log, out = tmp_path / "log", tmp_path / "outcome.json"
    argv = driver_argv(scripts, {"out": str(out)}, *fake(scripts, "sleep", str(log)))
    if pty_mode:
        with in_pty(argv) as term:
            child = child_pid(log)
            term.kill(signal.SIGKILL)
            wait_for(lambda: not alive(child), timeout=1.5, what="child gone")
    else:
        with spawned(argv, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL) as proc:
            child = child_pid(log)
            proc.kill()
            wait_for(lambda: not alive(child), timeout=1.5, what="child gone")


# ---------------------------------------------------------------------------------------------------
# 7-9: exit codes
# ---------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("code", [0, 1, 2, 127, 130, 255])
def test_7_child_exit_code_passes_through(scripts: dict[str, Path], tmp_path: Path, code: int) -> None:
    rc, _, _, outcome = run_driver(scripts, tmp_path, fake(scripts, "exit", str(code)))
    assert rc == code == outcome["exit_code"] == outcome["returncode"]
    assert outcome["reaped"] is True  # no zombie left


@pytest.mark.parametrize("signo", [signal.SIGTERM, signal.SIGKILL, signal.SIGSEGV, signal.SIGABRT])
def test_8_death_by_signal_is_128_plus_n(scripts: dict[str, Path], tmp_path: Path, signo: int) -> None:
    rc, _, _, outcome = run_driver(scripts, tmp_path, fake(scripts, "kill", str(int(signo))))
    assert rc == 128 + signo == outcome["exit_code"]
    assert outcome["returncode"] == -signo


def test_9_binary_not_found_is_127(scripts: dict[str, Path], tmp_path: Path) -> None:
    missing = tmp_path / "no" / "llama-server"
    rc, _, stderr, outcome = run_driver(scripts, tmp_path, [str(missing), "-m", "x"])
    assert rc == 127
    assert stderr.decode().strip() == f"safe-llama: {missing}: not found"
    assert "error" in outcome


@pytest.mark.parametrize("kind", ["no-x-bit", "directory"])
def test_9_not_executable_is_126(scripts: dict[str, Path], tmp_path: Path, kind: str) -> None:
    target = tmp_path / "llama-server"
    if kind == "directory":
        target.mkdir()
    else:
        target.write_text("#!/bin/sh\necho hi\n")
    rc, _, stderr, _ = run_driver(scripts, tmp_path, [str(target)])
    assert rc == 126
    assert str(target) in stderr.decode() and len(stderr.decode().strip().splitlines()) == 1


# ---------------------------------------------------------------------------------------------------
# 11-14: bytes
# ---------------------------------------------------------------------------------------------------


def test_11_all_256_byte_values_pass_unchanged_on_both_streams(scripts: dict[str, Path], tmp_path: Path) -> None:
    rc, stdout, stderr, outcome = run_driver(scripts, tmp_path, fake(scripts, "bytes"))
    data = bytes(range(256)) * 64
    assert rc == 0 and outcome["used_pty"] is False
    assert stdout == data
    assert stderr == data[::-1]


def test_11_stdin_bytes_and_eof_reach_the_child(scripts: dict[str, Path], tmp_path: Path) -> None:
    data = bytes(range(256)) * 4096  # 1 MiB, every value, \r\n and NUL included
    rc, stdout, stderr, _ = run_driver(scripts, tmp_path, fake(scripts, "cat"), stdin=data)
    assert rc == 7  # the child exits after EOF
    assert stdout == data
    assert stderr == b"EOF\n"


def test_11_no_terminal_in_pipe_mode(scripts: dict[str, Path], tmp_path: Path) -> None:
    (tmp_path / "log").touch()
    _, stdout, _, outcome = run_driver(scripts, tmp_path, fake(scripts, "tty", str(tmp_path / "log")))
    assert stdout.startswith(b"tty False False False\r\n")
    assert outcome["used_pty"] is False


def test_13_a_megabyte_without_newline_then_exit_loses_nothing(scripts: dict[str, Path], tmp_path: Path) -> None:
    rc, stdout, _, _ = run_driver(scripts, tmp_path, fake(scripts, "big"))
    assert rc == 0
    assert stdout == b"x" * (1 << 20) + b"END"


def test_13_a_byte_is_visible_at_once(scripts: dict[str, Path], tmp_path: Path) -> None:
    argv = driver_argv(scripts, {"out": str(tmp_path / "o.json")}, *fake(scripts, "trickle"))
    with spawned(argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE) as proc:
        assert proc.stdout is not None
        started = time.monotonic()
        assert os.read(proc.stdout.fileno(), 10) == b"A"  # while the child sleeps 3 s before "B"
        assert time.monotonic() - started < 2.0
        assert proc.stdout.read() == b"B"


def test_14_stderr_stays_separate(scripts: dict[str, Path], tmp_path: Path) -> None:
    rc, stdout, _, _ = run_driver(scripts, tmp_path, fake(scripts, "interleave"), stderr=subprocess.DEVNULL)
    assert rc == 0
    assert stdout == "".join(f"o{i}\n" for i in range(200)).encode()


def test_14_two_to_one_keeps_the_childs_order(scripts: dict[str, Path], tmp_path: Path) -> None:
    out = tmp_path / "o.json"
    proc = subprocess.run(
        driver_argv(scripts, {"out": str(out)}, *fake(scripts, "interleave")),
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        env=driver_env(),
        timeout=30,
        check=True,
    )
    assert proc.stdout == "".join(f"o{i}\ne{i}\n" for i in range(200)).encode()


def test_13_a_reader_that_goes_away_gives_the_child_sigpipe(scripts: dict[str, Path], tmp_path: Path) -> None:
    out = tmp_path / "o.json"
    argv = driver_argv(scripts, {"out": str(out)}, *fake(scripts, "flood"))
    with spawned(argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL) as proc:
        assert proc.stdout is not None
        os.read(proc.stdout.fileno(), 10)
        proc.stdout.close()
        assert proc.wait(timeout=10) == 128 + signal.SIGPIPE  # as if it had written to the pipe itself
    assert json.loads(out.read_text())["returncode"] == -signal.SIGPIPE


# ---------------------------------------------------------------------------------------------------
# 12-13: the terminal
# ---------------------------------------------------------------------------------------------------


def test_12_pty_has_the_terminals_size_and_follows_sigwinch(scripts: dict[str, Path], tmp_path: Path) -> None:
    log, out = tmp_path / "log", tmp_path / "outcome.json"
    with in_pty(driver_argv(scripts, {"out": str(out)}, *fake(scripts, "tty", str(log))), rows=33, cols=101) as term:
        term.expect("tty True True True")
        term.expect("size 33x101")
        term.expect("ready")
        term.setwinsize(50, 160)
        term.expect("size 50x160")
        term.sendline("quit")
        term.expect(pexpect.EOF)
        term.wait()
    outcome = json.loads(out.read_text())
    assert outcome["used_pty"] is True and outcome["tty_restored"] is True


def test_12_raw_passthrough_with_no_escape_character(scripts: dict[str, Path], tmp_path: Path) -> None:
    (tmp_path / "log").touch()
    out = tmp_path / "outcome.json"
    with in_pty(driver_argv(scripts, {"out": str(out)}, *fake(scripts, "tty", str(tmp_path / "log"), "raw"))) as term:
        term.expect("ready")
        for key in (b"\x1d", b"\x03", b"\x1a", b"\x1c", b"\x04", b"\xff", b"\r"):  # ^] ^C ^Z ^\ ^D
            term.send(key)
            term.expect(f"key {key.hex()}")
        term.send(b"q")
        term.expect(pexpect.EOF)
        term.wait()
    assert term.exitstatus == 0
    assert json.loads(out.read_text())["tty_restored"] is True


def test_12_terminal_restored_when_launch_raises(scripts: dict[str, Path], tmp_path: Path) -> None:
    log, out = tmp_path / "log", tmp_path / "outcome.json"
    opts = {"out": str(out), "raise_in_watcher": True}
    with in_pty(driver_argv(scripts, opts, *fake(scripts, "tty", str(log)))) as term:
        term.expect(pexpect.EOF)
        term.wait()
    outcome = json.loads(out.read_text())
    assert outcome == {"exception": "watcher failed", "tty_restored": True}
    assert not alive(child_pid(log))  # the child did not outlive the loop


def test_13_pty_output_at_exit_is_not_lost(scripts: dict[str, Path], tmp_path: Path) -> None:
    with in_pty(driver_argv(scripts, {"out": str(tmp_path / "o.json")}, *fake(scripts, "big"))) as term:
        term.expect(pexpect.EOF, timeout=30)
        term.wait()
        received = term.before
    assert received == b"x" * (1 << 20) + b"END"


# ---------------------------------------------------------------------------------------------------
# 21-22: what is a failure, and stopping a child that printed one
# ---------------------------------------------------------------------------------------------------


def test_21_a_corrupt_model_is_not_a_memory_failure(scripts: dict[str, Path], tmp_path: Path) -> None:
    child = fake(scripts, "replay", str(LOGS / "server-bad-magic.log"), "1")
    rc, _, stderr, outcome = run_driver(scripts, tmp_path, child, probe="server")
    assert rc == 1
    assert stderr == BAD_MAGIC_LOG  # the child's message, shown unchanged
    assert outcome["failure"]["kind"] == "not_memory" and outcome["retry"] is False


def test_21_an_allocation_failure_is_a_memory_failure(scripts: dict[str, Path], tmp_path: Path) -> None:
    child = fake(scripts, "replay", str(LOGS / "server-kv-oom.log"), "1")
    rc, _, _, outcome = run_driver(scripts, tmp_path, child, probe="server")
    assert rc == 1 and outcome["stopped_by_us"] is False  # it exited by itself within the grace time
    assert outcome["failure"]["kind"] == "alloc" and outcome["retry"] is True
    assert outcome["failure"]["requested_bytes"] == 6144393216


def test_22_allocation_error_while_running_stops_the_child(scripts: dict[str, Path], tmp_path: Path) -> None:
    child = fake(scripts, "alloc-and-run", str(tmp_path / "log"), OPENVINO_LINE)
    started = time.monotonic()
    rc, _, stderr, outcome = run_driver(scripts, tmp_path, child, probe="server", grace=0.3)
    assert time.monotonic() - started < 10
    assert OPENVINO_LINE.encode() in stderr
    assert outcome["stopped_by_us"] is True and outcome["retry"] is True
    assert outcome["returncode"] == -signal.SIGTERM and rc == 128 + signal.SIGTERM
    assert outcome["failure"]["limit_bytes"] == 4294959104
    assert outcome["failure"]["requested_bytes"] == 7516192768


def test_22_a_child_that_ignores_sigterm_is_killed(scripts: dict[str, Path], tmp_path: Path) -> None:
    child = fake(scripts, "alloc-and-run", str(tmp_path / "log"), OPENVINO_LINE, "ignore-term")
    rc, _, _, outcome = run_driver(scripts, tmp_path, child, grace=0.2, kill_after=0.5)
    assert outcome["returncode"] == -signal.SIGKILL and rc == 137
    assert outcome["stopped_by_us"] is True and outcome["failure"]["kind"] == "alloc"


def test_readiness_by_health_then_nothing_is_scanned(scripts: dict[str, Path], tmp_path: Path) -> None:
    log, out, port = tmp_path / "log", tmp_path / "outcome.json", free_port()
    child = fake(scripts, "server", str(log), str(port))
    argv = driver_argv(scripts, {"out": str(out), "probe": "server"}, *child, "--port", str(port))
    with spawned(argv, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE) as proc:
        child_pid(log)
        assert proc.stderr is not None
        assert b"insufficient memory" in proc.stderr.readline()  # printed after /health said 200
        time.sleep(0.5)
        assert proc.poll() is None  # not stopped: after readiness nothing is scanned
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=10) == 0
    outcome = json.loads(out.read_text())
    assert outcome["ready"] is True and outcome["failure"] is None and outcome["stopped_by_us"] is False


# ---------------------------------------------------------------------------------------------------
# 24-25: never ourselves, never a shell
# ---------------------------------------------------------------------------------------------------


def test_25_arguments_reach_the_child_unchanged(scripts: dict[str, Path], tmp_path: Path) -> None:
    marker = tmp_path / "pwned"
    args = [GUARD_ENV, f"$(touch {marker})", f"; touch {marker}", "'quoted'", '"double"', "a b", "line\nbreak", "*"]
    rc, stdout, _, _ = run_driver(scripts, tmp_path, fake(scripts, "argv", *args))
    assert rc == 0
    seen = json.loads(stdout)
    assert seen["argv"] == args
    assert not marker.exists()
    assert seen["guard"] == str(seen["guard"]) and seen["guard"].isdigit()  # 24: the child knows its wrapper


# ---------------------------------------------------------------------------------------------------
# The real llama.cpp (slow)
# ---------------------------------------------------------------------------------------------------


def _wait_port_closed(port: int, timeout: float) -> None:
    def closed() -> bool:
        with socket.socket() as s:
            return s.connect_ex(("127.0.0.1", port)) != 0

    wait_for(closed, timeout=timeout, what=f"port {port} closed")


@pytest.mark.slow
def test_real_server_ready_by_health_and_sigterm_stops_it_cleanly(
    scripts: dict[str, Path], tmp_path: Path, llama_bin: Path, bundled_model: Path
) -> None:
    out, port = tmp_path / "outcome.json", free_port()
    server = [str(llama_bin / "llama-server"), "-m", str(bundled_model), "-c", "4096", "--port", str(port)]
    argv = driver_argv(scripts, {"out": str(out), "probe": "server"}, *server)
    with spawned(argv, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE) as proc:
        stderr = proc.stderr
        assert stderr is not None
        wait_for(lambda: b"listening on" in stderr.readline(), timeout=60, what="server listening")
        time.sleep(0.5)  # the probe polls every 0.2 s
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=30) == 0
    outcome = json.loads(out.read_text())
    assert outcome["ready"] is True and outcome["failure"] is None
    assert outcome["signals_forwarded"] == [signal.SIGTERM] and outcome["returncode"] == 0
    _wait_port_closed(port, 1)


@pytest.mark.slow
@pytest.mark.parametrize("sender", ["kill-pgid", "timeout"])
def test_real_server_group_sigterm_is_one_clean_shutdown(
    scripts: dict[str, Path], tmp_path: Path, llama_bin: Path, bundled_model: Path, sender: str
) -> None:
    """`kill -TERM -PGID` and `timeout` reach the wrapper's group: llama-server gets one SIGTERM, exits 0,
    and never says "Received second interrupt"."""
    out, port = tmp_path / "outcome.json", free_port()
    server = [str(llama_bin / "llama-server"), "-m", str(bundled_model), "-c", "4096", "--port", str(port)]
    argv = driver_argv(scripts, {"out": str(out), "probe": "server"}, *server)
    if sender == "timeout":
        argv = ["timeout", "-s", "TERM", "20", *argv]
    with spawned(argv, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                 start_new_session=True) as proc:  # fmt: skip
        stderr = proc.stderr
        assert stderr is not None
        wait_for(lambda: b"listening on" in stderr.readline(), timeout=60, what="server listening")
        if sender == "kill-pgid":
            os.killpg(proc.pid, signal.SIGTERM)
        assert proc.wait(timeout=60) == (124 if sender == "timeout" else 0)
        rest = stderr.read()
    assert b"second interrupt" not in rest
    outcome = json.loads(out.read_text())
    assert outcome["signals_forwarded"] == [signal.SIGTERM] and outcome["returncode"] == 0
    assert outcome["exit_code"] == 0
    _wait_port_closed(port, 1)


@pytest.mark.slow
def test_real_server_sigkill_of_the_wrapper_frees_the_port(
    scripts: dict[str, Path], tmp_path: Path, llama_bin: Path, bundled_model: Path
) -> None:
    port = free_port()
    server = [str(llama_bin / "llama-server"), "-m", str(bundled_model), "-c", "4096", "--port", str(port)]
    argv = driver_argv(scripts, {"out": str(tmp_path / "o.json"), "probe": "server"}, *server)
    with spawned(argv, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE) as proc:
        stderr = proc.stderr
        assert stderr is not None
        wait_for(lambda: b"listening on" in stderr.readline(), timeout=60, what="server listening")
        proc.kill()
        _wait_port_closed(port, 1.5)


def _limit_address_space(limit: int) -> Callable[[], None]:
    import resource

    return lambda: resource.setrlimit(resource.RLIMIT_AS, (limit, limit))


@pytest.mark.slow
def test_real_kv_allocation_failure_is_a_memory_failure(
    scripts: dict[str, Path], tmp_path: Path, llama_bin: Path, bundled_model: Path
) -> None:
    out = tmp_path / "outcome.json"
    server = [str(llama_bin / "llama-server"), "-m", str(bundled_model), "-c", "2000000", "--port", "0"]
    proc = subprocess.run(
        driver_argv(scripts, {"out": str(out), "probe": "server"}, *server),
        stdin=subprocess.DEVNULL,
        capture_output=True,
        env=driver_env(),
        timeout=120,
        preexec_fn=_limit_address_space(3_000_000 * 1024),  # ulimit -v 3000000, for the wrapper and child
    )
    outcome = json.loads(out.read_text())
    assert proc.returncode == 1
    assert b"ggml_aligned_malloc: insufficient memory" in proc.stderr
    assert outcome["failure"]["kind"] == "alloc" and outcome["retry"] is True
    assert outcome["failure"]["requested_bytes"] == 6144393216 and outcome["failure"]["buffer"] == "CPU"


@pytest.mark.slow
@pytest.mark.parametrize("case", ["truncated-model", "bad-argument", "port-in-use"])
def test_real_failures_that_are_not_memory(
    scripts: dict[str, Path], tmp_path: Path, llama_bin: Path, bundled_model: Path, case: str
) -> None:
    server = [str(llama_bin / "llama-server"), "-m", str(bundled_model), "-c", "4096"]
    holder = socket.socket()
    holder.bind(("127.0.0.1", 0))
    holder.listen()
    if case == "truncated-model":
        truncated = tmp_path / "truncated.gguf"
        truncated.write_bytes(bundled_model.read_bytes()[:1_000_000])
        server[2] = str(truncated)
        server += ["--port", "0"]
    elif case == "bad-argument":
        server += ["--no-such-flag"]
    else:
        server += ["--port", str(holder.getsockname()[1])]
    with holder:
        rc, _, stderr, outcome = run_driver(scripts, tmp_path, server, probe="server", timeout=60)
    assert rc == 1
    assert outcome["failure"]["kind"] == "not_memory" and outcome["retry"] is False
    assert outcome["ready"] is False
    assert stderr  # the child's own message reached the user


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
