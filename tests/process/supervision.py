"""Driving supervise_child() from a process of its own in tests: DRIVER (the wrapper, as the launcher calls
supervise_child()), FAKE (a fake llama.cpp for what the real one cannot show on demand) and the helpers around them.

A test support module, not a test: tests/process/conftest.py writes the two scripts (the `scripts` fixture) for
test_supervise.py, test_relay.py, test_signals.py and test_readiness.py. Numbers in test names there refer
to /work/shared/reference/wrapper-behaviour.md.
"""

from __future__ import annotations

import contextlib
import json
import os
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

from tests import ROOT

DRIVER = """\
# test driver (not a fake): the wrapper, calling safe_llama.process.supervise.supervise_child() the way the CLI does.
import dataclasses, json, os, sys, termios
from safe_llama.errors import SafeLlamaError
from safe_llama.process.readiness import probe_for
from safe_llama.diagnosis.signatures import load_table
from safe_llama.process.startup import StartupWatcher
from safe_llama.process.supervise import supervise_child


class RaisingWatcher(StartupWatcher):
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
watcher = (RaisingWatcher if opts.get("raise_in_watcher") else StartupWatcher)(load_table())
probe = probe_for(opts["probe"], argv, os.environ) if opts.get("probe") else None
result = {}
code = 0
try:
    outcome = supervise_child(
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


def driver_env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("LLAMA_ARG_", "SAFE_LLAMA_"))}
    env["PYTHONPATH"] = str(ROOT)
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
