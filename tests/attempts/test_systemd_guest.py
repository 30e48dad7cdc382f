"""The shipped unit under a real systemd (PID 1) with a cgroup v2 memory controller: a Debian guest made by
scripts/guest-image.sh from Debian's packages, booted by qemu-system-x86_64 with software emulation (TCG), as
this machine has neither systemd as PID 1 nor a v2 memory controller. safe-llama is installed there from a
wheel as the README says; the wide-KV model is served under MemoryMax=256M; the limit lowered for a while gets
llama-server OOM-killed once ready, and safe-llama (never the killer's choice) remembers it for the restart.
Slow (minutes: the image is made once and cached; the guest boots in about 40 s, installs from the wheels in
minutes, all emulated; about 4 min in all with the image made); needs root."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from safe_llama.paths import pinned_bin_dirs
from tests import ROOT
from tests.tiny_gguf import write_wide_kv_gguf

MIB = 1 << 20
MEMORY_MAX = 256 * MIB
MEMORY_MAX_AFTER = 160 * MIB  # the limit lowered under the running server for a while: a real OOM kill once ready
GUEST_LIMIT_S = 2400
# a prompt that fills the 12k-cell context does not finish in a session under TCG on the 2-core machine here (2,048
# tokens took over 5 min): CI sends a short one. The full-context request under cgroup v2 is in
# tests/fixtures/cgroup-v2 (a real v2 kernel, natively); on this host's v1, tests/attempts/test_cgroup_real.py.
# SAFE_LLAMA_GUEST_FILL=full (or a number of tokens) to try it here.
FILL = os.environ.get("SAFE_LLAMA_GUEST_FILL", "short")


def _script(name: str, *args: str) -> str:
    done = subprocess.run(
        ["bash", str(ROOT / "scripts" / name), *args], capture_output=True, text=True, timeout=3000, check=False
    )
    assert done.returncode == 0, f"scripts/{name}: {done.stderr[-2000:]}"
    return done.stdout.strip().splitlines()[-1]


def _payload(folder: Path) -> None:
    """What the guest installs and runs: wheels (safe-llama and its dependencies), the portable llama-server,
    the wide-KV model, the README, the unit exactly as shipped, and the scripts of tests/guest."""
    wheels = folder / "wheels"
    done = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--quiet", "--wheel-dir", str(wheels), str(ROOT)],
        capture_output=True, text=True, timeout=1200, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-2000:]
    bin_dir = Path(_script("build-llama.sh", "portable"))
    (folder / "bin").mkdir()
    shutil.copy2(bin_dir / "llama-server", folder / "bin" / "llama-server")
    write_wide_kv_gguf(folder)
    shutil.copy2(ROOT / "README.md", folder / "README.md")
    shutil.copy2(ROOT / "configs" / "systemd" / "safe-llama-server.service", folder / "safe-llama-server.service")
    for name in ("run.sh", "fill.py"):
        shutil.copy2(ROOT / "tests" / "guest" / name, folder / name)
    # the guest's pinned build is where the README's system-wide install puts it (/opt/safe-llama/...)
    system_bin = pinned_bin_dirs("cpu", {})[1][1]
    (folder / "payload.env").write_text(
        f"BIN_DIR={system_bin}\nMODEL_NAME=wide.gguf\nMEMORY_MAX={MEMORY_MAX}\nMEMORY_MAX_AFTER={MEMORY_MAX_AFTER}\n"
        f"FILL={FILL}\n"
    )


def _findings(console: str) -> dict[str, str]:
    found: dict[str, str] = {}
    for line in console.splitlines():
        if line.startswith("GUEST "):
            for key, value in re.findall(r"(\w+)=(\S*)", line):
                found[key] = value
    return found


@pytest.mark.slow
def test_unit_under_systemd_and_cgroup_v2(tmp_path: Path) -> None:
    if os.geteuid() != 0:
        pytest.fail("needs root (debootstrap makes the guest image): CI runs as root")
    payload = tmp_path / "payload"
    payload.mkdir()
    _payload(payload)
    console = tmp_path / "console.log"
    done = subprocess.run(
        ["bash", str(ROOT / "scripts" / "guest-run.sh"), str(payload), str(console), str(GUEST_LIMIT_S)],
        capture_output=True, text=True, timeout=GUEST_LIMIT_S + 3000, check=False,
    )  # fmt: skip
    text = console.read_text(errors="replace") if console.exists() else ""
    print(text)  # the guest's own account, for the test log
    assert done.returncode == 0, done.stderr[-2000:] + text[-4000:]
    got = _findings(text)
    assert got["pid1"] == "systemd" and "memory" in got["controllers"].split(",")
    # READY under systemd, the cgroup's limit is the unit's MemoryMax=, the plan sized under it
    assert (got["start_rc"], got["state"], got["substate"]) == ("0", "active", "running")
    assert int(got["memory_max"]) == MEMORY_MAX
    plan_lines = [line for line in text.splitlines() if line.startswith("PLAN ")]
    assert any("cgroup v2" in line for line in plan_lines), plan_lines
    # a request is served (one that fills the context with FILL=full), with no OOM kill and under the limit
    assert got["first_status"] == "200" and int(got["first_n_ctx"]) > 4096
    assert got["oom_kills_after_fill"] == "0"
    assert got["handed"] == "1" and got["main_after_fill"] == got["main"], got  # the handed supervisor, same pid
    assert int(got["peak_after_fill"]) <= MEMORY_MAX
    # the kernel's OOM killer takes llama-server before safe-llama (the unit's OOMScoreAdjust=, the child's raise)
    assert (got["oom_adj_supervisor"], got["oom_adj_server"]) == ("-1000", "0")
    # the limit lowered under it: llama-server killed, safe-llama survives, remembers and exits 137 for Restart=
    # ExecMainCode 1 is CLD_EXITED (2, CLD_KILLED: the supervisor itself killed, as seen before OOMScoreAdjust=)
    assert (got["exit_code_after_kill"], got["exit_status_after_kill"]) == ("1", "137"), got
    kernel = [line for line in text.splitlines() if line.startswith("KERNEL ")]
    assert any("Killed process" in line and "(llama-server)" in line for line in kernel), kernel
    assert not any("Killed process" in line and "(llama-server)" not in line for line in kernel), kernel
    killed = [line for line in plan_lines if "killed for lack of memory after it was ready" in line]
    assert killed and "memory.events oom_kill rose" in killed[0], plan_lines  # the unit's own group's counter
    # the limit put back before the restart: the same key, so the restart plans below the plan that was killed
    assert int(got["restarts"]) >= 1 and got["state_after_restart"] == "active"
    assert int(got["memory_max_after"]) == MEMORY_MAX
    assert int(got["after_restart_n_ctx"]) < int(got["first_n_ctx"])
    assert any("killed for lack of memory once ready" in line for line in plan_lines), plan_lines
    assert not any("is not usable" in line for line in plan_lines), plan_lines  # the cache (remembered plans)
    # SIGTERM (systemctl stop): a clean stop
    assert got["result"] == "success", got
