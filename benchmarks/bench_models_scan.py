"""`safe-llama models` on a folder of 100 models of several shapes (dense, GQA, sliding-window, per-layer KV heads,
MoE; 2K to 1M trained cells; written sparse: the real headers and sizes, the weights a hole), cold (an empty cache:
every header read) and warm (the index kept), side by side: the whole command in a fresh process each time, then
its parts in this one (scan, headers, plans).

    python3 benchmarks/bench_models_scan.py [--models N] [--runs R]
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

from safe_llama.commands import models  # noqa: E402
from safe_llama.pipeline import model_fits, model_index, model_scan  # noqa: E402
from safe_llama.pipeline.prepare import PlanOptions  # noqa: E402
from tests.tiny_gguf import write_tiny_gguf  # noqa: E402

SHAPES = (
    dict(arch="llama", n_layer=32, n_head=32, n_head_kv=8, head_dim=128, n_ff=14336, n_ctx_train=131072),
    dict(arch="llama", n_layer=16, n_head=32, n_head_kv=8, head_dim=64, n_ff=8192, n_ctx_train=131072),
    dict(arch="qwen2", n_layer=28, n_head=28, n_head_kv=4, head_dim=128, n_ff=18944, n_ctx_train=32768),
    dict(arch="gemma3", n_layer=26, n_head=8, n_head_kv=4, head_dim=256, n_ff=10240, n_ctx_train=131072,
         sliding_window=1024),
    dict(arch="deci", n_layer=4, n_head=8, n_head_kv=2, head_dim=64, n_ctx_train=16384,
         head_count_kv_per_layer=[2, 1, 4, 8]),
    dict(arch="llama", n_layer=8, n_head=16, n_head_kv=8, head_dim=128, n_ff=2048, n_expert=16, n_expert_used=2,
         n_ctx_train=32768),
    dict(arch="llama", n_layer=8, n_head=16, n_head_kv=16, head_dim=256, n_ff=64, n_ctx_train=1_000_000),
    dict(arch="llama", n_layer=2, n_head=4, n_head_kv=2, head_dim=64, n_ctx_train=2048),
)  # fmt: skip


def write_models(folder: Path, count: int) -> list[Path]:
    out = []
    for i in range(count):
        shape = SHAPES[i % len(SHAPES)]
        out.append(write_tiny_gguf(folder / f"m{i:03d}-{shape['arch']}.gguf", sparse=True, seed=i, **shape))  # type: ignore[arg-type]
    return out


def whole(folder: Path, env: dict[str, str]) -> float:
    started = time.perf_counter()
    subprocess.run([sys.executable, "-m", "safe_llama", "models", str(folder)], env=env, cwd=ROOT, check=True,
                   stdout=subprocess.DEVNULL)  # fmt: skip
    return time.perf_counter() - started


def row(name: str, cold: float, warm: float, n: int) -> None:
    print(f"{name:34}{cold:>10.3f}{warm:>10.3f}{cold / n * 1000:>12.1f}ms{warm / n * 1000:>12.1f}ms")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", type=int, default=100)
    parser.add_argument("--runs", type=int, default=3)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp) / "models"
        folder.mkdir()
        write_models(folder, args.models)
        cache = Path(tmp) / "cache"
        env = {**os.environ, "HOME": str(Path(tmp) / "home"), "XDG_CACHE_HOME": str(cache),
               "PYTHONPATH": str(ROOT)}  # fmt: skip
        cold, warm = [], []
        for _ in range(args.runs):
            shutil.rmtree(cache, ignore_errors=True)
            cold.append(whole(folder, env))
            warm.append(whole(folder, env))
        found = model_scan.scan([str(folder)], env, defaults=False)
        n = len(found)
        print(f"{n} models in {folder.name}/ (+ the bundled model), {args.runs} runs, median seconds")
        print(f"{'':34}{'cold':>10}{'warm':>10}{'cold/model':>14}{'warm/model':>14}")
        row("safe-llama models DIR (process)", statistics.median(cold), statistics.median(warm), n)
        policy = model_fits.load_planner_policy(env)
        options = PlanOptions()
        places = model_fits.places("server", [], env, options, policy)
        want = model_fits.asked("server", [], env)
        parts: dict[str, list[float]] = {"scan": [], "headers": [], "plans": []}
        for phase in ("cold", "warm"):
            if phase == "cold":
                shutil.rmtree(cache, ignore_errors=True)
            t0 = time.perf_counter()
            found = model_scan.scan([str(folder)], env, defaults=False)
            t1 = time.perf_counter()
            reads = {r.path: r for r in model_index.read_all([f.path for f in found], env)}
            t2 = time.perf_counter()
            rows = models.plan_rows(found, reads, want, places, policy, options)
            t3 = time.perf_counter()
            parts["scan"].append(t1 - t0)
            parts["headers"].append(t2 - t1)
            parts["plans"].append(t3 - t2)
            assert len(rows) == n
        for name, (c, w) in parts.items():
            row("  " + name, c, w, n)
        print(f"places: {', '.join(p.name for p in places)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
