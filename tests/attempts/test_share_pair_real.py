"""Two services in one memory cgroup (issue 35), real: two `safe-llama server -m WIDE` (no -c) started at the same
moment in one 512 MiB group are both ready on their first spawn, both serve a request that fills their context at
the same time with no OOM kill, and their contexts add up to at least 0.90 of the largest pair of bare
llama-server that does so (measured by benchmarks/bench_share_pair.py: tests/fixtures/cgroup-v1-share/); and one
launch's ledger entry is there while it runs and gone after. Needs root for the cgroup (skipped otherwise)."""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

import pytest

from benchmarks.bench_host_limits import MIB, Limit
from benchmarks.bench_share_pair import safe_llama_pair, wide_model
from safe_llama.device import ledger
from tests import FIXTURES
from tests.llama_run import free_port, healthy

RECORDED = FIXTURES / "cgroup-v1-share" / "pair-512.json"


def _can_make_a_group() -> bool:
    return os.geteuid() == 0 and (
        Path("/sys/fs/cgroup/memory").is_dir() or Path("/sys/fs/cgroup/cgroup.controllers").is_file()
    )


@pytest.mark.slow
@pytest.mark.skipif(not _can_make_a_group(), reason="making a memory cgroup needs root")
def test_two_started_together_in_one_group_both_serve_a_full_context(tmp_path: Path, llama_bin: Path) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("LLAMA_ARG_", "SAFE_LLAMA_"))}
    env |= {"SAFE_LLAMA_BIN_DIR": str(llama_bin), "PYTHONPATH": str(Path(__file__).resolve().parents[2])}
    seen = safe_llama_pair(wide_model(tmp_path), Limit("cgroup", 512 * MIB), env, tmp_path)
    assert seen["ready"] == [True, True] and seen["first_spawn"] == [True, True], seen["lines"]
    assert seen["served_together"], seen["lines"]
    bare = json.loads(RECORDED.read_text())["bare_pair_largest"]
    contexts = seen["contexts"]
    assert isinstance(contexts, list)
    # 0.915 recorded (an earlier bisection's bare edge gave 0.898): the pair's two supervisors hold about 35 MiB of
    # the group, which the bare pair does not carry (2,240 cells of this model), and each plan keeps its 2% margin
    assert sum(contexts) >= 0.90 * 2 * bare
    lines = seen["lines"]
    assert isinstance(lines, list)
    assert any("2 launches started together" in line for line in lines[0] + lines[1])


@pytest.mark.slow
def test_a_launch_is_in_the_ledger_while_it_runs(tmp_path: Path, llama_bin: Path, clean_env: dict[str, str]) -> None:
    import subprocess

    from tests.tiny_gguf import write_tiny_gguf

    runtime = tmp_path / "run"
    runtime.mkdir(mode=0o700)
    env = clean_env | {"XDG_CACHE_HOME": str(tmp_path / "cache"), "SAFE_LLAMA_BIN_DIR": str(llama_bin),
                       "XDG_RUNTIME_DIR": str(runtime)}  # fmt: skip
    model = write_tiny_gguf(tmp_path / "tiny.gguf", n_ctx_train=4096)
    port = free_port()
    proc = subprocess.Popen(
        [sys.executable, "-m", "safe_llama", "server", "-m", str(model), "--port", str(port)],
        env=env,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    folder = ledger.own_folder(env)
    assert folder is not None
    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and proc.poll() is None and not healthy(port):
            time.sleep(0.1)
        states = []
        while time.monotonic() < deadline and "ready" not in states:  # marked once the supervisor sees it ready
            (launch,) = ledger.read(folder)
            states.append(launch.state)
            time.sleep(0.05)
        assert (launch.pid, launch.state, launch.label) == (proc.pid, "ready", "model tiny.gguf")
        assert launch.host_bytes > 0
    finally:
        proc.terminate()
        proc.communicate(timeout=60)
    assert ledger.read(folder) == () and not list(folder.glob("*.json"))
