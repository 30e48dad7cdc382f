"""What llama.cpp itself reserves for each server layout on a real device: bare llama-server started at a few
contexts per shape (-np, -no-kvu, -fa, -ub/-b, -ctk/-ctv), every buffer line it logs and the device's used
memory once it is ready, written as JSON rows: the ground truth plan.compute is checked against.

    python3 benchmarks/bench_layouts_gpu.py --bin-dir DIR --model M.gguf --out rows.json --logs DIR \
        [--ctx 32768 --ctx 131072 ...] [--shape "np16|-np 16" ...]

No --shape: the matrix of issue 36. Each start is bounded (--timeout) and stopped once its buffers are
logged and /health answers (or it exits). nvidia-smi, when present, gives the device's used memory.
"""

from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from benchmarks.bench_first_start import _healthy, _port, stop_group

SHAPES = {
    "default": "",
    "np1": "-np 1",
    "np4": "-np 4",
    "np8": "-np 8",
    "np16": "-np 16",
    "np32": "-np 32",
    "np64": "-np 64",
    "np1-nokvu": "-np 1 -no-kvu",
    "np4-nokvu": "-np 4 -no-kvu",
    "np8-nokvu": "-np 8 -no-kvu",
    "np16-nokvu": "-np 16 -no-kvu",
    "np32-nokvu": "-np 32 -no-kvu",
    "np64-nokvu": "-np 64 -no-kvu",
    "fa-off": "-fa off",
    "fa-on": "-fa on",
    "ub4096": "-ub 4096 -b 4096",
    "ub8192": "-ub 8192 -b 8192",
    "ub128": "-ub 128 -b 128",
    "q4": "-ctk q4_0 -ctv q4_0",
    "q8": "-ctk q8_0 -ctv q8_0",
    "fa-off-k8": "-fa off -ctk q8_0",
    "np16-q8": "-np 16 -ctk q8_0 -ctv q8_0",
    "fa-off-np16": "-fa off -np 16",
}
_BUF = re.compile(
    r"(?P<who>\w+): +(?P<dev>[\w_]+) +(?P<kind>compute|KV|output|model|RS) buffer size = +(?P<mib>[\d.]+) MiB"
)
_CTX = re.compile(r"llama_context: n_ctx += (\d+)")
_CTX_SEQ = re.compile(r"llama_context: n_ctx_seq += (\d+)")
_FA = re.compile(r"flash_attn += (\w+)")


def _used_mib() -> int | None:
    try:
        out = subprocess.run(
            ["nvidia-smi", "--query-gpu=memory.used", "--format=csv,noheader,nounits"],
            capture_output=True,
            text=True,
            timeout=10,
            check=False,
        ).stdout
        return int(out.split()[0])
    except (OSError, ValueError, IndexError, subprocess.TimeoutExpired):
        return None


def _start(argv: list[str], env: dict[str, str], timeout: float) -> tuple[bool, int | None, str, float, int | None]:
    """llama-server until /health 200 or exit; the device's used memory while it is ready; then stopped."""
    import tempfile

    port = _port()
    began = time.monotonic()
    with tempfile.TemporaryFile() as logf:
        proc = subprocess.Popen(
            [*argv, "--host", "127.0.0.1", "--port", str(port)],
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=logf,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        ready, used = False, None
        while time.monotonic() < began + timeout and proc.poll() is None:
            if _healthy(port):
                ready = True
                time.sleep(0.3)
                used = _used_mib()
                break
            time.sleep(0.2)
        took = time.monotonic() - began
        stop_group(proc)
        logf.seek(0)
        log = logf.read().decode(errors="replace")
    return ready, None if ready else proc.returncode, log, took, used


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--bin-dir", required=True)
    ap.add_argument("--model", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--logs", default="")
    ap.add_argument("--ctx", type=int, action="append")
    ap.add_argument("--shape", action="append", help="NAME|llama-server args")
    ap.add_argument("--extra", default="-ngl 99 --fit off -lv 4", help="arguments every start gets")
    ap.add_argument("--timeout", type=float, default=90)
    ap.add_argument("--tag", default="")
    ns = ap.parse_args()
    shapes = dict(s.split("|", 1) for s in ns.shape) if ns.shape else SHAPES
    ctxs = ns.ctx or [32768, 131072, 524288]
    binary = str(Path(ns.bin_dir) / "llama-server")
    import os

    env = dict(os.environ)
    rows: list[dict[str, object]] = []
    idle = _used_mib()
    for name, args in shapes.items():
        for ctx in ctxs:
            argv = [binary, "-m", ns.model, *ns.extra.split(), *args.split(), "-c", str(ctx)]
            began = time.monotonic()
            ready, rc, log, took, used = _start(argv, env, ns.timeout)
            bufs = [m.groupdict() for m in (_BUF.search(line) for line in log.splitlines()) if m]
            row = {
                "tag": ns.tag,
                "shape": name,
                "args": args,
                "ctx": ctx,
                "ready": ready,
                "rc": rc,
                "seconds": round(took, 2),
                "idle_used_mib": idle,
                "ready_used_mib": used,
                "n_ctx": [int(x) for x in _CTX.findall(log)],
                "n_ctx_seq": [int(x) for x in _CTX_SEQ.findall(log)],
                "flash_attn": _FA.findall(log)[:2],
                "notes": [
                    ln.split(" I ", 1)[-1]
                    for ln in log.splitlines()
                    if "Flash Attention" in ln
                    or "kv_unified" in ln
                    or "graph nodes" in ln
                    or "graph splits" in ln
                    or "n_seq_max" in ln
                    or "n_batch" in ln
                    or "n_ubatch" in ln
                ][:12],
                "buffers": [{"dev": b["dev"], "kind": b["kind"], "mib": float(b["mib"])} for b in bufs],
                "errors": [ln for ln in log.splitlines() if "failed" in ln or "error" in ln.lower()][:6],
                "wall": round(time.monotonic() - began, 2),
            }
            rows.append(row)
            print(json.dumps(row), flush=True)
            if ns.logs:
                Path(ns.logs).mkdir(parents=True, exist_ok=True)
                (Path(ns.logs) / f"{ns.tag}{name}-c{ctx}.log").write_text(log)
    Path(ns.out).write_text(json.dumps(rows, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
