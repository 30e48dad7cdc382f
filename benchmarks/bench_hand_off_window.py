"""The window between llama-server's /health answering 200 and safe-llama's hand-off to the small handed supervisor
(issue 37): requests can fill the context in it while the full supervisor is still charged to the service's cgroup.

    python3 benchmarks/bench_hand_off_window.py [--runs 7] [--limit-mib 256] [--ctx 8192]

Each run: `safe-llama server -m WIDE -c CTX` (a first start: a fresh cache) in a fresh memory cgroup (v2 with the
memory controller, else v1), /health polled every 2 ms from outside; once it answers 200, the supervisor's
/proc/PID/cmdline polled every 1 ms until it is the handed supervisor's (process/handed.py's CODE), and systemd's
READY=1 read from a notify socket of our own. Prints, per run and as medians: ms from /health 200 to READY=1, and
to the hand-off's exec (0 where the handed supervisor was there before /health answered: a hand-off at the spawn,
attempts/at_spawn.py, which `--no-hand-off`-free launches under a cgroup make). Needs root.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from benchmarks.bench_host_limits import MIB, Limit, confined  # noqa: E402
from tests.llama_run import free_port, healthy, stop_process  # noqa: E402
from tests.tiny_gguf import write_wide_kv_gguf  # noqa: E402

REMEMBER: list[str] = []  # --no-remember: no plan remembered nor launch record written at ready


def _handed(pid: int) -> bool:
    try:
        return b"entry import handed" in Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return False


def one_run(model: Path, ctx: int, limit: Limit, work: Path) -> dict[str, float | bool | None]:
    notify = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    address = work / f"notify-{time.monotonic_ns()}"
    notify.bind(str(address))
    notify.setblocking(False)
    port = free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SAFE_LLAMA_", "LLAMA_ARG_"))}
    env.update(XDG_CACHE_HOME=str(work / f"cache-{time.monotonic_ns()}"), NOTIFY_SOCKET=str(address))
    argv = [sys.executable, "-m", "safe_llama", *REMEMBER, "server", "-m", str(model), "-c", str(ctx),
            "--port", str(port)]  # fmt: skip
    with confined(limit) as enter:
        proc = subprocess.Popen(argv, env=env, cwd=ROOT, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                stderr=subprocess.DEVNULL, preexec_fn=enter)  # fmt: skip
        try:
            began = time.monotonic()
            health_at = ready_at = handed_at = None
            before = False  # the handed supervisor was there before /health answered (a hand-off at the spawn)
            while time.monotonic() - began < 120 and proc.poll() is None and (handed_at is None or ready_at is None):
                now = time.monotonic()
                if health_at is None:
                    before = _handed(proc.pid)
                    if healthy(port):
                        health_at = time.monotonic()
                try:
                    if b"READY=1" in notify.recv(4096) and ready_at is None:
                        ready_at = now
                except BlockingIOError:
                    pass
                if health_at is not None and handed_at is None and _handed(proc.pid):
                    handed_at = health_at if before else time.monotonic()
                time.sleep(0.001 if health_at is not None else 0.002)
        finally:
            stop_process(proc, 20)
            notify.close()
    if health_at is None:
        return {"ready_ms": None, "handed_ms": None, "handed_before_health": None}

    def ms(at: float | None) -> float | bool | None:
        return None if at is None or health_at is None else round(1000 * (at - health_at), 1)

    return {"ready_ms": ms(ready_at), "handed_ms": ms(handed_at), "handed_before_health": before}


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--runs", type=int, default=7)
    parser.add_argument("--limit-mib", type=int, default=256)
    parser.add_argument("--ctx", type=int, default=8192)
    parser.add_argument("--no-remember", action="store_true")
    ns = parser.parse_args()
    REMEMBER[:] = ["--no-remember"] if ns.no_remember else []
    work = Path(tempfile.mkdtemp(prefix="hand-off-window-"))
    model = write_wide_kv_gguf(work)
    runs = [one_run(model, ns.ctx, Limit("cgroup", ns.limit_mib * MIB), work) for _ in range(ns.runs)]
    out: dict[str, object] = {"runs": runs}
    for key in ("ready_ms", "handed_ms"):
        values = [value for r in runs if (value := r[key]) is not None]
        out[f"median_{key}"] = statistics.median(values) if values else None
    print(json.dumps(out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
