"""Pipe-mode relay throughput of supervise.supervise_child() against `cat` writing straight into a pipe.

Also reports the supervisor's peak RSS and the speed while start-up output is still being scanned.
Run: python benchmarks/bench_relay.py [--mib 512] [--scan-mib 16] [--repeat 3]
The goal for the relay once start-up is over is at least 200 MB/s.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
CAT = shutil.which("cat") or "/bin/cat"  # the relayed program, by its path (spawn does not search PATH)

# The wrapper side: supervise_child() with stdout a pipe to this benchmark; its own peak RSS on stderr at the end.
DRIVER = """
import os, sys
from safe_llama.diagnosis.signatures import load_table
from safe_llama.process.readiness import GenerationProbe
from safe_llama.process.startup import StartupWatcher
from safe_llama.process.supervise import supervise_child
probe = GenerationProbe() if sys.argv[1] == "ready" else None
outcome = supervise_child(sys.argv[2:], os.environ, watcher=StartupWatcher(load_table()), probe=probe)
status = open("/proc/self/status").read().splitlines()
peak = next(line.split()[1] for line in status if line.startswith("VmHWM"))
sys.stderr.write(f"rss_peak_kib={peak} ready={outcome.ready}\\n")
sys.exit(outcome.exit_code)
"""


def consume(argv: list[str]) -> tuple[float, int, str]:
    """Seconds until EOF on the command's stdout, bytes read, its stderr."""
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    started = time.perf_counter()
    proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env)
    assert proc.stdout is not None and proc.stderr is not None
    total = 0
    fd = proc.stdout.fileno()
    while chunk := os.read(fd, 1 << 20):
        total += len(chunk)
    elapsed = time.perf_counter() - started
    stderr = proc.stderr.read().decode()
    if proc.wait() != 0 and not total:
        raise SystemExit(f"{argv[:3]} failed: {stderr.strip()[-400:]}")
    return elapsed, total, stderr


def best(argv: list[str], repeat: int) -> tuple[float, int, str]:
    runs = [consume(argv) for _ in range(repeat)]
    return min(runs, key=lambda run: run[0])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--mib", type=int, default=512, help="size of the relayed output")
    parser.add_argument("--scan-mib", type=int, default=16, help="size of the output scanned before readiness")
    parser.add_argument("--repeat", type=int, default=3)
    opts = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        data = Path(tmp) / "data.bin"
        with data.open("wb") as f:
            block = os.urandom(1 << 20)
            for _ in range(opts.mib):
                f.write(block)
        log = Path(tmp) / "log.txt"
        line = b"0.00.985.966 W load: control-looking token:    212 '</s>' was not control-type; overridden\n"
        log.write_bytes(line * (opts.scan_mib * (1 << 20) // len(line)))

        direct, size, _ = best(["cat", str(data)], opts.repeat)
        relayed, relayed_size, stderr = best([sys.executable, "-c", DRIVER, "ready", CAT, str(data)], opts.repeat)
        assert relayed_size == size, (relayed_size, size)
        scanned, scanned_size, _ = best([sys.executable, "-c", DRIVER, "never", CAT, str(log)], 1)

    mb = size / 1e6
    print(
        f"cat into a pipe:                                {mb / direct:8.0f} MB/s  ({size >> 20} MiB in {direct:.2f} s)"
    )
    times = f"({relayed / direct:.2f}x the time of cat)"
    print(f"through supervise_child(), after readiness:    {mb / relayed:8.0f} MB/s  {times}")
    print(f"through supervise_child(), scanning log lines: {scanned_size / 1e6 / scanned:8.1f} MB/s")
    print(f"supervisor: {stderr.strip()}")


if __name__ == "__main__":
    main()
