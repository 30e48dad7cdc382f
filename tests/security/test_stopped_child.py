"""Issue 33's row "llama.cpp SIGSTOPped": safe-llama waited forever without a word, and SIGTERM to it then hung
until SIGCONT. Now the stop is said in one line within a bounded time, its SIGCONT too, and SIGTERM reaches the
stopped child: SIGCONT, then the grace period (supervise_child's kill_after, 5 s), then SIGKILL. The llama.cpp here
is tests/fakes/fake_openvino_llama.py (a stop needs no real model), and a one-line Python program that ignores
SIGTERM (what llama.cpp busy in a kernel does), under a driver that calls supervise_child as the launcher does."""

from __future__ import annotations

import json
import os
import queue
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from tests import ROOT
from tests.attempts.test_launch import _fake_bin
from tests.llama_run import free_port
from tests.tiny_gguf import LLAMA_3B, write_metadata_gguf

SAID_WITHIN = 5.0  # seconds a stop may take to be said (it is said at the SIGCHLD, in milliseconds)
MARGIN = 5.0  # seconds beyond the grace period for both to end


def _lines(stream: object) -> queue.Queue[str]:
    lines: queue.Queue[str] = queue.Queue()

    def pump() -> None:
        for raw in stream:  # type: ignore[attr-defined]
            lines.put(raw.decode(errors="replace").rstrip("\n"))

    threading.Thread(target=pump, daemon=True).start()
    return lines


def _wait_for(lines: queue.Queue[str], words: str, within: float, seen: list[str]) -> str:
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        try:
            line = lines.get(timeout=max(deadline - time.monotonic(), 0.01))
        except queue.Empty:
            break
        seen.append(line)
        if words in line:
            return line
    raise AssertionError(f"no line with {words!r} within {within} s: {seen[-20:]}")


def _child_of(pid: int) -> int:
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        children = Path(f"/proc/{pid}/task/{pid}/children").read_text().split()
        if children:
            return int(children[0])
        time.sleep(0.05)
    raise AssertionError("no child")


def test_a_stopped_server_is_said_and_sigterm_ends_both(tmp_path: Path, clean_env: dict[str, str]) -> None:
    model = write_metadata_gguf(tmp_path / "Llama-3.2-3B-Instruct-Q4_K_M.gguf", "llama", LLAMA_3B)
    env = {**clean_env, "XDG_CACHE_HOME": str(tmp_path / "cache"), "SAFE_LLAMA_BIN_DIR": str(_fake_bin(tmp_path)),
           "FAKE_ARGV_LOG": str(tmp_path / "argv.log"), "FAKE_TOOL": "server", "FAKE_SERVE_SECONDS": "120",
           "PYTHONPATH": str(ROOT)}  # fmt: skip
    proc = subprocess.Popen(
        [sys.executable, "-m", "safe_llama", "server", "-m", str(model), "-c", "8192", "--port", str(free_port())],
        env=env, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
    )  # fmt: skip
    seen: list[str] = []
    try:
        lines = _lines(proc.stderr)
        _wait_for(lines, "model loaded", 60, seen)
        child = _child_of(proc.pid)
        os.kill(child, signal.SIGSTOP)
        stopped = _wait_for(lines, "is stopped", SAID_WITHIN, seen)
        assert stopped == (
            f"safe-llama: llama-server (pid {child}) is stopped (SIGSTOP): it does nothing until it gets SIGCONT "
            f"(kill -CONT {child}); SIGTERM to safe-llama ends it"
        )
        os.kill(child, signal.SIGCONT)
        assert _wait_for(lines, "continued", SAID_WITHIN, seen) == f"safe-llama: llama-server (pid {child}) continued"
        os.kill(child, signal.SIGSTOP)
        _wait_for(lines, "is stopped", SAID_WITHIN, seen)
        began = time.monotonic()
        proc.send_signal(signal.SIGTERM)
        code = proc.wait(timeout=5.0 + MARGIN)  # the old code hung here until SIGCONT
        took = time.monotonic() - began
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert not Path(f"/proc/{child}").exists()
    assert code == 0 and took < 5.0 + MARGIN, (code, took, seen)  # the fake, continued, ends on SIGTERM as llama-server


_DRIVER = """
# test driver (not a fake): supervise_child as the launcher calls it, its own lines on stderr
import json, sys
from safe_llama.diagnosis.signatures import load_table
from safe_llama.process.startup import StartupWatcher
from safe_llama.process.supervise import supervise_child
outcome = supervise_child(sys.argv[2:], {"PATH": "/usr/bin:/bin"}, watcher=StartupWatcher(load_table()),
                          use_pty=False, kill_after=float(sys.argv[1]),
                          say=lambda line: print("safe-llama: " + line, file=sys.stderr, flush=True))
print(json.dumps({"returncode": outcome.returncode, "forwarded": outcome.signals_forwarded,
                  "without_evidence": outcome.killed_without_evidence}), flush=True)
sys.exit(outcome.exit_code)
"""

DEAF = "import signal, time\nsignal.signal(signal.SIGTERM, signal.SIG_IGN)\ntime.sleep(120)"


@pytest.mark.slow
def test_sigterm_reaches_a_stopped_child_that_ignores_it_then_sigkill(tmp_path: Path) -> None:
    grace = 2.0
    proc = subprocess.Popen(
        [sys.executable, "-c", _DRIVER, str(grace), sys.executable, "-c", DEAF],
        env={**os.environ, "PYTHONPATH": str(ROOT)}, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
    )  # fmt: skip
    seen: list[str] = []
    try:
        lines = _lines(proc.stderr)
        child = _child_of(proc.pid)
        time.sleep(0.5)  # its SIGTERM handler set
        os.kill(child, signal.SIGSTOP)
        _wait_for(lines, f"(pid {child}) is stopped (SIGSTOP)", SAID_WITHIN, seen)
        began = time.monotonic()
        proc.send_signal(signal.SIGTERM)
        code = proc.wait(timeout=grace + MARGIN)
        took = time.monotonic() - began
        assert proc.stdout is not None
        result = json.loads(proc.stdout.read().decode().strip().splitlines()[-1])
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert grace <= took < grace + MARGIN, took
    assert code == 128 + signal.SIGKILL and result["returncode"] == -signal.SIGKILL  # README: 128+N for signal N
    assert result["forwarded"] == [signal.SIGTERM]
    assert result["without_evidence"] is None  # our own SIGKILL: nothing to explain
