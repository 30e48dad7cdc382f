"""A real memory cgroup (systemd's MemoryMax= is the cgroup's memory.max): the plan stays under it, and an
OOM kill during start-up (prediction off) is a memory failure that is retried. Needs permission to create
a cgroup (root here); where the machine refuses, the test says so and is skipped."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests import ROOT
from tests.llama_run import free_port, healthy

LIMIT = 1536 << 20


def _make_cgroup() -> tuple[Path, str]:
    """(directory, procs file) of a new memory cgroup limited to LIMIT, v2 or v1."""
    name = f"safe-llama-test-{os.getpid()}"
    v2 = Path("/sys/fs/cgroup/cgroup.controllers")
    if v2.is_file() and "memory" in v2.read_text():
        folder = Path("/sys/fs/cgroup") / name
        folder.mkdir()
        (folder / "memory.max").write_text(str(LIMIT))
        return folder, "cgroup.procs"
    folder = Path("/sys/fs/cgroup/memory") / name
    folder.mkdir()
    (folder / "memory.limit_in_bytes").write_text(str(LIMIT))
    return folder, "cgroup.procs"


@pytest.fixture
def cgroup() -> Iterator[tuple[Path, str]]:
    try:
        folder, procs = _make_cgroup()
    except OSError as err:
        pytest.skip(f"this machine does not allow creating a memory cgroup: {err}")

    def enter() -> None:
        (folder / procs).write_text(str(os.getpid()))

    try:  # a process must be able to join it (cgroup v2's no-internal-process rule, delegation)
        subprocess.run(["true"], preexec_fn=enter, check=True, timeout=30)
    except (OSError, subprocess.SubprocessError) as err:
        folder.rmdir()
        pytest.skip(f"this machine does not let a process join a new memory cgroup: {err}")
    yield folder, procs
    for _ in range(50):
        try:
            folder.rmdir()
            return
        except OSError:
            time.sleep(0.1)


def _serve_in(cgroup: tuple[Path, str], args: list[str], env: dict[str, str]) -> tuple[bool, int, str]:
    folder, procs = cgroup

    def enter() -> None:
        (folder / procs).write_text(str(os.getpid()))

    port = free_port()
    proc = subprocess.Popen(
        [sys.executable, "-m", "safe_llama", *args, "--port", str(port)],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        preexec_fn=enter,
    )
    ready = False
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and proc.poll() is None:
        if healthy(port):
            ready = True
            time.sleep(0.5)
            break
        time.sleep(0.1)
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=60)
    return ready, proc.returncode, err.decode(errors="replace")


@pytest.mark.slow
def test_plan_stays_under_memory_max(
    cgroup: tuple[Path, str], tmp_path: Path, llama_bin: Path, clean_env: dict[str, str]
) -> None:
    env = {**clean_env, "SAFE_LLAMA_BIN_DIR": str(llama_bin), "XDG_CACHE_HOME": str(tmp_path)}
    ready, code, err = _serve_in(cgroup, ["server", "-c", "2000000"], env)
    assert ready and code == 0, err[-3000:]
    assert "cgroup" in err and "the largest that fits" in err
    assert "attempt 1 failed" not in err


@pytest.mark.slow
def test_oom_kill_during_start_up_is_retried(
    cgroup: tuple[Path, str], tmp_path: Path, llama_bin: Path, clean_env: dict[str, str]
) -> None:
    env = {**clean_env, "SAFE_LLAMA_BIN_DIR": str(llama_bin), "XDG_CACHE_HOME": str(tmp_path)}
    ready, code, err = _serve_in(cgroup, ["--no-predict", "server", "-c", "2000000"], env)
    assert ready and code == 0, err[-3000:]
    assert "safe-llama: attempt 1 failed: killed by SIGKILL while" in err and "oom_kill rose" in err


# The wrapper's side only (no llama.cpp): a child that outgrows the cgroup is OOM-killed, one that a user
# kills is not, and only the first is a memory failure.
_DRIVER = """
import json, sys
from safe_llama.run.signatures import load_table
from safe_llama.run.supervise import SignatureWatcher, launch
outcome = launch(sys.argv[1:], {"PATH": "/usr/bin:/bin"}, watcher=SignatureWatcher(load_table()), use_pty=False)
print(json.dumps({"returncode": outcome.returncode, "retry": outcome.retry,
                  "kind": outcome.failure.kind if outcome.failure else None,
                  "evidence": outcome.failure.evidence if outcome.failure else None}))
"""


def _launch_in(cgroup: tuple[Path, str], child: list[str]) -> dict[str, object]:
    import json

    folder, procs = cgroup

    def enter() -> None:
        (folder / procs).write_text(str(os.getpid()))

    done = subprocess.run(
        [sys.executable, "-c", _DRIVER, *child],
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        capture_output=True,
        text=True,
        timeout=60,
        preexec_fn=enter,
        check=False,
    )
    result: dict[str, object] = json.loads(done.stdout.strip().splitlines()[-1])
    return result


def test_an_oom_kill_in_the_cgroup_is_evidence(cgroup: tuple[Path, str]) -> None:
    hog = [sys.executable, "-c", "b = []\nwhile True: b.append(bytearray(64 << 20))"]
    outcome = _launch_in(cgroup, hog)
    assert outcome["returncode"] == -signal.SIGKILL
    assert outcome["kind"] == "oom_killed" and outcome["retry"] is True
    assert "oom_kill" in str(outcome["evidence"]) or "failcnt" in str(outcome["evidence"])


def test_a_user_sigkill_in_the_cgroup_is_not_memory(cgroup: tuple[Path, str]) -> None:
    outcome = _launch_in(cgroup, [sys.executable, "-c", "import os, signal; os.kill(os.getpid(), signal.SIGKILL)"])
    assert outcome["returncode"] == -signal.SIGKILL
    assert outcome["kind"] == "signal" and outcome["retry"] is False and outcome["evidence"] is None
