"""The plans the cgroup fixtures replay (tests/fixtures/cgroup-v2/plan-fill.json and plan-soak.json): `safe-llama
plan --json server -m wide.gguf` and the same with `-np 4`, each run inside a fresh memory cgroup with the limit, as
the plans of bench_cgroup_fill.py and bench_soak.py are made there (the probed headroom is what they record):

    python3 benchmarks/bench_cgroup_plans.py --out-dir DIR [--limit-mib 256]

Needs root (a child of the cgroup v2 tree with the memory controller, or of v1's memory tree); every cgroup it makes
is removed.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
from benchmarks.bench_host_limits import MIB, Limit, confined  # noqa: E402
from safe_llama.paths import pinned_bin_dir  # noqa: E402
from tests.tiny_gguf import write_wide_kv_gguf  # noqa: E402

PLANS = {"plan-fill.json": [], "plan-soak.json": ["-np", "4"]}


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out-dir", required=True)
    parser.add_argument("--limit-mib", type=int, default=256)
    opts = parser.parse_args()
    work = Path(tempfile.mkdtemp())
    model = write_wide_kv_gguf(work)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("LLAMA_ARG_", "SAFE_LLAMA_"))}
    env |= {"SAFE_LLAMA_BIN_DIR": str(pinned_bin_dir("cpu", os.environ)), "XDG_CACHE_HOME": str(work),
            "PYTHONPATH": str(ROOT)}  # fmt: skip
    for name, extra in PLANS.items():
        with confined(Limit("cgroup", opts.limit_mib * MIB)) as enter:
            argv = [sys.executable, "-m", "safe_llama", "plan", "--json", "server", "-m", str(model), *extra]
            done = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=120, preexec_fn=enter)
        if done.returncode != 0:
            print(f"{name}: plan exited {done.returncode}: {done.stderr.strip()[-400:]}", file=sys.stderr)
            return 1
        (Path(opts.out_dir) / name).write_text(done.stdout)
        print(f"{name}: written")
    return 0


if __name__ == "__main__":
    sys.exit(main())
