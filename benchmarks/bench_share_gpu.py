"""Several safe-llamas on one GPU (issue 35), side by side in one run: two `safe-llama server` started at the same
moment without shares (and the largest -c that starts beside the first, bisected with bare llama-server and the
second's argv), two with --share 0.5, three with --share 0.33, and a third launch while two (--share 0.33) run
(its `plan --json` first: it lists their reservations). Every launch's context, first spawn, lines, and NVML's
per-process reading while they run, as JSON for the replay (tests/plan/test_share_replay.py).

    PYTHONPATH=/tmp/site:$PWD python3 benchmarks/bench_share_gpu.py --bin-dir /tmp/lb/bin --model /tmp/big.gguf \
        --args "-c 2000000 -ngl 99" --out $OUT/share-gpu.json

The yardsticks (bare llama-server, N together) are tests/fixtures/nvidia-h200-cuda/layouts/together-n{1,2,3}.json.
Here (no GPU): --bin-dir of the CPU build, a small model and --args "-c 8192" run every case against the host."""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import IO

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from safe_llama.device.ledger import children  # noqa: E402
from safe_llama.device.probe_free import read_nvml_isolated  # noqa: E402

Launched = tuple[subprocess.Popen[bytes], int]
# each process's output goes to a file (a pipe nobody reads while it runs could fill and stop it): by pid
_LOGS: dict[int, IO[bytes]] = {}


def _spawn(argv: list[str], env: dict[str, str] | None = None) -> subprocess.Popen[bytes]:
    log = tempfile.TemporaryFile()  # noqa: SIM115 (closed in _stop, once the process has ended)
    proc = subprocess.Popen(argv, env=env, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT)
    _LOGS[proc.pid] = log
    return proc


def _port() -> int:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _get(port: int, path: str) -> dict[str, object] | None:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=2) as answer:
            data = json.loads(answer.read())
            return data if isinstance(data, dict) else None
    except (OSError, ValueError):
        return None


def _ready(launched: list[Launched], timeout: float) -> list[bool]:
    deadline = time.monotonic() + timeout
    ready = [False] * len(launched)
    while time.monotonic() < deadline and not all(ready):
        for i, (proc, port) in enumerate(launched):
            if not ready[i] and proc.poll() is None and _get(port, "/health") is not None:
                ready[i] = True
        if all(r or p.poll() is not None for r, (p, _) in zip(ready, launched, strict=True)):
            break
        time.sleep(0.1)
    return ready


def _stop(launched: list[Launched]) -> list[str]:
    for proc, _ in launched:
        if proc.poll() is None:
            proc.terminate()
    logs = []
    for proc, _ in launched:
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        log = _LOGS.pop(proc.pid)
        log.seek(0)
        logs.append(log.read().decode(errors="replace"))
        log.close()
    return logs


class Case:
    def __init__(self, ns: argparse.Namespace, runtime: Path) -> None:
        self.ns = ns
        self.runtime = runtime
        self.env = {k: v for k, v in os.environ.items() if not k.startswith(("LLAMA_ARG_", "SAFE_LLAMA_"))}
        self.env |= {"SAFE_LLAMA_BIN_DIR": ns.bin_dir, "XDG_RUNTIME_DIR": str(runtime), "PYTHONPATH": str(ROOT)}
        self.env["PYTHONPATH"] = os.pathsep.join(p for p in (os.environ.get("PYTHONPATH"), str(ROOT)) if p)

    def launch(self, share: float | None, n: int, cache: str) -> list[Launched]:
        """n `safe-llama server` started at the same moment (one Popen after the other, no wait between)."""
        out = []
        for i in range(n):
            port = _port()
            env = self.env | {"XDG_CACHE_HOME": str(self.runtime.parent / f"{cache}{i}")}
            own = ["--share", str(share)] if share is not None else []
            argv = [sys.executable, "-m", "safe_llama", *own, "server", "-m", self.ns.model, *self.ns.args.split()]
            proc = _spawn([*argv, "--host", "127.0.0.1", "--port", str(port)], env)
            out.append((proc, port))
        return out

    def seen(self, launched: list[Launched], ready: list[bool]) -> list[dict[str, object]]:
        rows = []
        for (proc, port), up in zip(launched, ready, strict=True):
            props = _get(port, "/props") if up else None
            settings = props.get("default_generation_settings") if props else None
            n_ctx = settings.get("n_ctx") if isinstance(settings, dict) else None
            kids = children([proc.pid]).get(proc.pid, ())
            rows.append({"ready": up, "n_ctx": n_ctx, "port": port, "argv": _child_argv(proc.pid), "children": kids})
        return rows

    def ledger(self) -> list[object]:
        """The ledger's entries now (device/ledger.py's files), as JSON."""
        folder = self.runtime / "safe-llama" / "ledger"
        return [json.loads(path.read_text()) for path in sorted(folder.glob("*.json"))]


