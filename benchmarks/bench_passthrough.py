"""Pass-through overhead: `safe-llama-server --version` (and --help) against llama-server run directly,
alternating runs side by side. The overhead is safe-llama's whole cost before the exec: the interpreter,
the imports of the entry module, reading the command line, finding the binary. The interpreter's own
start (the third row) is part of it: it is what any Python launcher costs.

    python3 benchmarks/bench_passthrough.py [--runs N]
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from safe_llama.paths import pinned_bin_dir  # noqa: E402

ENTRY = "import sys; from safe_llama.entry import main_server; sys.exit(main_server())"


def elapsed(argv: list[str], env: dict[str, str]) -> float:
    start = time.perf_counter()
    subprocess.run(argv, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, check=False)
    return time.perf_counter() - start


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--runs", type=int, default=21)
    opts = parser.parse_args()
    bin_dir = pinned_bin_dir("cpu", os.environ)
    env = {**os.environ, "SAFE_LLAMA_BIN_DIR": str(bin_dir), "PYTHONPATH": str(ROOT)}
    # an installed package has its bytecode compiled; a checkout run with PYTHONDONTWRITEBYTECODE=1 would
    # compile every module on every run, which is not what a user's launch pays
    env.pop("PYTHONDONTWRITEBYTECODE", None)
    elapsed([sys.executable, "-c", ENTRY, "--version"], env)  # writes the bytecode once
    print(f"{'':<40}{'median':>9}{'min':>9}{'overhead':>10}")
    for flag in ("--version", "--help"):
        rows: dict[str, list[float]] = {"llama-server direct": [], "safe-llama-server (entry)": [],
                                        "python3 -c pass (interpreter alone)": []}  # fmt: skip
        for _ in range(opts.runs):
            rows["llama-server direct"].append(elapsed([str(bin_dir / "llama-server"), flag], env))
            rows["safe-llama-server (entry)"].append(elapsed([sys.executable, "-c", ENTRY, flag], env))
            rows["python3 -c pass (interpreter alone)"].append(elapsed([sys.executable, "-c", "pass"], env))
        base = statistics.median(rows["llama-server direct"])
        print(flag)
        for name, times in rows.items():
            med = statistics.median(times)
            over = f"{(med - base) * 1000:>8.1f}ms" if name.startswith("safe") else ""
            print(f"  {name:<38}{med * 1000:>7.1f}ms{min(times) * 1000:>7.1f}ms{over:>10}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
