"""`safe-llama rpc-server`: the real ggml-rpc-server of the pinned build, supervised: READY=1 when its port
listens, its exit code and its messages unchanged, one line when a cgroup caps it below what it offers."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from subprocess import Popen

import pytest

from safe_llama.commands.rpc_server import memory_note
from safe_llama.process.readiness import listening
from tests import ROOT
from tests.llama_run import free_port

GIB = 1 << 30


def test_listening_reads_the_kernels_table() -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
        assert not listening(port)  # bound, not listening
        s.listen()
        assert listening(port)
    assert not listening(port)


def test_memory_note() -> None:
    assert memory_note(24 * GIB, None, "") is None
    assert memory_note(24 * GIB, 32 * GIB, "its cgroup (/x)") is None
    note = memory_note(24 * GIB, GIB, "its cgroup (/x)", "10.0.0.2:50052")
    assert note is not None and "24.00 GiB" in note and "1.00 GiB" in note
    assert "--rpc-memory 10.0.0.2:50052=1024M" in note


def _env(llama_bin: Path, clean_env: dict[str, str], **extra: str) -> dict[str, str]:
    return {**clean_env, "SAFE_LLAMA_BIN_DIR": str(llama_bin), "PYTHONPATH": str(ROOT), **extra}


def _start(args: list[str], env: dict[str, str], preexec_fn: Callable[[], object] | None = None) -> Popen[str]:
    return subprocess.Popen([sys.executable, "-m", "safe_llama", "rpc-server", *args], env=env, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, stdin=subprocess.DEVNULL,
                            preexec_fn=preexec_fn)  # fmt: skip


@pytest.mark.slow
def test_ready_when_listening_and_sigterm_passes_through(
    llama_bin: Path, clean_env: dict[str, str], tmp_path: Path
) -> None:
    port = free_port()
    address = str(tmp_path / "notify")
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as notify:
        notify.bind(address)
        notify.settimeout(30)
        proc = _start(["-p", str(port)], _env(llama_bin, clean_env, NOTIFY_SOCKET=address))
        try:
            message = notify.recv(4096).decode()
            assert "READY=1" in message and f"127.0.0.1:{port}" in message
            assert listening(port)
            proc.send_signal(signal.SIGTERM)
            proc.communicate(timeout=30)
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    # the worker's own stdout is block-buffered into a pipe and lost with SIGTERM, as without safe-llama
    assert proc.returncode == 128 + signal.SIGTERM  # the worker died of the forwarded SIGTERM: as tini says it
    assert not listening(port)


@pytest.mark.slow
def test_a_bad_argument_is_the_workers_own_answer(llama_bin: Path, clean_env: dict[str, str]) -> None:
    bare = subprocess.run([str(llama_bin / "ggml-rpc-server"), "--bogus"], capture_output=True, text=True,
                          timeout=30, check=False)  # fmt: skip
    wrapped = subprocess.run([sys.executable, "-m", "safe_llama", "rpc-server", "--bogus"],
                             env=_env(llama_bin, clean_env), capture_output=True, text=True, timeout=30,
                             check=False)  # fmt: skip
    assert wrapped.returncode == bare.returncode  # 0: the pinned worker prints its usage and returns 0
    assert "unknown argument: --bogus" in wrapped.stderr


@pytest.mark.slow
def test_a_taken_port_is_named(llama_bin: Path, clean_env: dict[str, str]) -> None:
    port = free_port()
    first = _start(["-p", str(port)], _env(llama_bin, clean_env))
    try:
        deadline = time.monotonic() + 30
        while not listening(port) and time.monotonic() < deadline:
            time.sleep(0.05)
        second = subprocess.run([sys.executable, "-m", "safe_llama", "rpc-server", "-p", str(port)],
                                env=_env(llama_bin, clean_env), capture_output=True, text=True, timeout=30,
                                check=False)  # fmt: skip
    finally:
        first.send_signal(signal.SIGTERM)
        first.communicate(timeout=30)
    assert "Failed to create server socket" in second.stderr
    assert f"rpc-server stopped before it listened on 127.0.0.1:{port}" in second.stderr


@pytest.mark.slow
def test_a_cgroup_cap_is_named(llama_bin: Path, clean_env: dict[str, str]) -> None:
    """In a memory cgroup of 512 MiB the worker still offers the head all of the host's RAM: one line says so."""
    base = Path("/sys/fs/cgroup/memory")
    if not (base / "memory.limit_in_bytes").is_file() or not os.access(base, os.W_OK):
        pytest.skip("no writable cgroup v1 memory controller here")
    group = base / f"safe-llama-worker-{os.getpid()}"
    group.mkdir()
    (group / "memory.limit_in_bytes").write_text(str(512 << 20))
    port = free_port()
    try:
        proc = _start(["-p", str(port)], _env(llama_bin, clean_env),
                      preexec_fn=lambda: (group / "cgroup.procs").write_text(str(os.getpid())))  # fmt: skip
        deadline = time.monotonic() + 30
        while not listening(port) and time.monotonic() < deadline:
            time.sleep(0.05)
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=30)
    finally:
        for _ in range(50):
            try:
                group.rmdir()
                break
            except OSError:
                time.sleep(0.1)
    assert "lets it use 512.00 MiB" in err and str(group.name) in err