def _child_argv(pid: int) -> list[str]:
    """The argv safe-llama gave its llama-server (its child's /proc cmdline), without the binary, host and port."""
    for kid in children([pid]).get(pid, ()):
        try:
            words = Path(f"/proc/{kid}/cmdline").read_bytes().decode(errors="replace").split("\0")[1:-1]
        except OSError:
            continue
        out, skip = [], False
        for word in words:
            if skip:
                skip = False
            elif word in ("--host", "--port"):
                skip = True
            else:
                out.append(word)
        return out
    return []


def _nvml() -> list[dict[str, object]]:
    return [r.to_dict() for r in read_nvml_isolated().readings]


def _finish(rows: list[dict[str, object]], logs: list[str], launched: list[Launched]) -> None:
    for row, log, (proc, _) in zip(rows, logs, launched, strict=True):
        row["pid"] = proc.pid
        row["first_spawn"] = "attempt 1 failed" not in log
        row["lines"] = [line for line in log.splitlines() if line.startswith("safe-llama:")][:40]


def together(case: Case, share: float | None, n: int, name: str, timeout: float) -> dict[str, object]:
    began = time.monotonic()
    launched = case.launch(share, n, name)
    ready = _ready(launched, timeout)
    took = time.monotonic() - began
    rows = case.seen(launched, ready)
    nvml = _nvml()
    logs = _stop(launched)
    _finish(rows, logs, launched)
    return {"case": name, "share": share, "n": n, "ready_s": round(took, 2), "launches": rows, "nvml": nvml}


def _bare_starts(ns: argparse.Namespace, argv: list[str], ctx: int, timeout: float) -> bool:
    port = _port()
    trial = list(argv)
    trial[trial.index("-c") + 1] = str(ctx)
    proc = _spawn([str(Path(ns.bin_dir) / "llama-server"), *trial, "--host", "127.0.0.1", "--port", str(port)])
    ready = _ready([(proc, port)], timeout)[0]
    _stop([(proc, port)])
    return ready


def beside_first(case: Case, timeout: float, probes: int) -> dict[str, object]:
    """Two at the same moment without shares; then, with the first still running, the largest -c of bare
    llama-server with the second's argv that starts beside it (bisected in [0.9, 1.1] x the second's)."""
    began = time.monotonic()
    launched = case.launch(None, 2, "pair")
    ready = _ready(launched, timeout)
    took = time.monotonic() - began
    rows = case.seen(launched, ready)
    nvml = _nvml()
    second = (
        1 if rows[0]["n_ctx"] and rows[1]["n_ctx"] and int(str(rows[0]["n_ctx"])) >= int(str(rows[1]["n_ctx"])) else 0
    )
    logs = _stop([launched[second]])
    first = launched[1 - second]
    plan = subprocess.run(
        [sys.executable, "-m", "safe_llama", "plan", "--json", "server", "-m", case.ns.model, *case.ns.args.split()],
        env=case.env | {"XDG_CACHE_HOME": str(case.runtime.parent / "plan")}, capture_output=True, text=True,
        check=False,
    )  # fmt: skip
    largest = None
    bisect: list[dict[str, object]] = []
    n_ctx = rows[second]["n_ctx"]
    argv = rows[second]["argv"]
    if isinstance(n_ctx, int) and n_ctx and isinstance(argv, list) and "-c" in argv:
        lo, hi = int(n_ctx * 0.9) // 256, int(n_ctx * 1.1) // 256 + 1
        for _ in range(probes):
            if lo + 1 >= hi:
                break
            mid = (lo + hi) // 2
            ok = _bare_starts(case.ns, argv, mid * 256, timeout)
            bisect.append({"ctx": mid * 256, "ok": ok})
            lo, hi = (mid, hi) if ok else (lo, mid)
        largest = lo * 256
    logs_first = _stop([first])
    all_logs = [logs_first[0], logs[0]] if second == 1 else [logs[0], logs_first[0]]
    _finish(rows, all_logs, launched)
    return {"case": "pair-no-share", "share": None, "n": 2, "ready_s": round(took, 2), "launches": rows,
            "nvml": nvml, "second": second, "largest_beside_first": largest, "bisect": bisect,
            "plan_beside_first": _json(plan.stdout)}  # fmt: skip


