"""safe-llama's own cost on each path against its like-for-like baseline, A and B alternated in one run:

    python3 benchmarks/bench_fast.py [--runs N] [--tree DIR ...]

- launch: `safe-llama completion -m <bundled> -c 4096 -n 1 -p hi -no-cnv` against the real llama-completion
  given safe-llama's final argv (taken from `plan --json`), caches warm (the usual launch after the first);
- plan: `safe-llama plan --json completion ...` against `python3 -c pass` (the interpreter's start: the floor);
- plan server: `safe-llama plan --json server -m <bundled>` against the same floor (issue 37's goal: at most 8x);
- pass-through: `safe-llama-server --version` against llama-server --version (bench_passthrough's entry);
- RSS: the supervisor's resident memory while it watches a llama-server that answers /health.

Each --tree (a checkout, e.g. the one before a change) gets its own rows, interleaved with the others, so a
before/after comparison shares the machine's moments, and its own cache folder (as one installed safe-llama
has): the launch after the first starts from the launch record the first wrote (remembered/early.py), as a
user's second launch of the same command does. Bytecode is written and used, as in an installed
package (PYTHONDONTWRITEBYTECODE is dropped from the children's environment).
"""

from __future__ import annotations

import argparse
import json
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

from benchmarks.bench_passthrough import ENTRY as PASSTHROUGH_ENTRY  # noqa: E402
from safe_llama.model.bundled import bundled_model_path  # noqa: E402
from safe_llama.paths import pinned_bin_dir  # noqa: E402
from tests.llama_run import free_port, healthy  # noqa: E402

MAIN = "import sys; from safe_llama.entry import main; sys.exit(main())"
LAUNCH_ARGS = ["-c", "4096", "-n", "1", "-p", "hi", "-no-cnv"]


def timed(argv: list[str], env: dict[str, str]) -> tuple[float, float]:
    """Wall seconds, and the CPU seconds (user + system) of the process and its children: on a shared
    machine the CPU time is the steadier measure of safe-llama's own work."""
    start = time.perf_counter()
    proc = subprocess.Popen(argv, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    _, _, usage = os.wait4(proc.pid, 0)
    proc.returncode = 0  # reaped above
    return time.perf_counter() - start, usage.ru_utime + usage.ru_stime


def supervisor_rss(argv: list[str], env: dict[str, str]) -> int:
    """VmRSS of the safe-llama process once the llama-server it supervises answers /health."""
    port = free_port()
    proc = subprocess.Popen([*argv, "--port", str(port)], env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        while not healthy(port):
            if proc.poll() is not None:
                raise RuntimeError(f"{argv} exited {proc.returncode}")
            time.sleep(0.02)
        time.sleep(0.2)
        with open(f"/proc/{proc.pid}/status") as status:
            return next(int(line.split()[1]) * 1024 for line in status if line.startswith("VmRSS:"))
    finally:
        proc.terminate()
        proc.wait(30)


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--runs", type=int, default=15)
    parser.add_argument("--tree", action="append", default=[], help="another checkout to measure (repeatable)")
    opts = parser.parse_args()
    model = str(bundled_model_path(os.environ))
    bin_dir = pinned_bin_dir("cpu", os.environ)
    cache = Path(tempfile.mkdtemp())
    base = {**os.environ, "SAFE_LLAMA_BIN_DIR": str(bin_dir), "XDG_CACHE_HOME": str(cache)}
    base.pop("PYTHONDONTWRITEBYTECODE", None)
    base["PYTHONSAFEPATH"] = "1"  # `python -c` would put the working directory (this tree) before PYTHONPATH
    py = sys.executable
    trees = {"this": ROOT, **{Path(t).name: Path(t).resolve() for t in opts.tree}}
    # a cache folder per tree: one tree's launch rewrites the remembered plan another's launch record holds
    envs = {
        name: {**base, "PYTHONPATH": str(tree), "XDG_CACHE_HOME": str(cache / name)} for name, tree in trees.items()
    }
    launch = [py, "-c", MAIN, "completion", "-m", model, *LAUNCH_ARGS]
    plan = [py, "-c", MAIN, "plan", "--json", "completion", "-m", model, *LAUNCH_ARGS]
    plan_server = [py, "-c", MAIN, "plan", "--json", "server", "-m", model]
    passthrough = [py, "-c", PASSTHROUGH_ENTRY, "--version"]
    out = subprocess.run(plan, env=envs["this"], capture_output=True, text=True, check=True).stdout
    final = json.loads(out)["decision"]["argv"]
    direct = [str(bin_dir / "llama-completion"), *final]
    for env in envs.values():  # bytecode, facts and probe caches written once
        for argv in (launch, plan, plan_server, passthrough):
            timed(argv, env)
    rows: dict[str, list[tuple[float, float]]] = {"llama-completion (final argv)": [], "python3 -c pass": [],
                                    "llama-server --version": []}  # fmt: skip
    for name in trees:
        for what in ("launch", "plan --json", "plan --json server", "pass-through"):
            rows[f"{what} [{name}]"] = []
    for _ in range(opts.runs):
        rows["llama-completion (final argv)"].append(timed(direct, base))
        rows["python3 -c pass"].append(timed([py, "-c", "pass"], base))
        rows["llama-server --version"].append(timed([str(bin_dir / "llama-server"), "--version"], base))
        for name, env in envs.items():
            rows[f"launch [{name}]"].append(timed(launch, env))
            rows[f"plan --json [{name}]"].append(timed(plan, env))
            rows[f"plan --json server [{name}]"].append(timed(plan_server, env))
            rows[f"pass-through [{name}]"].append(timed(passthrough, env))
    med = {name: statistics.median(t[0] for t in times) for name, times in rows.items()}
    cpu = {name: statistics.median(t[1] for t in times) for name, times in rows.items()}
    baselines = {"launch": "llama-completion (final argv)", "plan --json": "python3 -c pass",
                 "plan --json server": "python3 -c pass",
                 "pass-through": "llama-server --version"}  # fmt: skip
    print(f"bytecode on; {opts.runs} alternated runs; final argv: {' '.join(final)}")
    print(f"{'wall (CPU: user+sys)':<36}{'median':>9}{'min':>9}{'over base':>11}{'ratio':>7}{'CPU':>9}{'CPU over':>10}")
    for name, times in rows.items():
        kind = name.split(" [")[0]
        extra = f"{'':>18}{cpu[name] * 1000:>7.1f}ms{'':>10}"
        if kind in baselines:
            b = baselines[kind]
            over, ratio, cpu_over = (med[name] - med[b]) * 1000, med[name] / med[b], (cpu[name] - cpu[b]) * 1000
            extra = f"{over:>9.1f}ms{ratio:>7.2f}{cpu[name] * 1000:>7.1f}ms{cpu_over:>8.1f}ms"
        print(f"{name:<36}{med[name] * 1000:>7.1f}ms{min(t[0] for t in times) * 1000:>7.1f}ms{extra}")
    server = ["-c", "import sys; from safe_llama.entry import main_server; sys.exit(main_server())"]
    for name, env in envs.items():
        sizes = [supervisor_rss([py, *server, "-m", model, "-c", "4096"], env) for _ in range(3)]
        mib = statistics.median(sizes) / 1048576
        print(f"supervisor RSS [{name}] while llama-server is healthy: median {mib:.1f} MiB")
    shutil.rmtree(cache, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
