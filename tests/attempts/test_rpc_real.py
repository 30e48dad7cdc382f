"""Three real RPC workers (the pinned ggml-rpc-server, CPU backend) on 127.0.0.1, each in a memory cgroup of
its own with a different limit, and a model that fits only when spread over them (12 layers, 336 MiB of
weights, sparse: no disk). safe-llama plans the split from the declared budgets and starts it the first
time, with llama.cpp's buffer lines matching the plan per worker; the bare llama-server with the same
command line splits by the free memory each worker reports (all of the host's RAM) and the smallest worker
is OOM-killed at start. A worker whose declared budget is above its real cgroup limit dies during the
first start: it is named and the retry, with a smaller share for it, starts.

Needs a writable cgroup v1 memory controller (this machine has one; elsewhere the tests are skipped)."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from safe_llama.process.readiness import listening
from tests import ROOT
from tests.llama_run import free_port, healthy
from tests.tiny_gguf import write_tiny_gguf

MIB = 1 << 20
LIMITS = (500, 400, 170)  # MiB: each worker's cgroup memory.limit_in_bytes
CTX = "16384"
BASE = Path("/sys/fs/cgroup/memory")
BUFFER = re.compile(r"(?P<what>model|KV|compute) buffer size = +(?P<mib>[\d.]+) MiB")


@dataclass
class Worker:
    port: int
    limit_mib: int
    group: Path
    binary: Path
    proc: subprocess.Popen[bytes] | None = None
    starts: int = 0
    log: list[str] = field(default_factory=list)

    @property
    def endpoint(self) -> str:
        return f"127.0.0.1:{self.port}"

    def start(self) -> None:
        procs = self.group / "cgroup.procs"
        self.proc = subprocess.Popen(
            [str(self.binary), "-H", "127.0.0.1", "-p", str(self.port)],
            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
            preexec_fn=lambda: procs.write_text(str(os.getpid())),
        )  # fmt: skip
        self.starts += 1
        deadline = time.monotonic() + 20
        while not listening(self.port):
            assert time.monotonic() < deadline and self.proc.poll() is None, f"worker {self.endpoint} did not listen"
            time.sleep(0.05)

    def oom_kills(self) -> int:
        text = (self.group / "memory.oom_control").read_text()
        found = re.search(r"oom_kill (\d+)", text)
        return int(found.group(1)) if found else 0


class Restarter:
    """What the worker unit's Restart=on-failure does (configs/systemd/safe-llama-rpc-server.service, there
    with RestartSec=5): start a worker again `delay` seconds after it stops (bounded)."""

    def __init__(self, workers: list[Worker], most: int = 3, delay: float = 1.5) -> None:
        self.workers, self.most, self.delay = workers, most, delay
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self) -> None:
        gone: dict[int, float] = {}
        while not self.stop.wait(0.05):
            for i, worker in enumerate(self.workers):
                if worker.proc is None or worker.proc.poll() is None or worker.starts > self.most:
                    continue
                since = gone.setdefault(i, time.monotonic())
                if time.monotonic() - since >= self.delay:
                    del gone[i]
                    worker.start()

    def close(self) -> None:
        self.stop.set()
        self.thread.join(30)


@pytest.fixture
def workers(llama_bin: Path) -> Iterator[list[Worker]]:
    binary = llama_bin / "ggml-rpc-server"
    if not binary.is_file():
        pytest.skip("the pinned build has no ggml-rpc-server")
    if not (BASE / "memory.limit_in_bytes").is_file() or not os.access(BASE, os.W_OK):
        pytest.skip("no writable cgroup v1 memory controller here")
    made: list[Worker] = []
    try:
        for i, limit in enumerate(LIMITS):
            group = BASE / f"safe-llama-rpc-{os.getpid()}-{i}"
            group.mkdir()
            (group / "memory.limit_in_bytes").write_text(str(limit * MIB))
            made.append(Worker(free_port(), limit, group, binary))
        for worker in made:
            worker.start()
        yield made
    finally:
        for worker in made:
            if worker.proc is not None and worker.proc.poll() is None:
                worker.proc.send_signal(signal.SIGTERM)
                worker.proc.wait(30)
        for worker in made:
            for _ in range(50):
                try:
                    worker.group.rmdir()
                    break
                except OSError:
                    time.sleep(0.1)


@pytest.fixture(scope="module")
def spread_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """12 layers of 28 MiB (f32, read as zeros from a sparse file) and 2 KiB of f16 KV per layer per cell."""
    path = tmp_path_factory.mktemp("rpc") / "spread.gguf"
    return write_tiny_gguf(
        path, n_layer=12, n_head=8, n_head_kv=8, head_dim=64, n_ff=4096, n_ctx_train=65536, sparse=True
    )


def _env(llama_bin: Path, clean_env: dict[str, str], tmp_path: Path) -> dict[str, str]:
    return {**clean_env, "SAFE_LLAMA_BIN_DIR": str(llama_bin), "PYTHONPATH": str(ROOT),
            "XDG_CACHE_HOME": str(tmp_path / "cache"), "GGML_NO_BACKTRACE": "1"}  # fmt: skip


def _budgets(workers: list[Worker], declared: list[int]) -> str:
    return ",".join(f"{w.endpoint}={mib}M" for w, mib in zip(workers, declared, strict=True))


def _buffers(log: str, endpoint: str) -> dict[str, float]:
    """The buffer lines llama.cpp printed for one worker's device (named RPC0[host:port] for every worker)."""
    out: dict[str, float] = {}
    for line in log.splitlines():
        if f"[{endpoint}]" in line and (found := BUFFER.search(line)):
            out[found.group("what")] = float(found.group("mib"))
    return out