def _json(text: str) -> object:
    try:
        return json.loads(text)
    except ValueError:
        return {"unreadable": text[-2000:]}


def third_beside_two(case: Case, timeout: float) -> dict[str, object]:
    """Two with --share 0.33 running; a third without a share: its plan (--json) and its launch."""
    launched = case.launch(0.33, 2, "two")
    ready = _ready(launched, timeout)
    rows = case.seen(launched, ready)
    nvml_two = _nvml()
    entries = case.ledger()
    plan = subprocess.run(
        [sys.executable, "-m", "safe_llama", "plan", "--json", "server", "-m", case.ns.model, *case.ns.args.split()],
        env=case.env | {"XDG_CACHE_HOME": str(case.runtime.parent / "plan3")}, capture_output=True, text=True,
        check=False,
    )  # fmt: skip
    began = time.monotonic()
    third = case.launch(None, 1, "third")
    third_ready = _ready(third, timeout)
    took = time.monotonic() - began
    third_rows = case.seen(third, third_ready)
    nvml_three = _nvml()
    logs = _stop(third + launched)
    _finish(third_rows + rows, logs, third + launched)
    return {"case": "third-beside-two", "share": 0.33, "n": 3, "ready_s": round(took, 2), "running": rows,
            "third": third_rows[0], "nvml_two": nvml_two, "ledger": entries, "nvml": nvml_three,
            "plan": _json(plan.stdout)}  # fmt: skip


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--bin-dir", required=True)
    parser.add_argument("--model", required=True)
    parser.add_argument("--args", default="-c 2000000 -ngl 99")
    parser.add_argument("--out", required=True)
    parser.add_argument("--timeout", type=float, default=60.0, help="seconds a server may take to answer /health")
    parser.add_argument("--probes", type=int, default=6, help="bare starts bisecting the second's largest")
    ns = parser.parse_args()
    work = Path(tempfile.mkdtemp())
    runtime = work / "run"
    runtime.mkdir(mode=0o700)
    case = Case(ns, runtime)
    began = time.monotonic()
    rows: list[dict[str, object]] = [{"idle_nvml": _nvml(), "args": ns.args}]
    steps: list[Callable[[], dict[str, object]]] = [
        lambda: beside_first(case, ns.timeout, ns.probes),
        lambda: together(case, 0.5, 2, "share-0.5", ns.timeout),
        lambda: together(case, 0.33, 3, "share-0.33", ns.timeout),
        lambda: third_beside_two(case, ns.timeout),
    ]
    for step in steps:
        try:
            rows.append(step())
        except Exception as err:  # one case's failure must not lose the others' figures
            rows.append({"error": repr(err)})
        Path(ns.out).write_text(json.dumps(rows, indent=1) + "\n")
        print(
            json.dumps(
                {k: v for k, v in rows[-1].items() if k not in ("nvml", "nvml_two", "plan", "plan_beside_first")}
            )[:1500],
            flush=True,
        )
    print(f"all cases in {time.monotonic() - began:.1f} s", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
