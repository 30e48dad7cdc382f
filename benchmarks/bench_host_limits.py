"""safe-llama's plan under a host limit against the truth: for each limit (RLIMIT_AS, a cgroup v1/v2 memory
limit) and model, the context safe-llama chooses, whether `safe-llama server` starts on the first spawn,
the largest -c that really starts (bisection on llama.cpp's 256-cell grid with the plan's own argv and
environment, llama-server until /health), the ratio, and llama.cpp alone (no -c, its defaults) under the
same limit.

    python3 benchmarks/bench_host_limits.py [--kinds as,cgroup] [--models bundled,llama] [--probes N]

Needs root for the cgroup rows (a child of /sys/fs/cgroup[/memory]); every cgroup it makes is removed.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import resource
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from safe_llama.model.bundled import bundled_model_path  # noqa: E402
from safe_llama.paths import pinned_bin_dir  # noqa: E402
from tests.llama_run import free_port, healthy, kv_lines  # noqa: E402
from tests.tiny_gguf import write_tiny_gguf  # noqa: E402

GIB = 1 << 30
MIB = 1 << 20
ASKED = 1 << 20  # far beyond what fits under every limit here
KV_TYPE = re.compile(r"K \((\w+)\)")


@dataclass(frozen=True)
class Limit:
    kind: str  # "as" (RLIMIT_AS) or "cgroup" (memory.max / memory.limit_in_bytes)
    bytes: int

    @property
    def label(self) -> str:
        return f"{self.bytes / GIB:.2f} GiB" if self.bytes >= GIB else f"{self.bytes // MIB} MiB"


@contextmanager
def memory_group(limit: Limit, prefix: str = "safe-llama-bench") -> Iterator[Path]:
    """A fresh memory cgroup with this limit (v2 with the memory controller, else v1), removed after."""
    name = f"{prefix}-{os.getpid()}-{time.monotonic_ns()}"
    v2 = Path("/sys/fs/cgroup/cgroup.controllers")
    if v2.is_file() and "memory" in v2.read_text():
        folder = Path("/sys/fs/cgroup") / name
        folder.mkdir()
        (folder / "memory.max").write_text(str(limit.bytes))
        (folder / "memory.swap.max").write_text("0")
    else:
        folder = Path("/sys/fs/cgroup/memory") / name
        folder.mkdir()
        (folder / "memory.limit_in_bytes").write_text(str(limit.bytes))
    try:
        yield folder
    finally:
        for _ in range(100):
            try:
                folder.rmdir()
                break
            except OSError:
                time.sleep(0.1)


@contextmanager
def confined(limit: Limit) -> Iterator[Callable[[], None]]:
    """A preexec function that puts a child under the limit; a cgroup is made fresh and removed after."""
    if limit.kind == "as":

        def rlimit() -> None:
            resource.setrlimit(resource.RLIMIT_AS, (limit.bytes, limit.bytes))

        yield rlimit
        return
    with memory_group(limit) as folder:

        def enter() -> None:
            (folder / "cgroup.procs").write_text(str(os.getpid()))

        yield enter


def wait_ready(proc: subprocess.Popen[bytes], port: int, timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and proc.poll() is None:
        if healthy(port):
            return True
        time.sleep(0.1)
    return False


def stop(proc: subprocess.Popen[bytes]) -> str:
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(20)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
    assert proc.stdout is not None
    return proc.stdout.read().decode(errors="replace")


@dataclass
class Running:
    proc: subprocess.Popen[bytes]
    port: int
    ready: bool  # /health said 200 within 90 s
    log: str = ""  # its output, once stopped


@contextmanager
def server_under(bin_dir: Path, argv: list[str], env: dict[str, str], limit: Limit) -> Iterator[Running]:
    """llama-server with this argv under the limit, stopped (and its log kept) when the block ends."""
    with confined(limit) as enter:
        port = free_port()
        proc = subprocess.Popen(
            [str(bin_dir / "llama-server"), *argv, "--host", "127.0.0.1", "--port", str(port)],
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            preexec_fn=enter,
        )
        running = Running(proc, port, wait_ready(proc, port, 90))
        try:
            yield running
        finally:
            running.log = stop(proc)


def llama_starts(bin_dir: Path, argv: list[str], env: dict[str, str], limit: Limit) -> tuple[bool, str]:
    """llama-server with this argv under the limit reaches /health 200."""
    with server_under(bin_dir, argv, env, limit) as running:
        pass
    return running.ready, running.log


def plan_and_launch(model: Path, limit: Limit, env: dict[str, str]) -> tuple[dict[str, object], bool, str]:
    """The plan's JSON, and whether `safe-llama server` became ready with no failed attempt (both run under the
    limit: in the cgroup the supervisor's own memory is charged there too)."""
    args = ["-m", str(model), "-c", str(ASKED)]
    with confined(limit) as enter:
        out = subprocess.run(
            [sys.executable, "-m", "safe_llama", "plan", "--json", "server", *args],
            env=env,
            capture_output=True,
            text=True,
            preexec_fn=enter,
            timeout=120,
            check=True,
        )
    plan: dict[str, object] = json.loads(out.stdout)
    with confined(limit) as enter:
        port = free_port()
        proc = subprocess.Popen(
            [sys.executable, "-m", "safe_llama", "server", *args, "--port", str(port)],
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            preexec_fn=enter,
        )
        ready = wait_ready(proc, port, 120)
        log = stop(proc)
    return plan, ready and "attempt 1 failed" not in log, log


