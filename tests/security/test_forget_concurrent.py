"""#33 row 7: `forget` run by several processes at once: 13 of 32 exited 70 "internal error:
FileNotFoundError" (shutil.rmtree racing another's). Now each folder is renamed to one process's own name
before it is removed: every process exits 0, and every plan is counted by exactly one of them."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

from safe_llama import state
from safe_llama.paths import cache_dir
from safe_llama.remembered import remember

PROCESSES = 32
PLANS = 200


@pytest.mark.slow
def test_32_forgets_at_once(tmp_path: Path) -> None:
    env = {"XDG_CACHE_HOME": str(tmp_path), "PATH": "/usr/bin:/bin", "HOME": "/nonexistent"}
    for n in range(PLANS):
        remember.store(f"{n:040x}", remember.Remembered(n, None, 1 << 30), env)
    root = cache_dir(env)
    for kind in ("launch", "args", "facts", "probe", "toml"):
        for n in range(20):
            state.write_json(root / kind / f"{n}.json", {"n": n})
    procs = [
        subprocess.Popen(
            [sys.executable, "-m", "safe_llama", "forget"],
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for _ in range(PROCESSES)
    ]
    results = [(p.wait(timeout=120), *p.communicate()) for p in procs]
    assert [code for code, _, _ in results] == [0] * PROCESSES, [err for _, _, err in results if err]
    assert all(err == "" for _, _, err in results)
    counts = [int(re.fullmatch(r"safe-llama: forgot (\d+) remembered plan\(s\)\n", out)[1]) for _, out, _ in results]  # type: ignore[index]
    assert sum(counts) == PLANS  # each plan counted once, by the process whose rename won
    assert list(root.iterdir()) == []
