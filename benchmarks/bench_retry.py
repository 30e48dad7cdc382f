"""The retry against the truth under an address-space limit (ulimit -v), bundled model, llama-server.

    python3 benchmarks/bench_retry.py [--limits-kib 1048576,2621440]

Per limit: safe-llama server with prediction off (-c 2000000, so the first start fails on purpose) and
the context its retry ended at, spawn by spawn; then the largest -c that really starts (/health 200) with
the same argv and environment, by bisection on llama.cpp's 256-cell grid; and the ratio.
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from safe_llama.model.bundled import bundled_model_path  # noqa: E402
from safe_llama.paths import pinned_bin_dir  # noqa: E402
from tests.llama_run import free_port, healthy, run_server_until_ready  # noqa: E402

ASKED = 2_000_000
_SLOT = re.compile(r"n_ctx_seq \((\d+)\)|the slot context \((\d+)\)")


def safe_llama_retry(model: str, kib: int, env: dict[str, str]) -> tuple[bool, list[str], int | None]:
    """(ready, the attempt lines, the last context llama.cpp was started with)."""
    port = free_port()
    proc = subprocess.Popen(
        [sys.executable, "-m", "safe_llama", "server", "-m", model, "-c", str(ASKED), "--port", str(port)],
        env={**env, "SAFE_LLAMA_PREDICT": "0", "XDG_CACHE_HOME": tempfile.mkdtemp()},
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        preexec_fn=lambda: __import__("resource").setrlimit(__import__("resource").RLIMIT_AS, (kib * 1024,) * 2),
    )
    ready = False
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline and proc.poll() is None:
        if healthy(port):
            ready = True
            break
        time.sleep(0.2)
    if proc.poll() is None:
        proc.terminate()
    err = proc.communicate(timeout=60)[1].decode(errors="replace")
    contexts = [int(a or b) for a, b in _SLOT.findall(err)]
    return (
        ready,
        [line for line in err.splitlines() if line.startswith("safe-llama: attempt")],
        (contexts[-1] if contexts else None),
    )


def largest_that_starts(bin_dir: Path, model: str, kib: int, env: dict[str, str], lo: int, hi: int) -> int:
    argv = ["-m", model, "-fit", "off", "-c"]

    def starts(ctx: int) -> bool:
        return run_server_until_ready(bin_dir, [*argv, str(ctx)], env, as_limit_kib=kib)[0] is None

    lo, hi = lo // 256, -(-hi // 256)
    while not starts(lo * 256):
        lo //= 2
    while starts(hi * 256):
        lo, hi = hi, hi * 2
    for _ in range(40):  # bounded: the gap halves each time
        if hi - lo <= 1:
            break
        mid = (lo + hi) // 2
        if starts(mid * 256):
            lo = mid
        else:
            hi = mid
    return lo * 256


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--limits-kib", default="1048576,1572864,2621440")
    opts = parser.parse_args()
    model = str(bundled_model_path(os.environ))
    bin_dir = pinned_bin_dir("cpu", os.environ)
    base = {k: v for k, v in os.environ.items() if not k.startswith(("LLAMA_ARG_", "SAFE_LLAMA_"))}
    base["SAFE_LLAMA_BIN_DIR"] = str(bin_dir)
    print(f"{'limit':>10} {'spawns':>7} {'safe-llama -c':>14} {'largest that starts':>20} {'ratio':>7}")
    for kib in (int(x) for x in opts.limits_kib.split(",")):
        ready, attempts, chosen = safe_llama_retry(model, kib, base)
        spawns = len(attempts) + (1 if ready else 0)
        for line in attempts:
            print(f"    {line[:160]}")
        guess = chosen or 100_000
        truth = largest_that_starts(bin_dir, model, kib, {**base, "MALLOC_ARENA_MAX": "2"}, guess // 2, guess)
        ratio = f"{chosen / truth:.1%}" if ready and chosen else "failed"
        print(f"{kib / 1048576:>8.2f}Gi {spawns:>7} {chosen or 0:>14} {truth:>20} {ratio:>7}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
