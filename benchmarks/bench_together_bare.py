"""The largest -c at which N bare llama-servers with the same arguments are up together on one device: the
yardstick for several safe-llamas sharing it (issue 35).

    python3 benchmarks/bench_together_bare.py --bin-dir DIR --model M.gguf --n 2 --low 400000 --high 1000000 \
        --args "-ngl 99 -fa on -ctk q8_0 -ctv q8_0 -fit off" --out rows.json

Each probe starts the N servers one after the other (each until /health 200), keeps them all running, and counts
the context as fitting when all N answer /health; then stops them all. Bisection to 0.5% within --budget probes.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import IO

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from benchmarks.bench_first_start import _healthy, _port


def together(binary: str, model: str, args: list[str], ctx: int, n: int, timeout: float) -> tuple[bool, list[str]]:
    procs: list[tuple[subprocess.Popen[bytes], int, IO[bytes]]] = []
    ok = True
    tails: list[str] = []
    with contextlib.ExitStack() as stack:
        try:
            for _ in range(n):
                port = _port()
                logf = stack.enter_context(tempfile.TemporaryFile())
                proc = subprocess.Popen(
                    [binary, "-m", model, *args, "-c", str(ctx), "--host", "127.0.0.1", "--port", str(port)],
                    stdin=subprocess.DEVNULL,
                    stdout=logf,
                    stderr=subprocess.STDOUT,
                    start_new_session=True,
                )
                procs.append((proc, port, logf))
                began = time.monotonic()
                while time.monotonic() < began + timeout and proc.poll() is None and not _healthy(port):
                    time.sleep(0.2)
                if proc.poll() is not None or not _healthy(port):
                    ok = False
                    break
            ok = ok and all(p.poll() is None and _healthy(port) for p, port, _ in procs)
        finally:
            for proc, _, _ in procs:
                if proc.poll() is None:
                    os.killpg(proc.pid, signal.SIGTERM)
            for proc, _, log in procs:
                try:
                    proc.wait(30)
                except subprocess.TimeoutExpired:
                    os.killpg(proc.pid, signal.SIGKILL)
                    proc.wait()
                log.seek(0)
                lines = log.read().decode(errors="replace").splitlines()
                tails.append("\n".join(ln for ln in lines if "failed" in ln or "error" in ln.lower())[-600:])
    return ok, tails


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--bin-dir", required=True)
    ap.add_argument("--model", required=True)
    ap.add_argument("--n", type=int, required=True)
    ap.add_argument("--low", type=int, required=True, help="a context expected to fit")
    ap.add_argument("--high", type=int, required=True, help="a context expected not to fit")
    ap.add_argument("--args", required=True)
    ap.add_argument("--budget", type=int, default=9)
    ap.add_argument("--timeout", type=float, default=90)
    ap.add_argument("--out", required=True)
    ns = ap.parse_args()
    binary = str(Path(ns.bin_dir) / "llama-server")
    args = ns.args.split()
    low, high, tried, probes = ns.low, ns.high, 0, []
    while high - low > max(256, low // 200) and tried < ns.budget:
        mid = (low + high) // 2 // 256 * 256
        if mid <= low:
            break
        tried += 1
        ok, tails = together(binary, ns.model, args, mid, ns.n, ns.timeout)
        probes.append({"ctx": mid, "ok": ok, "errors": [t for t in tails if t]})
        print(json.dumps(probes[-1]), flush=True)
        if ok:
            low = mid
        else:
            high = mid
    row = {"n": ns.n, "args": ns.args, "largest": low, "smallest_failing": high, "probes": probes}
    Path(ns.out).write_text(json.dumps(row, indent=1))
    print(json.dumps({k: row[k] for k in ("n", "largest", "smallest_failing")}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
