"""First start and closeness on a real device: safe-llama's plan against the largest context that really
starts, each next to bare llama-server under the same arguments.

    python3 benchmarks/bench_first_start.py --bin-dir DIR --model M.gguf --out results.json \
        --case "ngl99|-c 2000000 -ngl 99" --case "no-c|-ngl 99" ...

Per case: `safe-llama plan --json server ARGS` (the final argv), then `safe-llama server ARGS` until /health
200 (first start: one spawn, no retry), then the largest -c that starts with safe-llama's final argv and
environment (bisection to 0.5%, /health 200 counts), then bare llama-server with ARGS as the user typed them
(llama.cpp's own fit choosing what it leaves open). Written for the GPU machine (device tool) and usable on
any host. Every process is stopped; every wait is bounded.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
_SLOT_CTX = re.compile(r"llama_context: n_ctx += (\d+)")
_KV = re.compile(r"llama_kv_cache: size = +([\d.]+) MiB \( *(\d+) cells.*?K \((\w+)\).*?V \((\w+)\)")
_FAILED = re.compile(r"attempt \d+ failed")


def _port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _healthy(port: int) -> bool:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=1) as r:
            return bool(r.status == 200)
    except OSError:
        return False


def stop_group(proc: subprocess.Popen[bytes]) -> None:
    """Stop a server started in its own session, and all it started: SIGTERM, then SIGKILL after 30 s."""
    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


def start(argv: list[str], env: dict[str, str], timeout: float) -> tuple[bool, int | None, str, float]:
    """Run a server command (argv without --port) until /health 200 or exit: (ready, exit code, log, seconds)."""
    port = _port()
    began = time.monotonic()
    proc = subprocess.Popen(
        [*argv, "--host", "127.0.0.1", "--port", str(port)],
        env=env,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    ready = False
    deadline = began + timeout
    while time.monotonic() < deadline and proc.poll() is None:
        if _healthy(port):
            ready = True
            break
        time.sleep(0.25)
    took = time.monotonic() - began
    stop_group(proc)
    assert proc.stdout is not None
    log = proc.stdout.read().decode(errors="replace")
    return ready, None if ready else proc.returncode, log, took


def _with_ctx(argv: list[str], ctx: int) -> list[str]:
    out, i = [], 0
    while i < len(argv):
        if argv[i] in ("-c", "--ctx-size"):
            i += 2
            continue
        out.append(argv[i])
        i += 1
    return [*out, "-c", str(ctx)]


def largest(
    binary: str, argv: list[str], env: dict[str, str], low: int, timeout: float, budget: int
) -> tuple[int, int]:
    """The largest -c that starts, from a context known to start, stepping up 10% until one fails, then
    bisecting to 0.5%: (largest, starts tried)."""
    tried = 0
    high = None
    probe = low
    while high is None and tried < budget:
        probe = int(probe * 1.1) // 256 * 256
        tried += 1
        if start([binary, *_with_ctx(argv, probe)], env, timeout)[0]:
            low = probe
        else:
            high = probe
    if high is None:
        return low, tried
    while high - low > max(256, low // 200) and tried < budget:
        mid = (low + high) // 2 // 256 * 256
        if mid <= low:
            break
        tried += 1
        if start([binary, *_with_ctx(argv, mid)], env, timeout)[0]:
            low = mid
        else:
            high = mid
    return low, tried


def _kv(log: str) -> list[dict[str, object]]:
    return [{"mib": float(m[0]), "cells": int(m[1]), "k": m[2], "v": m[3]} for m in _KV.findall(log)]


def run_case(name: str, args: list[str], ns: argparse.Namespace, env: dict[str, str]) -> dict[str, object]:
    py = [sys.executable, "-m", "safe_llama"]
    senv = {**env, "SAFE_LLAMA_BIN_DIR": ns.bin_dir, "PYTHONPATH": f"{ROOT}:{env.get('PYTHONPATH', '')}"}
    plan = json.loads(subprocess.run([*py, "plan", "--json", "server", "-m", ns.model, *args], env=senv,
                                     capture_output=True, text=True, check=True, timeout=300).stdout)  # fmt: skip
    decision = plan.get("decision") if isinstance(plan.get("decision"), dict) else {}
    final = list(decision.get("argv", []))
    plan_env = {**env, **dict(decision.get("env", {}))}
    ready, code, log, took = start([*py, "server", "-m", ns.model, *args, "-lv", "4"], senv, ns.timeout)
    attempts = 1 + len(_FAILED.findall(log))
    row: dict[str, object] = {
        "case": name,
        "args": args,
        "plan_argv": final,
        "plan_notes": plan.get("notes"),
        "safe_llama": {"ready": ready, "exit": code, "seconds": round(took, 1), "attempts": attempts,
                       "kv": _kv(log), "lines": [x for x in log.splitlines() if x.startswith("safe-llama")]},
    }  # fmt: skip
    (Path(ns.logs) / f"{name}-safe-llama.log").write_text(log)
    chosen = [int(m) for m in _SLOT_CTX.findall(log)]
    binary = str(Path(ns.bin_dir) / "llama-server")
    if ready and chosen and final and ns.budget > 0:
        best, tried = largest(binary, final, plan_env, chosen[-1],
                              ns.timeout, ns.budget)  # fmt: skip
        row["largest_that_starts"] = best
        row["bisection_starts"] = tried
        row["chosen"] = chosen[-1]
        row["ratio"] = round(chosen[-1] / best, 4) if best else None
    if ns.no_bare:
        return row
    bare_ready, bare_code, bare_log, bare_took = start([binary, "-m", ns.model, *args, "-lv", "4"], env, ns.timeout)
    (Path(ns.logs) / f"{name}-bare.log").write_text(bare_log)
    bare_ctx = [int(m) for m in _SLOT_CTX.findall(bare_log)]
    row["bare"] = {"ready": bare_ready, "exit": bare_code, "seconds": round(bare_took, 1),
                   "n_ctx": bare_ctx[-1] if bare_ctx else None, "kv": _kv(bare_log)}  # fmt: skip
    return row


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--bin-dir", required=True)
    ap.add_argument("--model", required=True)
    ap.add_argument("--case", action="append", required=True, help="NAME|llama-server args")
    ap.add_argument("--out", required=True)
    ap.add_argument("--logs", default=".")
    ap.add_argument("--timeout", type=float, default=180)
    ap.add_argument("--budget", type=int, default=9, help="bisection starts per case (0: no bisection)")
    ap.add_argument("--no-bare", action="store_true", help="skip bare llama-server")
    ns = ap.parse_args()
    Path(ns.logs).mkdir(parents=True, exist_ok=True)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("LLAMA_ARG_", "SAFE_LLAMA_"))}
    rows = []
    for case in ns.case:
        name, _, args = case.partition("|")
        rows.append(run_case(name, args.split(), ns, env))
        Path(ns.out).write_text(json.dumps(rows, indent=1))
        print(json.dumps(rows[-1]), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
