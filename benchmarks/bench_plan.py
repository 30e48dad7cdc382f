"""Whole-process wall time of `safe-llama plan --json server -m <bundled gemma-3> -c 65536` against opening
the same file with gguf.GGUFReader, side by side in one run; and the same plan on a tiny model, to show
the time does not grow with the weights.

    python3 benchmarks/bench_plan.py [--runs N] [--reader-runs N]
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from safe_llama.model.bundled import bundled_model_path  # noqa: E402
from tests.tiny_gguf import write_tiny_gguf  # noqa: E402


def wall(cmd: list[str], env: dict[str, str]) -> float:
    start = time.perf_counter()
    subprocess.run(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, check=True)
    return time.perf_counter() - start


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--runs", type=int, default=15)
    parser.add_argument("--reader-runs", type=int, default=1)
    opts = parser.parse_args()
    model = bundled_model_path(os.environ)
    work = Path(tempfile.mkdtemp())
    tiny = write_tiny_gguf(work / "tiny.gguf")
    env = dict(os.environ)
    plan = [sys.executable, "-m", "safe_llama", "plan", "--json", "server", "-m"]

    def series(path: Path, cold: bool) -> list[float]:
        out = []
        for i in range(opts.runs):
            run_env = dict(env)
            if cold:  # a fresh cache: the header is really read every time
                run_env["XDG_CACHE_HOME"] = str(work / f"cold{i}")
            else:
                run_env["XDG_CACHE_HOME"] = str(work / "warm")
            out.append(wall([*plan, str(path), "-c", "65536"], run_env))
        return out

    series(model, cold=False)  # fill the warm cache
    rows = {
        "plan, bundled gemma-3 (253 MB), cold cache": series(model, cold=True),
        "plan, bundled gemma-3 (253 MB), warm cache": series(model, cold=False),
        f"plan, tiny model ({tiny.stat().st_size // 1024} KiB), cold cache": series(tiny, cold=True),
        "python3 -c pass (interpreter start-up)": [wall([sys.executable, "-c", "pass"], env) for _ in range(opts.runs)],
    }
    reader = [
        wall([sys.executable, "-c", f"import gguf; gguf.GGUFReader({str(model)!r})"], env)
        for _ in range(opts.reader_runs)
    ]
    rows["gguf.GGUFReader(bundled gemma-3), whole process"] = reader
    base = statistics.median(reader)
    print(f"{'what':<58}{'median':>10}{'min':>10}{'vs GGUFReader':>16}")
    for name, times in rows.items():
        med = statistics.median(times)
        print(f"{name:<58}{med * 1000:>8.0f}ms{min(times) * 1000:>8.0f}ms{base / med:>15.0f}x")
    shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
