"""What NVML's free-memory read costs a launch (issue 23's goal: at most 20 ms), paired in one process run
after run: prepare() as a launch calls it, in a fresh interpreter each time, with the read started first
(NvmlRead, collected when the devices are probed) and with the read made where it is needed
(read_nvml_isolated at the probe, as before). The cost a launch pays is the time spent starting the child
plus the time spent waiting for its answer; both are measured inside prepare().

    python3 benchmarks/bench_nvml_overlap.py --model M [--runs N]      (on a machine with an NVIDIA GPU)
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent

CHILD = """
import json, os, sys, time
import safe_llama.device.probe_free as pf
spent = {"start": 0.0, "wait": 0.0}
Read = pf.NvmlRead
class Timed(Read):
    def __init__(self, *a, **k):
        t = time.perf_counter(); super().__init__(*a, **k); spent["start"] += time.perf_counter() - t
    def result(self, *a, **k):
        t = time.perf_counter(); r = Read.result(self, *a, **k); spent["wait"] += time.perf_counter() - t
        return r
pf.NvmlRead = Timed
if sys.argv[1] == "at-probe":
    pf.nvidia_driver_loaded = lambda *a: False  # nothing started early: read_free reads at the probe
from safe_llama.pipeline.prepare import PlanOptions, prepare
t = time.perf_counter()
p = prepare("server", ["-m", sys.argv[2], "-ngl", "99"], os.environ, PlanOptions())
total = time.perf_counter() - t
free = p.target.device_free
print(json.dumps({"start_ms": spent["start"] * 1e3, "wait_ms": spent["wait"] * 1e3, "prepare_ms": total * 1e3,
                  "device_free": free.detail if free is not None else None}))
"""


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--model", required=True)
    ap.add_argument("--runs", type=int, default=15)
    ns = ap.parse_args()
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    rows: dict[str, list[dict[str, Any]]] = {"early": [], "at-probe": []}
    for _ in range(ns.runs):
        for mode in rows:
            out = subprocess.run([sys.executable, "-c", CHILD, mode, ns.model], capture_output=True, text=True,
                                 env=env, check=True)  # fmt: skip
            rows[mode].append(json.loads(out.stdout.strip().splitlines()[-1]))
    summary = {}
    for mode, runs in rows.items():
        cost = [r["start_ms"] + r["wait_ms"] for r in runs]
        summary[mode] = {
            "cost_ms_median": round(statistics.median(cost), 2),
            "cost_ms_max": round(max(cost), 2),
            "prepare_ms_median": round(statistics.median(r["prepare_ms"] for r in runs), 1),
            "device_free": runs[-1]["device_free"],
        }
    print(json.dumps(summary, indent=1))


if __name__ == "__main__":
    main()
