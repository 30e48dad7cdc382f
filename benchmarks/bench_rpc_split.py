"""The RPC split and context safe-llama chooses against the truth: two real workers (the pinned
ggml-rpc-server) on 127.0.0.1, each in a cgroup v1 memory group of its own (120 and 80 MiB), a random llama
(8 layers, 4 KV heads of 128: 16 KiB of f16 KV per cell), the head told both budgets (--rpc-memory) and asked
for -c 32768. safe-llama's plan is started and sent one request that fills its context; then the bare
llama-server is bisected over every split (-ts a,b) and context for the largest that serves such a request
with no worker killed. Prints the chosen split and context, the best found, and their ratio.

    sudo .venv/bin/python benchmarks/bench_rpc_split.py [--splits 5,4 6,3] [--keep DIR]

Root (it creates and removes the cgroups); minutes of CPU."""

from __future__ import annotations

import argparse
import json
import os
import re
import signal
import subprocess
import sys
import tempfile
import time
import urllib.request
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from safe_llama.paths import pinned_bin_dir  # noqa: E402
from safe_llama.process.readiness import listening  # noqa: E402
from tests.llama_run import free_port  # noqa: E402
from tests.tiny_gguf import write_tiny_gguf  # noqa: E402

MIB = 1 << 20
LIMITS = (120, 80)
ASKED = 32768
BASE = Path("/sys/fs/cgroup/memory")
COMPUTE = re.compile(r"(?P<dev>RPC\d\[[^\]]+\]|CPU) compute buffer size = +(?P<mib>[\d.]+) MiB")


@dataclass
class Worker:
    port: int
    limit_mib: int
    group: Path
    binary: Path
    proc: subprocess.Popen[bytes] | None = None

    @property
    def endpoint(self) -> str:
        return f"127.0.0.1:{self.port}"

    def start(self) -> None:
        self.stop()
        procs = self.group / "cgroup.procs"
        self.proc = subprocess.Popen(
            [str(self.binary), "-H", "127.0.0.1", "-p", str(self.port)],
            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
            preexec_fn=lambda: procs.write_text(str(os.getpid())),
        )  # fmt: skip
        deadline = time.monotonic() + 20
        while not listening(self.port):
            if time.monotonic() > deadline or self.proc.poll() is not None:
                raise RuntimeError(f"worker {self.endpoint} did not listen")
            time.sleep(0.05)

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            self.proc.wait(30)
        self.proc = None

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None


def fill(port: int, ctx: int, timeout: float = 900) -> bool:
    """One request whose prompt fills the context (token ids, 2 predicted): served in full?"""
    body = json.dumps({"prompt": [300 + i % 25 for i in range(ctx - 16)], "n_predict": 2, "cache_prompt": False})
    request = urllib.request.Request(
        f"http://127.0.0.1:{port}/completion", body.encode(), {"Content-Type": "application/json"}
    )
    try:
        with urllib.request.urlopen(request, timeout=timeout) as answer:  # noqa: S310 - loopback http, built here
            return answer.status == 200 and int(json.loads(answer.read()).get("tokens_evaluated", 0)) >= ctx - 16
    except OSError:
        return False


def serve(argv: list[str], env: dict[str, str], port: int, log: Path) -> subprocess.Popen[bytes] | None:
    """Start a server and wait until its task loop answers (GET /slots); None if it exits first."""
    with log.open("wb") as out:
        proc = subprocess.Popen(argv, env=env, stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT)
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline and proc.poll() is None:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/slots", timeout=2) as answer:
                if answer.status == 200:
                    return proc
        except OSError:
            pass
        time.sleep(0.2)
    stop(proc)
    return None


def stop(proc: subprocess.Popen[bytes]) -> None:
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(30)


def trial(workers: list[Worker], argv: list[str], env: dict[str, str], ctx: int, work: Path) -> tuple[bool, str]:
    """Fresh workers, a server at this context, one request that fills it: (served with no worker lost, log)."""
    for w in workers:
        w.start()
    port = free_port()
    log = work / "server.log"
    proc = serve([*argv, "-c", str(ctx), "--port", str(port)], env, port, log)
    ok = proc is not None and fill(port, ctx) and all(w.alive() for w in workers)
    if proc is not None:
        stop(proc)
    return ok, log.read_text(errors="replace")


