"""Issue 36's closing table on a real device: for each server layout, safe-llama's first spawn of
`server -m M -c 2000000 -ngl 99 SHAPE` (did it start at once, its -c, the compute buffers llama.cpp logged against
the plan's), then how close that -c is to the largest that starts with the same final argv and environment: bare
llama-server at (1 + --up) x the chosen -c and, with the starts left, bisected in that narrow bracket.

    python3 benchmarks/bench_layouts_first_start.py --bin-dir DIR --model M.gguf --backend cuda|vulkan \
        --out rows.json --logs DIR [--shape "np16|-np 16" ...] [--starts 2] [--deadline 90]

No --shape: the shapes of the issue's "Done when". Each shape starts from fresh XDG_CACHE_HOME, XDG_STATE_HOME
and XDG_RUNTIME_DIR (nothing remembered: a first spawn). The final argv and environment are read from the
running llama-server child (/proc). Rows are written after every shape (tests/plan/test_layouts_h200_replay.py
replays them once they are fixtures: first-start-layouts-<backend>.json). Every process is stopped; every wait
is bounded; no new shape starts after --deadline seconds.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
from benchmarks.bench_first_start import _FAILED, _healthy, _port, _with_ctx, start, stop_group  # noqa: E402

SHAPES = {  # the failures first: a deadline cuts the tail
    "np16": "-np 16",
    "np8-nokvu": "-np 8 -no-kvu",
    "fa-off": "-fa off",
    "default": "",
    "q4": "-ctk q4_0 -ctv q4_0",
    "ub4096": "-ub 4096 -b 4096",
    **{f"np{n}": f"-np {n}" for n in (1, 4, 8, 32, 64)},
    **{f"np{n}-nokvu": f"-np {n} -no-kvu" for n in (1, 4, 16, 32, 64)},
}
_N_CTX = re.compile(r"llama_context: n_ctx += (\d+)")
_COMPUTE = re.compile(r"sched_reserve: +(\S+) compute buffer size = +([\d.]+) MiB")


def _children(pid: int) -> list[int]:
    """Every descendant of pid (from /proc/*/stat's parent field)."""
    parents: dict[int, int] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                stat = (entry / "stat").read_text()
            except OSError:
                continue
            parents[int(entry.name)] = int(stat[stat.rindex(")") + 2 :].split()[1])
    out, todo = [], [pid]
    while todo:
        here = todo.pop()
        kids = [child for child, parent in parents.items() if parent == here]
        out += kids
        todo += kids
    return out


def _llama_child(pid: int) -> tuple[list[str], dict[str, str]] | None:
    """The argv (without the program, --host and --port) and environment of pid's llama-server descendant."""
    for child in _children(pid):
        try:
            argv = (Path("/proc") / str(child) / "cmdline").read_bytes().decode().split("\0")[:-1]
            environ = (Path("/proc") / str(child) / "environ").read_bytes().decode(errors="replace").split("\0")
        except OSError:
            continue
        if argv and Path(argv[0]).name == "llama-server":
            args, i = [], 1
            while i < len(argv):
                if argv[i] in ("--host", "--port"):
                    i += 2
                    continue
                args.append(argv[i])
                i += 1
            return args, dict(e.split("=", 1) for e in environ if "=" in e)
    return None


def first_spawn(ns: argparse.Namespace, shape: str, env: dict[str, str]) -> dict[str, object]:
    """safe-llama server until /health 200 (or exit), its child's final argv/env read while it is up."""
    port = _port()
    argv = [sys.executable, "-m", "safe_llama", "server", "-m", ns.model, "-c", "2000000", "-ngl", "99",
            *shape.split(), "-lv", "4", "--host", "127.0.0.1", "--port", str(port)]  # fmt: skip
    began = time.monotonic()
    with tempfile.TemporaryFile() as logf:
        proc = subprocess.Popen(argv, env=env, stdin=subprocess.DEVNULL, stdout=logf, stderr=subprocess.STDOUT,
                                start_new_session=True)  # fmt: skip
        ready, child = False, None
        while time.monotonic() < began + ns.timeout and proc.poll() is None:
            if _healthy(port):
                ready, child = True, _llama_child(proc.pid)
                break
            time.sleep(0.2)
        took = time.monotonic() - began
        stop_group(proc)
        logf.seek(0)
        log = logf.read().decode(errors="replace")
    chosen = [int(m) for m in _N_CTX.findall(log)]
    return {
        "ready": ready, "exit": None if ready else proc.returncode, "seconds": round(took, 2),
        "attempts": 1 + len(_FAILED.findall(log)), "n_ctx": chosen[-1] if chosen else None,
        "compute_mib": {dev: float(mib) for dev, mib in _COMPUTE.findall(log)},
        "lines": [x for x in log.splitlines() if x.startswith("safe-llama")],
        "argv": child[0] if child else None,
        "env": {k: v for k, v in (child[1] if child else {}).items() if k.startswith(("GGML_", "LLAMA_", "CUDA_"))},
        "log": log,
    }  # fmt: skip


# Vulkan's largest tensor an op takes (maxStorageBufferRange): NVIDIA's driver on the H200 (nvidia-h200-vulkan's
# probe-vulkan.txt); above it ggml runs the op on the CPU (plan.compute.attention_on_host)
VULKAN_MAX_TENSOR = 4_294_967_295


def planned_compute(model: str, backend: str, argv: list[str]) -> dict[str, float]:
    """The plan's compute per place (MiB) for the final argv, as plan.memory places it on one device."""
    from safe_llama.cmdline.llama_args import parse
    from safe_llama.cmdline.memory_flags import LlamaSettings, gpu_layers
    from safe_llama.cmdline.request import to_request
    from safe_llama.device.limits import Sourced
    from safe_llama.model.header_facts import load_model_facts
    from safe_llama.paths import packaged_configs
    from safe_llama.plan.memory import memory_by_place
    from safe_llama.plan.policy import load_policy
    from safe_llama.plan.target import Target

    policy = load_policy(packaged_configs() / "planner.toml")
    device = {"cuda": "CUDA0", "vulkan": "Vulkan0", "cpu": "CPU"}[backend]
    copies = backend in policy.kv_f16_copy_backends
    largest = Sourced(VULKAN_MAX_TENSOR, "declared", "H200") if backend == "vulkan" else None
    target = Target(backend=backend, device=device, on_gpu=backend != "cpu", kv_f16_copies=copies,
                    compute_costs=policy.compute, device_memory=Sourced(1 << 40, "declared", "bench"),
                    host_budget=Sourced(1 << 40, "declared", "bench"),
                    max_tensor=largest)  # fmt: skip
    cmd = parse("server", argv, {})
    request = to_request(cmd)
    ngl = gpu_layers(cmd)
    places = memory_by_place(
        load_model_facts(model), LlamaSettings(kv=request.kv, n_gpu_layers=ngl, layout=request.layout), target
    )
    return {place: round(items.get("compute", 0) / (1 << 20), 2) for place, items in places.items()}


def bracket(ns: argparse.Namespace, argv: list[str], env: dict[str, str], chosen: int) -> dict[str, object]:
    """Starts of bare llama-server with the final argv: at (1 + up) x chosen, then bisected with the starts left
    (upwards to 1.25 x chosen when that one started too). low: the largest -c seen to start; high: the smallest
    seen to fail (None: none failed)."""
    binary = str(Path(ns.bin_dir) / "llama-server")
    low, high, probes = chosen, None, []
    probe = int(chosen * (1 + ns.up)) // 256 * 256
    for _ in range(ns.starts):
        ok, code, _, took = start([binary, *_with_ctx(argv, probe)], env, ns.timeout)
        probes.append({"ctx": probe, "ok": ok, "exit": code, "seconds": round(took, 2)})
        if ok:
            low = probe
        else:
            high = probe
        probe = (low + high) // 2 // 256 * 256 if high is not None else min(int(low * 1.1), int(chosen * 1.25))
        probe = probe // 256 * 256
        if probe <= low or (high is not None and probe >= high):
            break
    return {"low": low, "high": high, "probes": probes, "ratio_at_least": round(chosen / high, 4) if high else None,
            "ratio_at_most": round(chosen / low, 4)}  # fmt: skip


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--bin-dir", required=True)
    ap.add_argument("--model", required=True)
    ap.add_argument("--backend", choices=("cuda", "vulkan", "cpu"), required=True)
    ap.add_argument("--shape", action="append", help="NAME|extra llama-server args (default: the issue's matrix)")
    ap.add_argument("--tag", default="", help="a prefix of each row's name (e.g. held80-)")
    ap.add_argument("--out", required=True)
    ap.add_argument("--logs", default="")
    ap.add_argument("--up", type=float, default=0.03, help="the first bare start at (1 + up) x the chosen -c")
    ap.add_argument("--starts", type=int, default=2, help="bare starts per shape (0: first spawns only)")
    ap.add_argument("--timeout", type=float, default=60)
    ap.add_argument("--deadline", type=float, default=1e9, help="seconds after which no new shape starts")
    ns = ap.parse_args()
    shapes = [s.partition("|")[::2] for s in ns.shape] if ns.shape else list(SHAPES.items())
    base = {k: v for k, v in os.environ.items() if not k.startswith(("LLAMA_ARG_", "SAFE_LLAMA_", "XDG_"))}
    base["SAFE_LLAMA_BIN_DIR"] = ns.bin_dir
    base["PYTHONPATH"] = f"{ROOT}:{os.environ.get('PYTHONPATH', '')}"
    began, rows = time.monotonic(), []
    for name, shape in shapes:
        if time.monotonic() - began > ns.deadline:
            rows.append({"shape": ns.tag + name, "args": shape, "skipped": "deadline"})
            continue
        with tempfile.TemporaryDirectory(prefix="l36-") as fresh:
            env = {**base, **{v: str(Path(fresh) / v.lower()) for v in ("XDG_CACHE_HOME", "XDG_STATE_HOME",
                                                                        "XDG_RUNTIME_DIR")}}  # fmt: skip
            for v in ("XDG_CACHE_HOME", "XDG_STATE_HOME", "XDG_RUNTIME_DIR"):
                Path(env[v]).mkdir(mode=0o700)
            spawn = first_spawn(ns, shape, env)
        log = str(spawn.pop("log"))
        if ns.logs:
            Path(ns.logs).mkdir(parents=True, exist_ok=True)
            (Path(ns.logs) / f"{ns.backend}-{ns.tag}{name}-safe-llama.log").write_text(log)
        row: dict[str, object] = {"shape": ns.tag + name, "args": shape, "backend": ns.backend, "safe_llama": spawn}
        argv, child_env = spawn["argv"], spawn["env"]
        if isinstance(argv, list) and isinstance(child_env, dict):
            row["plan_compute_mib"] = planned_compute(ns.model, ns.backend, argv)
            chosen = spawn["n_ctx"]
            if spawn["ready"] and isinstance(chosen, int) and ns.starts > 0:
                row["largest"] = bracket(ns, argv, {**base, **child_env}, chosen)
        rows.append(row)
        Path(ns.out).write_text(json.dumps(rows, indent=1))
        brief = {key: spawn[key] for key in ("ready", "attempts", "n_ctx", "compute_mib")}
        print(json.dumps({k: v for k, v in row.items() if k != "safe_llama"} | brief), flush=True)
    Path(ns.out).write_text(json.dumps(rows, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
