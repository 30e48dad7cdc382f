"""The architecture corpus in figures: how many architectures test-llama-archs writes, how many
(architecture, configuration) pairs the real binaries load with exactly the predicted KV and recurrent
lines, and which architectures are estimated instead, in which direction, and why.

    python3 benchmarks/bench_archs.py [--bin DIR] [--workers N]
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from safe_llama.model.arch import UNMODELLED  # noqa: E402
from safe_llama.paths import pinned_bin_dir  # noqa: E402
from tests.arch_corpus import CONFIGS, clean_env, compare_all, generate_corpus  # noqa: E402


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--bin", type=Path, default=None, help="bin/ of the pinned CPU build")
    parser.add_argument("--workers", type=int, default=2)
    args = parser.parse_args()
    bin_dir = args.bin or pinned_bin_dir("cpu", os.environ)
    with tempfile.TemporaryDirectory() as tmp:
        started = time.monotonic()
        models = generate_corpus(bin_dir, Path(tmp))
        outcomes = compare_all(bin_dir, models, clean_env(), workers=args.workers)
        took = time.monotonic() - started
    by_arch: dict[str, list[bool]] = defaultdict(list)
    for o in outcomes:
        if o.refused:
            print(f"refused by llama.cpp: {o.model} [{o.config}]: {o.refused}")
        else:
            by_arch[o.architecture].append(o.exact)
    exact_archs = sorted(a for a, results in by_arch.items() if all(results))
    print(f"{len(models)} files, {len(by_arch)} architectures, {len(CONFIGS)} configurations: {len(outcomes)} runs")
    described = [f"{c.name} ({c.tool} {' '.join(c.args)})" for c in CONFIGS]
    print(f"configurations: {', '.join(described)}")
    compared = [o for o in outcomes if not o.refused]
    print(f"exact runs: {sum(o.exact for o in compared)}/{len(compared)} (the others refused by llama.cpp)")
    print(f"architectures exact in every configuration: {len(exact_archs)}/{len(by_arch)}")
    for arch in sorted(set(by_arch) - set(exact_archs)):
        entry = UNMODELLED.get(arch)
        said = f"{entry.direction}-estimate: {entry.reason}" if entry else "MODELLED BUT NOT EXACT"
        print(f"  {arch}: exact in {sum(by_arch[arch])}/{len(by_arch[arch])}; {said}")
    problems = [o for o in outcomes if o.problem() is not None]
    for o in problems:
        print(f"PROBLEM {o.model} [{o.config}]: {o.problem()}")
    print(f"{took:.1f} s with {args.workers} workers")
    return 1 if problems else 0


if __name__ == "__main__":
    raise SystemExit(main())