def largest(workers: list[Worker], argv: list[str], env: dict[str, str], work: Path, lo: int, hi: int) -> int:
    """The largest -c (multiple of 256) in [lo, hi] that serves a full request; 0 if lo does not."""
    if not trial(workers, argv, env, lo, work)[0]:
        return 0
    a, b = lo // 256, hi // 256 + 1  # a serves, b does not (or is past hi)
    while a + 1 < b:
        mid = (a + b) // 2
        if trial(workers, argv, env, mid * 256, work)[0]:
            a = mid
        else:
            b = mid
    return a * 256


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--splits", nargs="*", default=None, help="only these -ts a,b (default: every split)")
    parser.add_argument("--keep", type=Path, default=None, help="keep the logs in this folder")
    args = parser.parse_args()
    binary_dir = Path(os.environ.get("SAFE_LLAMA_BIN_DIR") or pinned_bin_dir("cpu", os.environ))
    py = str(ROOT / ".venv" / "bin" / "python") if (ROOT / ".venv").is_dir() else sys.executable
    work = args.keep or Path(tempfile.mkdtemp())
    work.mkdir(parents=True, exist_ok=True)
    model = write_tiny_gguf(
        work / "m8.gguf",
        n_layer=8,
        n_head=4,
        n_head_kv=4,
        head_dim=128,
        n_embd=256,
        n_ff=512,
        n_ctx_train=65536,
        sparse=True,
    )
    workers = []
    for i, limit in enumerate(LIMITS):
        group = BASE / f"sl-bench-split-{os.getpid()}-{i}"
        group.mkdir()
        (group / "memory.limit_in_bytes").write_text(str(limit * MIB))
        workers.append(Worker(free_port(), limit, group, binary_dir / "ggml-rpc-server"))
    env = {k: v for k, v in os.environ.items() if not k.startswith(("LLAMA_ARG_", "SAFE_LLAMA_"))}
    env |= {"SAFE_LLAMA_BIN_DIR": str(binary_dir), "XDG_CACHE_HOME": str(work / "cache"), "PYTHONPATH": str(ROOT)}
    try:
        for w in workers:
            w.start()
        rpc = ",".join(w.endpoint for w in workers)
        budgets = ",".join(f"{w.endpoint}={w.limit_mib}M" for w in workers)
        asked = ["-m", str(model), "--rpc", rpc, "-c", str(ASKED)]
        started = time.monotonic()
        plan = json.loads(
            subprocess.run(
                [py, "-m", "safe_llama", "plan", "--json", "--rpc-memory", budgets, "server", *asked],
                env=env, capture_output=True, text=True, timeout=300, check=True,
            ).stdout
        )  # fmt: skip
        argv = plan["decision"]["argv"]
        chosen_ts = argv[argv.index("-ts") + 1]
        chosen_ctx = int(argv[argv.index("-c") + 1])
        print(f"safe-llama: -ts {chosen_ts} -c {chosen_ctx} (planned in {time.monotonic() - started:.1f} s)")
        for name, items in plan["memory"].items():
            print(f"  planned {name}: " + ", ".join(f"{k} {v / MIB:.2f} MiB" for k, v in sorted(items.items())))
        port = free_port()
        launch = [py, "-m", "safe_llama", "--rpc-memory", budgets, "server", *asked, "--port", str(port)]
        for w in workers:
            w.start()
        proc = serve(launch, env, port, work / "safe-llama.log")
        served = proc is not None and fill(port, chosen_ctx) and all(w.alive() for w in workers)
        if proc is not None:
            stop(proc)
        log = (work / "safe-llama.log").read_text(errors="replace")
        print(f"  safe-llama's start: {'served a full request' if served else 'FAILED'}, no worker lost: "
              f"{all(w.alive() for w in workers)}")  # fmt: skip
        print("  " + "\n  ".join(line for line in log.splitlines() if line.startswith("safe-llama:")))
        for m in COMPUTE.finditer(log):
            print(f"  real compute {m['dev']}: {m['mib']} MiB")
        bare = [str(binary_dir / "llama-server"), "-m", str(model), "--rpc", rpc, "-fit", "off"]
        n_slots = 9  # 8 layers and the output layer
        splits = args.splits or [f"{a},{n_slots - a}" for a in range(1, n_slots)]
        best = (0, "")
        for ts in splits:
            found = largest(workers, [*bare, "-ts", ts], env, work, 1024, 12288)
            print(f"bare llama-server -ts {ts}: largest context that serves a full request: {found}")
            if found > best[0]:
                best = (found, ts)
        print(f"chosen -ts {chosen_ts} -c {chosen_ctx}; best -ts {best[1]} -c {best[0]}: "
              f"{chosen_ctx / max(best[0], 1):.1%} of it; safe-llama's own start served: {served}")  # fmt: skip
        return 0 if served and chosen_ctx >= 0.95 * best[0] else 1
    finally:
        for w in workers:
            w.stop()
        for w in workers:
            for _ in range(50):
                try:
                    w.group.rmdir()
                    break
                except OSError:
                    time.sleep(0.1)


if __name__ == "__main__":
    raise SystemExit(main())
