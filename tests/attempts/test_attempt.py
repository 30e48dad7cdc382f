"""Tests for safe_llama/attempts/attempt.py's run_attempt, the one attempt body of a launch: started by it (the
normal path) or adopted from an early start (a child already running on pipes, as remembered/early.py leaves it),
with what goes around it (systemd's notify messages, the launch record's window closed where the child
starts, the ready actions).

Each attempt runs in a process of its own (DRIVER, the wrapper's side: the supervisor blocks and forwards
signals, which wants a main thread of its own) around a tiny real child (/bin/sh), for tool `completion`,
whose readiness is the first byte on stdout.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tests import ROOT

DRIVER = """\
import json, os, sys
from safe_llama.diagnosis.signatures import load_table
from safe_llama.process import fork_exec
from safe_llama.attempts.attempt import Supervision, run_attempt
from safe_llama.attempts.say import Say
from safe_llama.process.sdnotify import Notifier

opts = json.loads(sys.argv[1])
argv = sys.argv[2:]
env = dict(os.environ)


class Window:
    # the launch record's window (record_window.Recorder): run_attempt closes it where the child starts
    closed = 0

    def close(self):
        Window.closed += 1


started = None
if opts["adopt"]:
    # as remembered/early.py starts attempt 1: the watched signals blocked, the child on pipes, its own group
    _, mask = fork_exec.block_watched(False)
    proc, out, err = fork_exec.spawn_on_pipes(argv, fork_exec.supervised_env(env, {}, os.getpid()), (None, 1, 2), None)
    started = fork_exec.Started(proc.pid, out, err, {}, False, mask)
shared = Supervision(Say(env), Notifier(env), load_table())
outcome = run_attempt(
    shared, "completion", argv, env, number=opts["number"], status=opts["status"],
    recorder=Window() if opts["window"] else None, started=started,
)
with open(opts["out"], "w") as f:
    json.dump({
        "exit_code": outcome.exit_code, "ready": outcome.ready, "retry": outcome.retry,
        "failure": outcome.failure.line if outcome.failure else None, "pid": outcome.pid,
        "adopted_pid": started.pid if started else None, "closed": Window.closed,
    }, f)
"""

READY_THEN_EXIT = "printf 'tokens'; exit 0"
# llama.cpp's words when a buffer does not fit (configs/signatures.toml: an allocation failure), then exit 1
FAILS_FOR_MEMORY = (
    "echo 'ggml_backend_cuda_buffer_type_alloc_buffer: allocating 8454.00 MiB on device 0: cudaMalloc failed:"
    " out of memory' >&2; echo 'alloc_tensor_range: failed to allocate CUDA0 buffer of size 8864530432' >&2; exit 1"
)


def _attempt(
    tmp_path: Path, script: str, *, adopt: bool, number: int = 1, window: bool = False
) -> tuple[dict[str, Any], list[str], subprocess.CompletedProcess[str]]:
    """One run_attempt of `sh -c script` in DRIVER: (what it returned, the notify messages sent, the driver)."""
    out = tmp_path / "out.json"
    opts = {"adopt": adopt, "number": number, "status": f"attempt {number}: sh", "window": window, "out": str(out)}
    notify = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    notify.bind(str(tmp_path / "notify"))
    env = {
        "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
        "PYTHONPATH": str(ROOT),
        "NOTIFY_SOCKET": str(tmp_path / "notify"),
        "XDG_CACHE_HOME": str(tmp_path / "cache"),
    }
    try:
        done = subprocess.run(
            [sys.executable, "-c", DRIVER, json.dumps(opts), "/bin/sh", "-c", script],
            env=env,
            stdin=subprocess.DEVNULL,
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
        notify.setblocking(False)
        messages = []
        while True:
            try:
                messages.append(notify.recv(4096).decode())
            except BlockingIOError:
                break
    finally:
        notify.close()
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(out.read_text()), messages, done


@pytest.mark.parametrize("adopt", [False, True], ids=["started", "adopted"])
def test_a_ready_attempt_tells_systemd_and_hands_back_the_exit_code(tmp_path: Path, adopt: bool) -> None:
    result, messages, done = _attempt(tmp_path, READY_THEN_EXIT, adopt=adopt, number=2)
    assert (result["exit_code"], result["ready"], result["retry"], result["failure"]) == (0, True, False, None)
    assert done.stdout == "tokens"  # the child's bytes, relayed unchanged
    assert messages == [
        "STATUS=attempt 2: sh",
        "EXTEND_TIMEOUT_USEC=30000000",
        "READY=1\nSTATUS=ready (attempt 2)",
        "STOPPING=1",
    ]
    if adopt:  # the child early.py started, not a second one
        assert result["pid"] == result["adopted_pid"]


@pytest.mark.parametrize("adopt", [False, True], ids=["started", "adopted"])
def test_an_attempt_that_fails_for_memory_is_to_be_retried(tmp_path: Path, adopt: bool) -> None:
    result, messages, done = _attempt(tmp_path, FAILS_FOR_MEMORY, adopt=adopt)
    assert (result["exit_code"], result["ready"], result["retry"]) == (1, False, True)
    assert result["failure"].endswith("cudaMalloc failed: out of memory")  # the first line that said so
    assert "failed to allocate CUDA0 buffer of size 8864530432" in done.stderr  # relayed all the same
    assert messages == ["STATUS=attempt 1: sh", "EXTEND_TIMEOUT_USEC=30000000"]  # never ready, never stopping


def test_an_exit_that_is_not_memory_is_the_exit_code_and_no_retry(tmp_path: Path) -> None:
    result, messages, _ = _attempt(tmp_path, "echo 'error: invalid argument: -x' >&2; exit 3", adopt=False)
    assert (result["exit_code"], result["ready"], result["retry"]) == (3, False, False)
    assert result["failure"] == "error: invalid argument: -x"  # said, not retried
    assert "READY=1" not in "\n".join(messages)


def test_the_launch_record_window_closes_where_the_child_starts(tmp_path: Path) -> None:
    assert _attempt(tmp_path, READY_THEN_EXIT, adopt=False, window=True)[0]["closed"] == 1
    again = tmp_path / "again"
    again.mkdir()
    assert _attempt(again, READY_THEN_EXIT, adopt=False)[0]["closed"] == 0
