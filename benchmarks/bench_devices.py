"""Benchmark of the device probe: cold (nothing cached) and warm (--list-devices, --version, OpenCL cached).

Goal: a warm probe under 150 ms. Measured two ways: the whole `python -m safe_llama devices --json` process,
and in-process (`import safe_llama.device.probing` + probe_devices in a fresh interpreter, as a launch pays it).
Baselines: the interpreter alone (`python -c pass`) and safe-llama's own floor (`python -m safe_llama
--version`: Python + typer), so the ratio says what the probe adds; and the cold probe, so the ratio says
what the caches save. Caches live in a temporary XDG_CACHE_HOME; the user's cache is not touched.

    python benchmarks/bench_devices.py [--llama-bin DIR_OR_FILE] [--runs N]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

from safe_llama.device.binaries import find_binary
from safe_llama.device.proc import run_capture
from safe_llama.paths import pinned_bin_dir

IN_PROCESS = """
import sys, time
from pathlib import Path
t0 = time.perf_counter()
from safe_llama.device.probing import probe_devices
t1 = time.perf_counter()
import os
report = probe_devices(binary=Path(sys.argv[1]), env=os.environ)
t2 = time.perf_counter()
assert report.llama is not None and report.llama.cached and report.opencl_cached, "not warm"
print(f"{(t1 - t0) * 1000:.3f} {(t2 - t1) * 1000:.3f}")
"""


def timed(argv: Sequence[str], env: Mapping[str, str]) -> float:
    started = time.perf_counter()
    done = run_capture(argv, env=env, timeout=120.0)
    elapsed = (time.perf_counter() - started) * 1000
    if done.returncode != 0:
        raise SystemExit(f"{' '.join(argv)} failed ({done.returncode}): {done.stderr.strip()[-500:]}")
    return elapsed


def series(runs: int, measure: Callable[[], float]) -> tuple[float, float]:
    values = [measure() for _ in range(runs)]
    return statistics.median(values), min(values)


def row(label: str, median: float, best: float, note: str = "") -> None:
    print(f"  {label:<52} {median:8.1f} ms  (min {best:7.1f}){'  ' + note if note else ''}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--llama-bin", help="llama-server or its directory (default: the pinned OpenVINO build)")
    parser.add_argument("--runs", type=int, default=10)
    options = parser.parse_args()

    with tempfile.TemporaryDirectory(prefix="bench-devices-") as scratch:
        return run(options.llama_bin, options.runs, Path(scratch))


def run(llama_bin: str | None, runs: int, scratch: Path) -> int:
    python = sys.executable
    cache = str(scratch / "warm")
    env = {**os.environ, "XDG_CACHE_HOME": cache}
    default = pinned_bin_dir("openvino", os.environ) if pinned_bin_dir("openvino", os.environ).is_dir() else None
    binary = find_binary("server", env=os.environ, explicit=llama_bin or (str(default) if default else None))
    devices = [python, "-m", "safe_llama", "devices", "--json", "--llama-bin", str(binary)]
    print(f"binary {binary}")
    print(f"python {python}, {runs} runs each, cache {cache}\n")

    print("baselines")
    floor_py, floor_py_min = series(runs, lambda: timed([python, "-c", "pass"], env))
    row("python -c pass", floor_py, floor_py_min)
    floor_cli, floor_cli_min = series(runs, lambda: timed([python, "-m", "safe_llama", "--version"], env))
    row("python -m safe_llama --version", floor_cli, floor_cli_min)

    print("\nwhole process: python -m safe_llama devices --json")

    def cold() -> float:
        fresh = {**env, "XDG_CACHE_HOME": tempfile.mkdtemp(dir=scratch)}
        return timed(devices, fresh)

    cold_med, cold_min = series(max(3, runs // 3), cold)
    row("cold (nothing cached)", cold_med, cold_min)
    timed(devices, env)  # fill the benchmark's cache
    warm_med, warm_min = series(runs, lambda: timed(devices, env))
    row("warm (cached)", warm_med, warm_min, f"{warm_med - floor_cli:+.1f} ms over the CLI floor")

    print("\nin process, fresh interpreter: import safe_llama.device.probing + probe_devices()")
    imports: list[float] = []
    probes: list[float] = []
    for _ in range(runs):
        done = run_capture([python, "-c", IN_PROCESS, str(binary)], env=env, timeout=60.0)
        if done.returncode != 0:
            raise SystemExit(done.stderr)
        imported, probed = (float(x) for x in done.stdout.split())
        imports.append(imported)
        probes.append(probed)
    row("import safe_llama.device.probing", statistics.median(imports), min(imports))
    row("probe_devices() warm", statistics.median(probes), min(probes))
    total = statistics.median(a + b for a, b in zip(imports, probes, strict=True))
    row("import + warm probe", total, min(a + b for a, b in zip(imports, probes, strict=True)))

    print("\nratios")
    print(f"  cold / warm (whole process)             {cold_med / warm_med:6.1f}x  (what the caches save)")
    print(f"  warm / CLI floor (whole process)        {warm_med / floor_cli:6.2f}x")
    for label, value in (("in process", total), ("whole process", warm_med)):
        verdict = "met" if value < 150 else "NOT met"
        print(f"  goal: warm probe < 150 ms, {label:<13}  {value:6.1f} ms: {verdict}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