def _value(argv: list[str], *names: str) -> str:
    return next(argv[i + 1] for i, arg in enumerate(argv) if arg in names)


def _serve(args: list[str], env: dict[str, str], port: int, log: Path) -> tuple[subprocess.Popen[bytes], bool]:
    with log.open("wb") as out:
        proc = subprocess.Popen(args, env=env, stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT)
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        if healthy(port):
            return proc, True
        if proc.poll() is not None:
            return proc, False
        time.sleep(0.2)
    return proc, False


def _stop(proc: subprocess.Popen[bytes]) -> None:
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(30)


@pytest.mark.slow
def test_planned_split_starts_first_time_and_matches_each_worker(
    workers: list[Worker], spread_model: Path, llama_bin: Path, clean_env: dict[str, str], tmp_path: Path
) -> None:
    env = _env(llama_bin, clean_env, tmp_path)
    rpc = ",".join(w.endpoint for w in workers)
    budgets = _budgets(workers, list(LIMITS))
    asked = ["-m", str(spread_model), "--rpc", rpc, "-c", CTX]
    out = subprocess.run(
        [sys.executable, "-m", "safe_llama", "plan", "--json", "--rpc-memory", budgets, "server", *asked],
        env=env, capture_output=True, text=True, timeout=120, check=True,
    ).stdout  # fmt: skip
    plan = json.loads(out)
    (tmp_path / "plan.json").write_text(out)
    argv = plan["decision"]["argv"]
    split = _value(argv, "-ts", "--tensor-split")
    layers = [int(x) for x in split.split(",")]
    assert sum(layers) == 13 and all(n > 0 for n in layers)  # 12 layers and the output, on all three
    assert layers[2] < layers[1] < layers[0]  # in the order of the budgets
    assert int(_value(argv, "-c", "--ctx-size")) < int(CTX)  # all three together cannot hold -c 16384

    port = free_port()
    launch = [sys.executable, "-m", "safe_llama", "--rpc-memory", budgets, "server", *asked, "--port", str(port)]
    proc, ready = _serve([*launch, "-lv", "4"], env, port, tmp_path / "safe-llama.log")
    try:
        log = (tmp_path / "safe-llama.log").read_text(errors="replace")
        assert ready, log[-3000:]
        assert "failed" not in "\n".join(line for line in log.splitlines() if line.startswith("safe-llama:"))
        assert f"-ts {split}" in log  # said once, in one line
        names = {r["endpoint"]: r["name"] for r in plan["target"]["rpc"]}
        for worker in workers:
            real = _buffers(log, worker.endpoint)
            planned = plan["memory"][names[worker.endpoint]]
            assert real["model"] == pytest.approx(planned["weights"] / MIB, abs=0.01)
            assert real["KV"] == pytest.approx(planned["kv"] / MIB, abs=0.01)
            # each worker's compute from its own place in the split ([compute] split_*): within 1% above and 10%
            # below; a worker with a single repeating layer reserves less than the fit says (conservative)
            assert real["compute"] <= planned["compute"] / MIB * 1.01
            at = [w.endpoint for w in workers].index(worker.endpoint)
            repeating = layers[at] - (1 if at == len(layers) - 1 else 0)
            assert real["compute"] >= planned["compute"] / MIB * (0.9 if repeating >= 2 else 0.6)
            charged = int((worker.group / "memory.usage_in_bytes").read_text())
            assert charged < worker.limit_mib * MIB
        assert all(w.oom_kills() == 0 and w.proc is not None and w.proc.poll() is None for w in workers)
        # no launch record: the next launch lists the workers again (one may be gone or smaller)
        cache = tmp_path / "cache" / "safe-llama"
        assert cache.is_dir() and not list((cache / "launch").glob("*"))
    finally:
        _stop(proc)

    # the same command line without safe-llama: llama.cpp splits by the 20+ GiB each worker reports free
    bare_port = free_port()
    bare, ready = _serve(
        [str(llama_bin / "llama-server"), *asked, "--port", str(bare_port)], env, bare_port, tmp_path / "bare.log"
    )
    _stop(bare)
    bare_log = (tmp_path / "bare.log").read_text(errors="replace")
    assert not ready and bare.returncode != 0, bare_log[-2000:]
    assert "Remote RPC server crashed" in bare_log
    assert workers[2].oom_kills() == 1  # the smallest worker, killed by its cgroup


