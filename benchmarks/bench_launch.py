"""Time to /health 200 through safe-llama against llama-server run directly (bundled model, -c 4096),
alternating runs side by side, and the supervisor's resident memory once the server is up.

    python3 benchmarks/bench_launch.py [--runs N]

Rows: direct llama-server as the user would type it; safe-llama first-time (no remembered plan, probe
caches warm: the usual first launch of a model); safe-llama cold (empty cache: facts, probes, all);
safe-llama remembered (a plan stored by an earlier launch).
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
from safe_llama.paths import pinned_bin_dir  # noqa: E402
from tests.llama_run import free_port, healthy  # noqa: E402


def time_to_health(argv: list[str], env: dict[str, str]) -> tuple[float, int]:
    port = free_port()
    start = time.perf_counter()
    proc = subprocess.Popen([*argv, "--port", str(port)], env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    while not healthy(port):
        if proc.poll() is not None:
            raise RuntimeError(f"{argv} exited {proc.returncode}")
        time.sleep(0.005)
    elapsed = time.perf_counter() - start
    rss = 0
    with open(f"/proc/{proc.pid}/status") as status:
        for line in status:
            if line.startswith("VmRSS:"):
                rss = int(line.split()[1]) * 1024
    proc.terminate()
    proc.wait(30)
    return elapsed, rss


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--runs", type=int, default=7)
    opts = parser.parse_args()
    model = str(bundled_model_path(os.environ))
    bin_dir = pinned_bin_dir("cpu", os.environ)
    work = Path(tempfile.mkdtemp())
    base = {**os.environ, "SAFE_LLAMA_BIN_DIR": str(bin_dir)}
    direct = [str(bin_dir / "llama-server"), "-m", model, "-c", "4096"]
    wrapped = [sys.executable, "-m", "safe_llama", "server", "-m", model, "-c", "4096"]
    warm_cache = work / "warm"
    time_to_health(wrapped, {**base, "XDG_CACHE_HOME": str(warm_cache)})  # fill facts and probe caches
    rows: dict[str, list[float]] = {"direct": [], "first-time": [], "cold": [], "remembered": []}
    rss: list[int] = []
    for i in range(opts.runs):
        rows["direct"].append(time_to_health(direct, base)[0])
        shutil.rmtree(warm_cache / "safe-llama" / "plans", ignore_errors=True)
        elapsed, size = time_to_health(wrapped, {**base, "XDG_CACHE_HOME": str(warm_cache)})
        rows["first-time"].append(elapsed)
        rss.append(size)
        rows["remembered"].append(time_to_health(wrapped, {**base, "XDG_CACHE_HOME": str(warm_cache)})[0])
        rows["cold"].append(time_to_health(wrapped, {**base, "XDG_CACHE_HOME": str(work / f"cold{i}")})[0])
    base_med = statistics.median(rows["direct"])
    print(f"{'time to /health 200 (bundled model, -c 4096)':<48}{'median':>9}{'min':>9}{'vs direct':>11}")
    for name, times in rows.items():
        med = statistics.median(times)
        print(f"{name:<48}{med * 1000:>7.0f}ms{min(times) * 1000:>7.0f}ms{med / base_med:>10.2f}x")
    med_rss, max_rss = statistics.median(rss) / 1048576, max(rss) / 1048576
    print(f"supervisor RSS once ready: median {med_rss:.1f} MiB, max {max_rss:.1f} MiB")
    shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
