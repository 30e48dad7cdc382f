"""A soak under a memory cgroup: many requests of distinct long prompts over several slots, to a server that
runs in a memory group with its supervisor, as under systemd's MemoryMax= or a container's limit. What grows
while a server serves (llama-server's prompt cache, 8192 MiB by default; its context checkpoints) is what
this exercises: every new task saves the idle slots' prompts to the cache.

    python3 benchmarks/bench_soak.py [--limit-mib 256] [--requests 200] [--slots 4] [--model wide|bundled]

Side by side, one after the other, each in a fresh group of the same limit:
- `safe-llama server -np SLOTS` (the supervisor in the group): its plan, READY, then the requests;
- bare llama-server with safe-llama's context but llama.cpp's own defaults for the rest (no --cache-ram,
  no --ctx-checkpoints): the same requests.
For each: requests answered, the first failure, whether and when the group's OOM killer fired (cgroup v2
memory.events oom_kill, v1 memory.oom_control oom_kill), the peak charge (v2 memory.peak, v1
memory.max_usage_in_bytes) against the limit less the plan's margin. Loopback only; every wait is bounded;
needs root (a child of the cgroup v1 memory tree, or v2 with the memory controller); every group it makes
is removed.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from safe_llama.model.bundled import bundled_model_path  # noqa: E402
from safe_llama.paths import pinned_bin_dir  # noqa: E402
from tests.llama_run import free_port, healthy, stop_process  # noqa: E402
from tests.tiny_gguf import write_wide_kv_gguf  # noqa: E402

MIB = 1 << 20
MARGIN = 0.02  # configs/planner.toml memory_margin_fraction (cpu: default)


@dataclass
class Group:
    """A memory cgroup made for one run: v2 (memory.max) or v1 (memory.limit_in_bytes)."""

    folder: Path
    v2: bool

    def enter(self) -> None:
        (self.folder / "cgroup.procs").write_text(str(os.getpid()))

    def _read(self, name: str) -> str:
        try:
            return (self.folder / name).read_text()
        except OSError:
            return ""

    def peak(self) -> int:
        text = self._read("memory.peak" if self.v2 else "memory.max_usage_in_bytes").strip()
        return int(text) if text.isdigit() else 0

    def oom_kills(self) -> int:
        for line in self._read("memory.events" if self.v2 else "memory.oom_control").splitlines():
            name, _, value = line.partition(" ")
            if name == "oom_kill" and value.strip().isdigit():
                return int(value)
        return 0


@contextmanager
def memory_group(limit: int) -> Iterator[Group]:
    name = f"safe-llama-soak-{os.getpid()}-{time.monotonic_ns()}"
    controllers = Path("/sys/fs/cgroup/cgroup.controllers")
    if controllers.is_file() and "memory" in controllers.read_text():
        group = Group(Path("/sys/fs/cgroup") / name, True)
        group.folder.mkdir()
        (group.folder / "memory.max").write_text(str(limit))
        (group.folder / "memory.swap.max").write_text("0")
    else:
        group = Group(Path("/sys/fs/cgroup/memory") / name, False)
        group.folder.mkdir()
        (group.folder / "memory.limit_in_bytes").write_text(str(limit))
    try:
        yield group
    finally:
        for _ in range(100):
            try:
                group.folder.rmdir()
                break
            except OSError:
                time.sleep(0.1)


@dataclass
class Soak:
    answered: int = 0
    failed: int = 0
    first_failure: str = ""
    oom_kill_after_s: float | None = None
    elapsed_s: float = 0.0
    peak: int = 0
    oom_kills: int = 0
    log_tail: list[str] = field(default_factory=list)


def prompts(count: int, n_ctx_seq: int, seed: int) -> list[list[int]]:
    """Distinct prompts (token ids past the byte tokens: one cell each) between a quarter and a half of a
    slot's share of the context: long, and together more than the context holds."""
    rng = random.Random(seed)
    out = []
    for _ in range(count):
        length = rng.randint(max(n_ctx_seq // 4, 16), max(n_ctx_seq // 2 - 16, 32))
        out.append([rng.randrange(300, 325) for _ in range(length)])
    return out


def soak(port: int, proc: subprocess.Popen[bytes], group: Group, work: list[list[int]], slots: int) -> Soak:
    """Send the prompts over `slots` client threads (one request in flight per slot), bounded in time."""
    result = Soak()
    lock = threading.Lock()
    queue = list(enumerate(work))
    started = time.monotonic()
    deadline = started + 3600

    def client() -> None:
        while time.monotonic() < deadline:
            with lock:
                if not queue or proc.poll() is not None:
                    return
                index, prompt = queue.pop(0)
            body = json.dumps({"prompt": prompt, "n_predict": 4, "cache_prompt": True, "seed": index}).encode()
            request = urllib.request.Request(
                f"http://127.0.0.1:{port}/completion", body, {"Content-Type": "application/json"}
            )
            try:
                with urllib.request.urlopen(request, timeout=600) as answer:  # noqa: S310 (loopback http)
                    ok = answer.status == 200
                    why = f"HTTP {answer.status}"
            except OSError as err:
                ok, why = False, f"{type(err).__name__}: {err}"
            with lock:
                if ok:
                    result.answered += 1
                else:
                    result.failed += 1
                    result.first_failure = result.first_failure or f"request {index}: {why}"
                if group.oom_kills() and result.oom_kill_after_s is None:
                    result.oom_kill_after_s = time.monotonic() - started

    threads = [threading.Thread(target=client, daemon=True) for _ in range(slots)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(max(deadline - time.monotonic(), 1))
    result.elapsed_s = time.monotonic() - started
    result.peak = group.peak()
    result.oom_kills = group.oom_kills()
    return result


def wait_ready(proc: subprocess.Popen[bytes], port: int, timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and proc.poll() is None:
        if healthy(port):
            return True
        time.sleep(0.2)
    return False


def stop(proc: subprocess.Popen[bytes]) -> list[str]:
    stop_process(proc, 30)
    assert proc.stdout is not None
    return proc.stdout.read().decode(errors="replace").splitlines()


def run_one(label: str, argv: list[str], env: dict[str, str], limit: int, work_of: object, slots: int) -> Soak:
    with memory_group(limit) as group:
        port = free_port()
        proc = subprocess.Popen(
            [*argv, "--host", "127.0.0.1", "--port", str(port)],
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            preexec_fn=group.enter,
        )
        out = Soak()
        try:
            if not wait_ready(proc, port, 300):
                out.first_failure = "never ready" + (" (OOM kill)" if group.oom_kills() else "")
                out.oom_kills = group.oom_kills()
            else:
                assert callable(work_of)
                out = soak(port, proc, group, work_of(port), slots)
        finally:
            lines = stop(proc)
        out.log_tail = [line for line in lines if line.startswith("safe-llama")][-6:]
        print(f"{label}: done", file=sys.stderr, flush=True)
        return out


def n_ctx_seq_of(port: int) -> int:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/props", timeout=30) as answer:
        return int(json.load(answer)["default_generation_settings"]["n_ctx"])


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--limit-mib", type=int, default=256)
    parser.add_argument("--requests", type=int, default=200)
    parser.add_argument("--slots", type=int, default=4)
    parser.add_argument("--model", default="wide", choices=("wide", "bundled"))
    parser.add_argument("--only", choices=("safe-llama", "bare"), default=None)
    opts = parser.parse_args()
    limit = opts.limit_mib * MIB
    bin_dir = pinned_bin_dir("cpu", os.environ)
    work_dir = Path(tempfile.mkdtemp())
    model = bundled_model_path(os.environ) if opts.model == "bundled" else write_wide_kv_gguf(work_dir)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("LLAMA_ARG_", "SAFE_LLAMA_"))}
    env |= {"SAFE_LLAMA_BIN_DIR": str(bin_dir), "XDG_CACHE_HOME": str(work_dir), "PYTHONPATH": str(ROOT)}
    cache: dict[str, list[list[int]]] = {}

    def work_of(port: int) -> list[list[int]]:
        if "work" not in cache:
            cache["work"] = prompts(opts.requests, n_ctx_seq_of(port) // opts.slots, seed=25)
        return cache["work"]

    rows = []
    safe_argv = [sys.executable, "-m", "safe_llama", "server", "-m", str(model), "-np", str(opts.slots)]
    chosen_ctx = None
    if opts.only in (None, "safe-llama"):
        result = run_one("safe-llama", safe_argv, env, limit, work_of, opts.slots)
        rows.append(("safe-llama server", result))
        for line in result.log_tail:
            if " -c " in line or "--ctx-size" in line:
                print(line)
        chosen_ctx = _ctx_from(result.log_tail)
    if opts.only in (None, "bare"):
        bare = [str(bin_dir / "llama-server"), "-m", str(model), "-np", str(opts.slots)]
        if chosen_ctx is not None:
            bare += ["-c", str(chosen_ctx)]
        rows.append((f"bare llama-server{' -c ' + str(chosen_ctx) if chosen_ctx else ''}", run_one(
            "bare", bare, env, limit, work_of, opts.slots)))  # fmt: skip
    print(f"\nlimit {opts.limit_mib} MiB, less the plan's {MARGIN:.0%} margin: {limit * (1 - MARGIN) / MIB:.1f} MiB; "
          f"{opts.requests} distinct prompts over {opts.slots} slots")  # fmt: skip
    print("| server | answered | failed | OOM kills | first OOM kill after | peak charge | under limit less margin "
          "| time | first failure |")  # fmt: skip
    print("|---|---|---|---|---|---|---|---|---|")
    for label, r in rows:
        when = f"{r.oom_kill_after_s:.1f} s" if r.oom_kill_after_s is not None else "-"
        under = "yes" if r.peak <= limit * (1 - MARGIN) else "NO"
        print(f"| {label} | {r.answered} | {r.failed} | {r.oom_kills} | {when} | {r.peak / MIB:.1f} MiB | {under} "
              f"| {r.elapsed_s:.0f} s | {r.first_failure or '-'} |")  # fmt: skip
    for label, r in rows:
        for line in r.log_tail:
            print(f"{label}> {line}")
    return 0


def _ctx_from(lines: list[str]) -> int | None:
    """The -c safe-llama chose, from its own line ("... : -c N, the largest that fits")."""
    for line in lines:
        if ": -c " in line:
            number = line.rsplit(": -c ", 1)[1].split(",")[0].split()[0]
            if number.isdigit():
                return int(number)
    return None


if __name__ == "__main__":
    sys.exit(main())