def largest_that_starts(
    bin_dir: Path, argv: list[str], env: dict[str, str], limit: Limit, known_good: int, probes: int
) -> tuple[int, int]:
    """(largest -c that starts, probes used): bracket from the plan's context, then bisect."""

    def starts(ctx: int) -> bool:
        trial = list(argv)
        trial[trial.index("-c") + 1] = str(ctx)
        return llama_starts(bin_dir, trial, env, limit)[0]

    lo = max(known_good // 256, 1)
    used = 1
    while not starts(lo * 256) and lo > 1 and used < probes:  # the plan itself did not start
        used += 1
        lo = lo * 4 // 5
    hi = lo * 5 // 4 + 1
    while used < probes and starts(hi * 256):
        used += 1
        lo, hi = hi, hi * 5 // 4 + 1
    used += 1
    while lo + 1 < hi and used < probes + 6:
        mid = (lo + hi) // 2
        used += 1
        if starts(mid * 256):
            lo = mid
        else:
            hi = mid
    return lo * 256, used


def alone(bin_dir: Path, model: Path, env: dict[str, str], limit: Limit) -> str:
    """llama.cpp with only the model (its own --fit, which assumes host RAM is unlimited) under the limit."""
    ready, log = llama_starts(bin_dir, ["-m", str(model), "-lv", "4"], env, limit)
    cells = kv_lines(log)
    if ready:
        return f"starts ({cells[0].cells} cells)" if cells else "starts"
    if "failed to allocate" in log or "insufficient memory" in log:
        return "fails (allocation)"
    return "fails (killed)" if "llama_kv_cache" in log else "fails"


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--kinds", default="as,cgroup")
    parser.add_argument("--models", default="bundled,llama")
    parser.add_argument("--as-gib", default="1.0,1.5,2.5")
    parser.add_argument("--cgroup-mib", default="600,1024")
    parser.add_argument("--probes", type=int, default=10)
    opts = parser.parse_args()
    bin_dir = pinned_bin_dir("cpu", os.environ)
    work = Path(tempfile.mkdtemp())
    models = {
        "bundled": bundled_model_path(os.environ),
        "llama": write_tiny_gguf(
            work / "llama.gguf",
            arch="llama",
            n_layer=4,
            n_head=8,
            n_head_kv=4,
            head_dim=64,
            n_ff=1024,
            n_ctx_train=1 << 20,
            name="small-llama",
        ),
    }
    env = {k: v for k, v in os.environ.items() if not k.startswith(("LLAMA_ARG_", "SAFE_LLAMA_"))}
    env |= {"SAFE_LLAMA_BIN_DIR": str(bin_dir), "XDG_CACHE_HOME": str(work), "PYTHONPATH": str(ROOT)}
    limits = []
    if "as" in opts.kinds.split(","):
        limits += [Limit("as", int(float(g) * GIB)) for g in opts.as_gib.split(",")]
    if "cgroup" in opts.kinds.split(","):
        limits += [Limit("cgroup", int(m) * MIB) for m in opts.cgroup_mib.split(",")]
    print("| limit | model | chosen -c (KV) | largest that starts | ratio | first start | probes | llama.cpp alone |")
    print("|---|---|---|---|---|---|---|---|")
    for limit in limits:
        for key in opts.models.split(","):
            model = models[key]
            plan, first, log = plan_and_launch(model, limit, env)
            decision = plan["decision"]
            assert isinstance(decision, dict)
            argv = [str(a) for a in decision["argv"]]
            run_env = env | {str(k): str(v) for k, v in decision["env"].items()}
            chosen = int(argv[argv.index("-c") + 1])
            kv_type = argv[argv.index("--cache-type-k") + 1] if "--cache-type-k" in argv else "f16"
            largest, used = largest_that_starts(bin_dir, argv, run_env, limit, chosen, opts.probes)
            if not first:
                print(log[-3000:], file=sys.stderr)
            print(
                f"| {limit.kind} {limit.label} | {key} | {chosen} ({kv_type}) | {largest} | "
                f"{chosen / max(largest, 1):.1%} | {'yes' if first else 'NO'} | {used} | "
                f"{alone(bin_dir, model, env, limit)} |",
                flush=True,
            )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
