"""Tests for safe_llama/process/supervise.py: exit codes, start-up watching, stopping a child that printed an
allocation failure, and the real llama-server under the wrapper.

The wrapper side runs as a separate process (DRIVER in tests/process/supervision.py, calling supervise_child() as
the CLI does) so that signals, terminals and SIGKILL can be aimed at it. Behaviours no real llama.cpp shows on demand
(an allocation error printed by a process that keeps running, a given exit code) come from FAKE, a fake
llama.cpp; everything that can run for real runs the pinned llama.cpp on the bundled model (slow tests).
Numbers in test names refer to /work/shared/reference/wrapper-behaviour.md. The byte relay, the signals and
the readiness probes have their own test files (test_relay.py, test_signals.py, test_readiness.py).
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from safe_llama.constants import GUARD_ENV
from tests import FIXTURES
from tests.process.supervision import (
    child_pid,
    driver_argv,
    driver_env,
    fake,
    free_port,
    run_driver,
    spawned,
    wait_for,
)

LOGS = FIXTURES / "logs"
OPENVINO_LINE = next(line for line in (LOGS / "openvino-seed.log").read_text().splitlines() if "[GPU] Exceeded" in line)
BAD_MAGIC_LOG = (LOGS / "server-bad-magic.log").read_bytes().split(b"\n", 1)[1]


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


@pytest.mark.slow
def test_22_a_child_that_ignores_sigterm_is_killed(scripts: dict[str, Path], tmp_path: Path) -> None:
    child = fake(scripts, "alloc-and-run", str(tmp_path / "log"), OPENVINO_LINE, "ignore-term")
    rc, _, _, outcome = run_driver(scripts, tmp_path, child, grace=0.2, kill_after=0.5)
    assert outcome["returncode"] == -signal.SIGKILL and rc == 137
    assert outcome["stopped_by_us"] is True and outcome["failure"]["kind"] == "alloc"


@pytest.mark.slow
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