@pytest.mark.slow
def test_a_worker_that_dies_mid_start_is_named_and_retried(
    workers: list[Worker], spread_model: Path, llama_bin: Path, clean_env: dict[str, str], tmp_path: Path
) -> None:
    """The smallest worker is declared with more than its cgroup allows: the first start kills it."""
    env = _env(llama_bin, clean_env, tmp_path)
    rpc = ",".join(w.endpoint for w in workers)
    budgets = _budgets(workers, [LIMITS[0], LIMITS[1], 330])
    port = free_port()
    restarter = Restarter(workers)
    launch = [sys.executable, "-m", "safe_llama", "--rpc-memory", budgets, "server",
              "-m", str(spread_model), "--rpc", rpc, "-c", CTX, "--port", str(port)]  # fmt: skip
    proc, ready = _serve(launch, env, port, tmp_path / "retry.log")
    try:
        log = (tmp_path / "retry.log").read_text(errors="replace")
        said = [line for line in log.splitlines() if line.startswith("safe-llama:")]
        assert ready, log[-3000:]
        lost = [line for line in said if "attempt 1 failed" in line]
        assert len(lost) == 1 and f"RPC2 ({workers[2].endpoint}) stopped during the start" in lost[0], said
        assert workers[2].oom_kills() == 1 and workers[2].starts == 2
        splits = re.findall(r"-ts (\d+),(\d+),(\d+)", "\n".join(said))
        assert len(splits) == 2 and int(splits[1][2]) < int(splits[0][2])  # a smaller share for the worker
    finally:
        _stop(proc)
        restarter.close()


@pytest.mark.slow
def test_a_worker_that_refuses_an_allocation_is_named_and_retried(
    spread_model: Path, llama_bin: Path, clean_env: dict[str, str], tmp_path: Path
) -> None:
    """A worker under an address-space limit (ulimit -v) refuses the KV buffer the head asks of it: llama.cpp
    names it in the buffer (`failed to allocate RPC0[host:port] buffer`); the retry gives it less."""
    import resource

    binary = llama_bin / "ggml-rpc-server"
    if not binary.is_file():
        pytest.skip("the pinned build has no ggml-rpc-server")
    ports = [free_port(), free_port()]

    def limited() -> None:
        resource.setrlimit(resource.RLIMIT_AS, (400 << 20, 400 << 20))

    procs = [
        subprocess.Popen([str(binary), "-p", str(port)], stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                         stderr=subprocess.DEVNULL, preexec_fn=limited if i == 0 else None)
        for i, port in enumerate(ports)
    ]  # fmt: skip
    try:
        deadline = time.monotonic() + 20
        while not all(listening(p) for p in ports):
            assert time.monotonic() < deadline
            time.sleep(0.05)
        env = _env(llama_bin, clean_env, tmp_path)
        endpoints = [f"127.0.0.1:{p}" for p in ports]
        port = free_port()
        budgets = ",".join(f"{e}=600M" for e in endpoints)
        launch = [sys.executable, "-m", "safe_llama", "--rpc-memory", budgets, "server", "-m", str(spread_model),
                  "--rpc", ",".join(endpoints), "-c", CTX, "--port", str(port)]  # fmt: skip
        proc, ready = _serve(launch, env, port, tmp_path / "refused.log")
        try:
            log = (tmp_path / "refused.log").read_text(errors="replace")
            said = [line for line in log.splitlines() if line.startswith("safe-llama:")]
            assert ready, log[-3000:]
            failed = [line for line in said if " failed: RPC worker " in line]
            assert failed and f"RPC0 ({endpoints[0]}) could not allocate" in failed[0], said
            splits = re.findall(r"-ts (\d+),(\d+)", "\n".join(said))
            assert int(splits[-1][0]) < int(splits[0][0])  # its share went down
            assert all(p.poll() is None for p in procs)  # both workers alive: nothing was killed
        finally:
            _stop(proc)
    finally:
        for p in procs:
            p.send_signal(signal.SIGTERM)
            p.wait(30)
