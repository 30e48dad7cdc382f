"""Under a cgroup memory limit, the context that starts is not the context that runs: what a llama-server
keeps charged right after /health (weights' page cache aside: the KV, written at start, and a little
more) is less than what it needs once a request fills the context (the compute buffer's attention mask
and activations are touched only then). This benchmark measures both truths next to safe-llama's choice:

    python3 benchmarks/bench_cgroup_fill.py [--rows llama:200,bundled:250,wide:256] [--probes N]

For each row (model:limit in MiB): safe-llama's plan under the limit and whether `safe-llama server` starts on
the first spawn; the largest -c that reaches /health with the plan's argv (bisection, as bench_host_limits);
and the largest -c that then answers one request whose prompt fills the context (token ids, n_predict 2)
without being OOM-killed, with the plan's argv and safe-llama's supervisor in the group (`safe-llama
--no-predict server ARGV` runs the argv as given; --bare: llama-server alone), bisected between the plan's
context and the largest that starts (below the plan's when it does not serve), each probe a full prompt:
minutes on a 2-core machine. Needs root (a child of the cgroup v1 memory tree, or v2 with
the memory controller); every cgroup it makes is removed.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from benchmarks.bench_host_limits import (  # noqa: E402
    MIB,
    Limit,
    Running,
    confined,
    largest_that_starts,
    plan_and_launch,
    server_under,
    stop,
    wait_ready,
)
from safe_llama.model.bundled import bundled_model_path  # noqa: E402
from safe_llama.paths import pinned_bin_dir  # noqa: E402
from tests.llama_run import free_port  # noqa: E402
from tests.tiny_gguf import write_tiny_gguf, write_wide_kv_gguf  # noqa: E402


@contextmanager
def supervised_under(argv: list[str], env: dict[str, str], limit: Limit) -> Iterator[Running]:
    """`safe-llama --no-predict server ARGV` under the limit: llama-server with exactly this argv, and safe-llama's
    supervisor beside it in the group, as in a unit or a container."""
    with confined(limit) as enter:
        port = free_port()
        proc = subprocess.Popen(
            [sys.executable, "-m", "safe_llama", "--no-predict", "server", *argv, "--port", str(port)],
            env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, preexec_fn=enter,
        )  # fmt: skip
        running = Running(proc, port, wait_ready(proc, port, 90))
        try:
            yield running
        finally:
            running.log = stop(proc)


SUPERVISED = True  # main() sets it from --bare


def serves_full_context(bin_dir: Path, argv: list[str], env: dict[str, str], limit: Limit, ctx: int) -> bool:
    """llama-server at -c ctx under the limit (with safe-llama's supervisor in the group unless --bare) starts and
    answers a prompt of ctx - 16 tokens."""
    trial = list(argv)
    trial[trial.index("-c") + 1] = str(ctx)
    runner = supervised_under(trial, env, limit) if SUPERVISED else server_under(bin_dir, trial, env, limit)
    with runner as running:
        if not running.ready:
            return False
        # token ids past the byte tokens of either model's vocabulary: one cell each
        prompt = [300 + i % 25 for i in range(ctx - 16)]
        body = json.dumps({"prompt": prompt, "n_predict": 2, "cache_prompt": False}).encode()
        url = f"http://127.0.0.1:{running.port}/completion"
        request = urllib.request.Request(url, body, {"Content-Type": "application/json"})
        try:
            with urllib.request.urlopen(request, timeout=1800) as answer:  # noqa: S310 (loopback http)
                return bool(answer.status == 200 and running.proc.poll() is None)
        except OSError:
            return False


def largest_that_serves(
    bin_dir: Path, argv: list[str], env: dict[str, str], limit: Limit, lo: int, hi: int, probes: int
) -> tuple[int, int, bool]:
    """(largest -c known to serve, probes used, whether lo itself served), bisecting [lo, hi) on 256 cells."""
    used = 1
    if not serves_full_context(bin_dir, argv, env, limit, lo):
        # the chosen context itself does not serve: bisect below it, from a quarter of it
        hi, lo = lo, lo // 4 // 256 * 256
        used += 1
        if not serves_full_context(bin_dir, argv, env, limit, lo):
            return 0, used, False
        a, b = lo // 256, hi // 256
        while a + 1 < b and used < probes + 4:
            mid = (a + b) // 2
            used += 1
            if serves_full_context(bin_dir, argv, env, limit, mid * 256):
                a = mid
            else:
                b = mid
        return a * 256, used, False
    a, b = lo // 256, hi // 256
    while a + 1 < b and used < probes:
        mid = (a + b) // 2
        used += 1
        if serves_full_context(bin_dir, argv, env, limit, mid * 256):
            a = mid
        else:
            b = mid
    return a * 256, used, True


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rows", default="llama:200,bundled:250")
    parser.add_argument("--probes", type=int, default=4, help="full-context probes per row")
    parser.add_argument("--bare", action="store_true", help="probe llama-server alone (no supervisor in the group)")
    opts = parser.parse_args()
    global SUPERVISED
    SUPERVISED = not opts.bare
    bin_dir = pinned_bin_dir("cpu", os.environ)
    work = Path(tempfile.mkdtemp())
    models = {  # made when a row names them (the bundled model needs its package only then)
        "bundled": lambda: bundled_model_path(os.environ),
        "llama": lambda: write_tiny_gguf(work / "llama.gguf", arch="llama", n_layer=4, n_head=8, n_head_kv=4,
                                         head_dim=64, n_ff=1024, n_ctx_train=1 << 20, name="small-llama"),
        # 16 KiB of f16 KV per cell on tiny weights: the context is nearly all of the charge
        "wide": lambda: write_wide_kv_gguf(work),
    }  # fmt: skip
    env = {k: v for k, v in os.environ.items() if not k.startswith(("LLAMA_ARG_", "SAFE_LLAMA_"))}
    env |= {"SAFE_LLAMA_BIN_DIR": str(bin_dir), "XDG_CACHE_HOME": str(work), "PYTHONPATH": str(ROOT)}
    print("| limit | model | chosen -c | first start | largest that starts | largest that serves a full context "
          "| chosen / starts | chosen / serves |")  # fmt: skip
    print("|---|---|---|---|---|---|---|---|")
    for row in opts.rows.split(","):
        key, mib = row.split(":")
        limit = Limit("cgroup", int(mib) * MIB)
        plan, first, _ = plan_and_launch(models[key](), limit, env)
        decision = plan["decision"]
        assert isinstance(decision, dict)
        argv = [str(a) for a in decision["argv"]]
        run_env = env | {str(k): str(v) for k, v in decision["env"].items()}
        chosen = int(argv[argv.index("-c") + 1])
        starts, _ = largest_that_starts(bin_dir, argv, run_env, limit, chosen, 8)
        serves, _, chosen_served = largest_that_serves(bin_dir, argv, run_env, limit, chosen, starts + 256, opts.probes)
        where = f"[{chosen}, {starts}]" if chosen_served else f"[{chosen // 4 // 256 * 256}, {chosen}]"
        serve_cell = f"{serves} (bisected in {where})"
        ratio_serves = f"{chosen / serves:.3f}" if serves else "-"
        print(f"| {limit.label} | {key} | {chosen} | {'yes' if first else 'NO'} | {starts} | {serve_cell} "
              f"| {chosen / starts:.3f} | {ratio_serves} |", flush=True)  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
