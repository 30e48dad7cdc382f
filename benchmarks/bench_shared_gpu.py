"""A GPU that is not ours alone: safe-llama beside another process holding VRAM, against bare llama-server
under the same blocker, on a real device (written for the GPU machine of the device tool; any CUDA host).

    python3 benchmarks/bench_shared_gpu.py --bin-dir DIR --out results.json --logs LOGDIR \\
        --hold-gib 80 --case "ngl99-c2M|big.gguf|-c 2000000 -ngl 99|ctx" \\
        --leave-gib 5 --case "dense-ngl99|dense.gguf|-c 8192 -ngl 99|ngl" --shrink "big.gguf|-c 2000000 -ngl 99|30"

Each --case runs under the blocker given before it (--hold-gib N: another process holds N GiB; --leave-gib N:
it holds all but N GiB of what is free): `safe-llama server` until /health 200 (first start: one spawn), then
the largest value that starts with safe-llama's final argv and environment ("ctx": -c, bisected to 0.5%;
"ngl": -ngl, stepped up one layer at a time; "ncmoe": -ncmoe stepped down), then bare llama-server with the
arguments as typed. --shrink MODEL|ARGS|GIB: a second blocker takes GIB more once safe-llama has planned (its
first line) and before llama.cpp allocates: the retry must name the device and allocation and start.
--speed MODEL|ARGS: tokens per second of a 64-token completion with those llama-server arguments.
The blocker is PyTorch (`torch.empty(...).fill_(1)` on cuda:0). Every process is stopped; every wait is bounded.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from benchmarks.bench_first_start import _FAILED, _KV, _SLOT_CTX, _healthy, _port, largest, start

ROOT = Path(__file__).resolve().parent.parent
_BLOCK = (
    "import sys, time, torch\n"
    "torch.zeros(1, device='cuda')\n"
    "n = int(float(sys.argv[1]) * 2**30)\n"
    "go = sys.argv[2] if len(sys.argv) > 2 else ''\n"
    "while go and not __import__('os').path.exists(go): time.sleep(0.002)\n"
    "x = torch.empty(n, dtype=torch.uint8, device='cuda'); x.fill_(1); torch.cuda.synchronize()\n"
    "print('held', flush=True); time.sleep(3000)\n"
)


def free_mib() -> int:
    out = subprocess.run(
        ["nvidia-smi", "--query-gpu=memory.free", "--format=csv,noheader,nounits"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    return int(out.split()[0])


class Blocker:
    """Another process holding GiB of the GPU until stopped; with `go`, it allocates once that file exists."""

    def __init__(self, gib: float, go: str = "") -> None:
        env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
        self.proc = subprocess.Popen(
            [sys.executable, "-c", _BLOCK, str(gib), go],
            env=env,
            stdout=subprocess.PIPE,
            text=True,
            start_new_session=True,
        )
        self.gib = gib
        if not go:
            self.wait()

    def wait(self) -> None:
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline()
        if "held" not in line:
            raise RuntimeError(f"blocker of {self.gib} GiB failed")

    def stop(self) -> None:
        os.killpg(self.proc.pid, signal.SIGKILL)
        self.proc.wait()
        time.sleep(1)


def _set(argv: list[str], option: str, value: str) -> list[str]:
    out, i = [], 0
    names = {
        "-c": ("-c", "--ctx-size"),
        "-ngl": ("-ngl", "--gpu-layers", "--n-gpu-layers"),
        "-ncmoe": ("-ncmoe", "--n-cpu-moe"),
    }[option]
    while i < len(argv):
        if argv[i] in names:
            i += 2
            continue
        out.append(argv[i])
        i += 1
    return [*out, option, value]


def _get(argv: list[str], *names: str) -> int | None:
    for i, word in enumerate(argv[:-1]):
        if word in names:
            return int(argv[i + 1])
    return None


def _plan(model: str, args: list[str], senv: dict[str, str]) -> dict[str, object]:
    py = [sys.executable, "-m", "safe_llama"]
    out = subprocess.run(
        [*py, "plan", "--json", "server", "-m", model, *args],
        env=senv,
        capture_output=True,
        text=True,
        check=True,
        timeout=300,
    ).stdout
    return dict(json.loads(out))


def run_case(
    name: str,
    model: str,
    args: list[str],
    search: str,
    ns: argparse.Namespace,
    env: dict[str, str],
    senv: dict[str, str],
) -> dict[str, object]:
    binary = str(Path(ns.bin_dir) / "llama-server")
    plan = _plan(model, args, senv)
    decision = plan.get("decision") if isinstance(plan.get("decision"), dict) else {}
    assert isinstance(decision, dict)
    final = [str(x) for x in decision.get("argv", [])]
    plan_env = {**env, **dict(decision.get("env", {}))}
    t = plan.get("target")
    ready, code, log, took = start(
        [sys.executable, "-m", "safe_llama", "server", "-m", model, *args, "-lv", "4"], senv, ns.timeout
    )
    (Path(ns.logs) / f"{name}-safe-llama.log").write_text(log)
    row: dict[str, object] = {
        "case": name,
        "model": Path(model).name,
        "args": args,
        "free_mib_before": free_mib(),
        "device_budget": t.get("device_budget") if isinstance(t, dict) else None,
        "plan_argv": final,
        "safe_llama": {
            "ready": ready,
            "exit": code,
            "seconds": round(took, 1),
            "attempts": 1 + len(_FAILED.findall(log)),
            "kv": [m for m in _KV.findall(log)],
            "lines": [x for x in log.splitlines() if x.startswith("safe-llama")],
        },
    }
    if ready and final and ns.budget > 0:
        if search == "ctx":
            chosen = [int(m) for m in _SLOT_CTX.findall(log)][-1]
            best, tried = largest(binary, final, plan_env, chosen, ns.timeout, ns.budget)
            row.update(chosen=chosen, largest_that_starts=best, bisection_starts=tried, ratio=round(chosen / best, 4))
        elif search == "ngl":
            chosen_ngl = _get(final, "-ngl", "--gpu-layers", "--n-gpu-layers")
            assert chosen_ngl is not None
            best_ngl, tried = chosen_ngl, 0
            while tried < ns.budget:
                tried += 1
                if not start([binary, *_set(final, "-ngl", str(best_ngl + 1))], plan_env, ns.timeout)[0]:
                    break
                best_ngl += 1
            row.update(chosen_ngl=chosen_ngl, largest_ngl_that_starts=best_ngl, steps=tried)
        elif search == "ncmoe":
            chosen_n = _get(final, "-ncmoe", "--n-cpu-moe") or 0
            fewest, tried = chosen_n, 0
            while fewest > 0 and tried < ns.budget:
                tried += 1
                if not start([binary, *_set(final, "-ncmoe", str(fewest - 1))], plan_env, ns.timeout)[0]:
                    break
                fewest -= 1
            row.update(chosen_ncmoe=chosen_n, fewest_ncmoe_that_starts=fewest, steps=tried)
    bare_ready, bare_code, bare_log, bare_took = start([binary, "-m", model, *args, "-lv", "4"], env, ns.timeout)
    (Path(ns.logs) / f"{name}-bare.log").write_text(bare_log)
    bare_ctx = [int(m) for m in _SLOT_CTX.findall(bare_log)]
    row["bare"] = {
        "ready": bare_ready,
        "exit": bare_code,
        "seconds": round(bare_took, 1),
        "n_ctx": bare_ctx[-1] if bare_ctx else None,
        "kv": [m for m in _KV.findall(bare_log)],
        "offloaded": [x.split("load_tensors: ")[-1] for x in bare_log.splitlines() if "offloaded" in x],
    }
    return row


def run_shrink(
    model: str, args: list[str], gib: float, ns: argparse.Namespace, senv: dict[str, str]
) -> dict[str, object]:
    go = "/tmp/bench-shared-gpu-go"
    Path(go).unlink(missing_ok=True)
    second = Blocker(gib, go)
    time.sleep(8)  # torch's CUDA start-up, before the trigger
    port = _port()
    began = time.monotonic()
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "safe_llama",
            "server",
            "-m",
            model,
            *args,
            "-lv",
            "4",
            "--host",
            "127.0.0.1",
            "--port",
            str(port),
        ],
        env=senv,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    assert proc.stdout is not None
    lines: list[str] = []
    ready = False
    for raw in proc.stdout:
        line = raw.decode(errors="replace")
        lines.append(line)
        if line.startswith("safe-llama") and not Path(go).exists():
            Path(go).touch()  # planned: the second blocker takes its share now
            second.wait()
        if "server is listening" in line or "all slots are idle" in line:
            ready = _healthy(port)
            if ready:
                break
        if time.monotonic() - began > ns.timeout:
            break
    os.killpg(proc.pid, signal.SIGTERM)
    proc.wait(60)
    second.stop()
    log = "".join(lines)
    (Path(ns.logs) / "shrink-safe-llama.log").write_text(log)
    return {
        "case": "shrink",
        "args": args,
        "second_blocker_gib": gib,
        "ready": ready,
        "attempts": 1 + len(_FAILED.findall(log)),
        "seconds": round(time.monotonic() - began, 1),
        "lines": [x.rstrip() for x in lines if x.startswith("safe-llama")],
    }


def run_speed(model: str, args: list[str], ns: argparse.Namespace, env: dict[str, str]) -> dict[str, object]:
    binary = str(Path(ns.bin_dir) / "llama-server")
    port = _port()
    proc = subprocess.Popen(
        [binary, "-m", model, *args, "--host", "127.0.0.1", "--port", str(port)],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    result: dict[str, object] = {"case": "speed", "args": args}
    try:
        deadline = time.monotonic() + ns.timeout
        while time.monotonic() < deadline and proc.poll() is None and not _healthy(port):
            time.sleep(0.25)
        body = json.dumps({"prompt": "hello " * 200, "n_predict": 64, "ignore_eos": True}).encode()
        rates = []
        for _ in range(3):
            request = urllib.request.Request(
                f"http://127.0.0.1:{port}/completion", data=body, headers={"Content-Type": "application/json"}
            )
            with urllib.request.urlopen(request, timeout=120) as response:  # noqa: S310 (loopback only)
                timings = json.loads(response.read())["timings"]
            rates.append((timings["prompt_per_second"], timings["predicted_per_second"]))
        result["prompt_tps"] = round(sorted(r[0] for r in rates)[1], 1)
        result["gen_tps"] = round(sorted(r[1] for r in rates)[1], 1)
    except (OSError, KeyError, ValueError) as err:
        result["error"] = str(err)
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(60)
    return result


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--bin-dir", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--logs", default=".")
    ap.add_argument("--timeout", type=float, default=120)
    ap.add_argument("--budget", type=int, default=8)
    ap.add_argument("--hold-gib", type=float, action="append", default=[], help="block N GiB for the cases after it")
    ap.add_argument("--leave-gib", type=float, action="append", default=[], help="leave N GiB free for the cases after")
    ap.add_argument("--case", action="append", default=[], help="NAME|MODEL|ARGS|ctx,ngl,ncmoe")
    ap.add_argument("--shrink", action="append", default=[], help="MODEL|ARGS|GIB")
    ap.add_argument("--speed", action="append", default=[], help="MODEL|ARGS")
    ns = ap.parse_args()
    Path(ns.logs).mkdir(parents=True, exist_ok=True)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("LLAMA_ARG_", "SAFE_LLAMA_"))}
    senv = {**env, "SAFE_LLAMA_BIN_DIR": ns.bin_dir, "PYTHONPATH": f"{ROOT}:{env.get('PYTHONPATH', '')}"}
    # the blockers apply to what follows them on the command line: walk argv in order
    rows: list[dict[str, object]] = []
    blocker: Blocker | None = None
    argv = sys.argv[1:]
    i = 0
    while i < len(argv):
        word, value = argv[i], argv[i + 1] if i + 1 < len(argv) else ""
        i += 2 if word.startswith("--") and "=" not in word else 1
        if word in ("--hold-gib", "--leave-gib"):
            if blocker is not None:
                blocker.stop()
            gib = float(value) if word == "--hold-gib" else (free_mib() - float(value) * 1024) / 1024
            blocker = Blocker(gib)
            rows.append({"blocker_gib": round(gib, 2), "free_mib": free_mib()})
        elif word == "--case":
            name, model, args, search = value.split("|")
            rows.append(run_case(name, model, args.split(), search, ns, env, senv))
        elif word == "--shrink":
            model, args, more = value.split("|")
            rows.append(run_shrink(model, args.split(), float(more), ns, senv))
        elif word == "--speed":
            model, args = value.split("|")
            rows.append(run_speed(model, args.split(), ns, env))
        else:
            continue
        Path(ns.out).write_text(json.dumps(rows, indent=1))
        print(json.dumps(rows[-1])[:2000], flush=True)
    if blocker is not None:
        blocker.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
