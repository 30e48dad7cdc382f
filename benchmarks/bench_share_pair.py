"""Two services in one memory cgroup (issue 35): two `safe-llama server -m M` (no -c) started at the same moment
inside one group, then one request each that fills its context, sent at the same time; against the largest
pair of bare llama-server (equal contexts, the plan's other options) that does the same.

    python3 benchmarks/bench_share_pair.py [--limit-mib 512] [--json OUT.json]

M is the wide-KV model (2 layers, 4 KV heads of 512: 16 KiB of f16 KV per cell, tiny weights: the context is
nearly all of the charge). Prints one table row and, with --json, every figure. Needs root (a child of the
cgroup v1 memory tree, or v2 with the memory controller); the group is removed after. Minutes on 2 cores."""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, ExitStack, contextmanager
from pathlib import Path
from typing import IO

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from benchmarks.bench_host_limits import MIB, Limit, memory_group, wait_ready  # noqa: E402
from safe_llama.paths import pinned_bin_dir  # noqa: E402
from tests.llama_run import free_port, stop_process  # noqa: E402
from tests.tiny_gguf import write_wide_kv_gguf  # noqa: E402


def wide_model(folder: Path) -> Path:
    return write_wide_kv_gguf(folder)


def group(limit: Limit) -> AbstractContextManager[Path]:
    """A fresh memory cgroup with this limit, removed after."""
    return memory_group(limit, "safe-llama-pair")


def oom_kills(folder: Path) -> int:
    for name, key in (("memory.oom_control", "oom_kill"), ("memory.events", "oom_kill")):
        try:
            text = (folder / name).read_text()
        except OSError:
            continue
        found = re.search(rf"^{key} (\d+)", text, re.M)
        if found:
            return int(found.group(1))
    return 0


