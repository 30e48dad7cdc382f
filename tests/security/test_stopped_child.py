"""Issue 33's row "llama.cpp SIGSTOPped": safe-llama waited forever without a word, and SIGTERM to it then hung
until SIGCONT. Now the stop is said in one line within a bounded time, its SIGCONT too, and SIGTERM reaches the
stopped child: SIGCONT, then the grace period (supervise_child's kill_after, 5 s), then SIGKILL. The llama.cpp here
is tests/fakes/fake_openvino_llama.py (a stop needs no real model), and a one-line Python program that ignores
SIGTERM (what llama.cpp busy in a kernel does), under a driver that calls supervise_child as the launcher does."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests import ROOT
from tests.security.fake_server import child_of, lines_of, start_server, wait_for

SAID_WITHIN = 5.0  # seconds a stop may take to be said (it is said at the SIGCHLD, in milliseconds)
MARGIN = 5.0  # seconds beyond the grace period for both to end


def test_a_stopped_server_is_said_and_sigterm_ends_both(tmp_path: Path, clean_env: dict[str, str]) -> None:
    proc = start_server(tmp_path, clean_env, tmp_path / "cache")
    seen: list[str] = []
    try:
        lines = lines_of(proc.stderr)
        wait_for(lines, "model loaded", 60, seen)
        child = child_of(proc.pid)
        os.kill(child, signal.SIGSTOP)
        stopped = wait_for(lines, "is stopped", SAID_WITHIN, seen)
        assert stopped == (
            f"safe-llama: llama-server (pid {child}) is stopped (SIGSTOP): it does nothing until it gets SIGCONT "
            f"(kill -CONT {child}); SIGTERM to safe-llama ends it"
        )
        os.kill(child, signal.SIGCONT)
        assert wait_for(lines, "continued", SAID_WITHIN, seen) == f"safe-llama: llama-server (pid {child}) continued"
        os.kill(child, signal.SIGSTOP)
        wait_for(lines, "is stopped", SAID_WITHIN, seen)
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
        lines = lines_of(proc.stderr)
        child = child_of(proc.pid)
        time.sleep(0.5)  # its SIGTERM handler set
        os.kill(child, signal.SIGSTOP)
        wait_for(lines, f"(pid {child}) is stopped (SIGSTOP)", SAID_WITHIN, seen)
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