def fill(port: int, ctx: int, results: dict[int, bool]) -> None:
    """One request whose prompt fills the context (token ids past the byte tokens: one cell each)."""
    prompt = [300 + i % 25 for i in range(ctx - 16)]
    body = json.dumps({"prompt": prompt, "n_predict": 2, "cache_prompt": False}).encode()
    request = urllib.request.Request(f"http://127.0.0.1:{port}/completion", body, {"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=1800) as answer:  # noqa: S310 (loopback http)
            results[port] = answer.status == 200
    except OSError:
        results[port] = False


@contextmanager
def pair(
    commands: list[list[str]], env_of: Callable[[int], dict[str, str]], limit: Limit
) -> Iterator[dict[str, object]]:
    """The commands started at the same moment in one fresh group; yields what was seen once both answered or
    one failed: ready, the ports, the group."""
    with group(limit) as folder, ExitStack() as files:
        ports = [free_port() for _ in commands]
        # logs to files, not pipes: a pipe nobody reads while the requests run fills, and the server stops on it
        logs = [files.enter_context(tempfile.TemporaryFile()) for _ in commands]

        def enter() -> None:
            (folder / "cgroup.procs").write_text(str(os.getpid()))

        procs = [
            subprocess.Popen([*command, "--port", str(port)], env=env_of(i), stdout=logs[i],
                             stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, preexec_fn=enter)
            for i, (command, port) in enumerate(zip(commands, ports, strict=True))
        ]  # fmt: skip
        seen: dict[str, object] = {"ports": ports, "group": folder, "procs": procs}
        try:
            seen["ready"] = [wait_ready(proc, port, 180) for proc, port in zip(procs, ports, strict=True)]
            yield seen
        finally:
            seen["logs"] = [_stop(proc, log) for proc, log in zip(procs, logs, strict=True)]


def _stop(proc: subprocess.Popen[bytes], log: IO[bytes]) -> str:
    stop_process(proc, 30)
    log.seek(0)
    return log.read().decode(errors="replace")


def serve_together(seen: dict[str, object], contexts: list[int]) -> bool:
    """Both fill their context at the same time: both answer, both still run, no OOM kill in the group."""
    ports = seen["ports"]
    assert isinstance(ports, list)
    group = seen["group"]
    assert isinstance(group, Path)
    before = oom_kills(group)
    results: dict[int, bool] = {}
    threads = [
        threading.Thread(target=fill, args=(port, ctx, results)) for port, ctx in zip(ports, contexts, strict=True)
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    procs = seen["procs"]
    assert isinstance(procs, list)
    alive = all(proc.poll() is None for proc in procs)
    return all(results.get(port, False) for port in ports) and alive and oom_kills(group) == before


def safe_llama_pair(model: Path, limit: Limit, env: dict[str, str], work: Path) -> dict[str, object]:
    """Two `safe-llama server -m M` at the same moment in one group: their contexts, first spawns, the fill."""
    runtime = work / "run"
    runtime.mkdir(mode=0o700)

    def env_of(i: int) -> dict[str, str]:
        return env | {"XDG_RUNTIME_DIR": str(runtime), "XDG_CACHE_HOME": str(work / f"cache{i}")}

    command = [sys.executable, "-m", "safe_llama", "server", "-m", str(model)]
    began = time.monotonic()
    with pair([command, command], env_of, limit) as seen:
        ready = seen["ready"]
        assert isinstance(ready, list)
        ready_s = time.monotonic() - began
        contexts = [_ctx_of(seen, i) if up else 0 for i, up in enumerate(ready)]
        served = all(ready) and serve_together(seen, contexts)
    logs = seen["logs"]
    assert isinstance(logs, list)
    return {
        "contexts": contexts,
        "ready": ready,
        "ready_s": round(ready_s, 2),
        "first_spawn": ["attempt 1 failed" not in log for log in logs],
        "served_together": served,
        "argv": _argv(logs[0]),
        "lines": [[line for line in log.splitlines() if line.startswith("safe-llama:")] for log in logs],
    }


def _ctx_of(seen: dict[str, object], i: int) -> int:
    """The context a running safe-llama's llama-server was given: its /props."""
    ports = seen["ports"]
    assert isinstance(ports, list)
    with urllib.request.urlopen(f"http://127.0.0.1:{ports[i]}/props", timeout=30) as answer:
        props = json.loads(answer.read())
    return int(props["default_generation_settings"]["n_ctx"])


def _argv(log: str) -> list[str]:
    """The plan's other options (-fit off, --cache-ram N), from safe-llama's own lines."""
    argv: list[str] = []
    for line in log.splitlines():
        if "-fit off" in line and ["-fit", "off"] not in [argv[i : i + 2] for i in range(len(argv))]:
            argv += ["-fit", "off"]
        found = re.search(r"--cache-ram (\d+)", line)
        if found and "-cram" not in argv:
            argv += ["-cram", found.group(1)]
    return argv


def bare_pair_serves(bin_dir: Path, model: Path, argv: list[str], ctx: int, limit: Limit, env: dict[str, str]) -> bool:
    command = [str(bin_dir / "llama-server"), "-m", str(model), *argv, "-c", str(ctx), "--host", "127.0.0.1"]
    with pair([command, command], lambda _: env, limit) as seen:
        ready = seen["ready"]
        assert isinstance(ready, list)
        return all(ready) and serve_together(seen, [ctx, ctx])


def largest_bare_pair(
    bin_dir: Path, model: Path, argv: list[str], limit: Limit, env: dict[str, str], lo: int, hi: int
) -> tuple[int, list[dict[str, object]]]:
    """The largest equal context (256-cell steps) at which two bare llama-server fill theirs together, bisected
    in [lo, hi): lo must serve (else the bracket moves down by a quarter), hi is taken as failing unless it serves."""
    probes: list[dict[str, object]] = []

    def serves(ctx: int) -> bool:
        ok = bare_pair_serves(bin_dir, model, argv, ctx, limit, env)
        probes.append({"ctx": ctx, "ok": ok})
        print(f"  bare pair -c {ctx}: {'serves' if ok else 'fails'}", file=sys.stderr, flush=True)
        return ok

    while lo > 256 and not serves(lo):
        hi, lo = lo, lo * 3 // 4 // 256 * 256
    if serves(hi):
        return hi, probes  # the bracket's top serves too: the caller reads the ratio as a lower bound
    a, b = lo // 256, hi // 256
    while a + 1 < b:
        mid = (a + b) // 2
        if serves(mid * 256):
            a = mid
        else:
            b = mid
    return a * 256, probes


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--limit-mib", type=int, default=512)
    parser.add_argument("--json", help="write every figure here")
    opts = parser.parse_args()
    bin_dir = pinned_bin_dir("cpu", os.environ)
    work = Path(tempfile.mkdtemp())
    model = wide_model(work)
    limit = Limit("cgroup", opts.limit_mib * MIB)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("LLAMA_ARG_", "SAFE_LLAMA_"))}
    env |= {"SAFE_LLAMA_BIN_DIR": str(bin_dir), "PYTHONPATH": str(ROOT)}
    ours = safe_llama_pair(model, limit, env, work)
    contexts = ours["contexts"]
    assert isinstance(contexts, list)
    print(f"safe-llama pair: {json.dumps({k: v for k, v in ours.items() if k != 'lines'})}", file=sys.stderr)
    argv = ours["argv"]
    assert isinstance(argv, list)
    mean = max(sum(contexts) // 2 // 256 * 256, 256)
    largest, probes = largest_bare_pair(bin_dir, model, argv, limit, env | {"XDG_CACHE_HOME": str(work)},
                                        mean * 19 // 20 // 256 * 256, mean * 23 // 20 // 256 * 256)  # fmt: skip
    combined = sum(contexts)
    ratio = combined / (2 * largest) if largest else 0.0
    result = {"limit_mib": opts.limit_mib, "safe_llama": ours, "bare_pair_largest": largest, "bare_probes": probes,
              "combined": combined, "ratio": round(ratio, 4)}  # fmt: skip
    print("| group | safe-llama -c (A + B) | first spawns | both served, no OOM kill | largest bare pair | ratio |")
    print("|---|---|---|---|---|---|")
    print(f"| {opts.limit_mib} MiB | {contexts[0]} + {contexts[1]} = {combined} | {ours['first_spawn']} "
          f"| {ours['served_together']} | 2 x {largest} = {2 * largest} | {ratio:.3f} |")  # fmt: skip
    if opts.json:
        Path(opts.json).write_text(json.dumps(result, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
