"""Time from the command to /health 200 on a GPU: safe-llama against bare llama-server given safe-llama's final
argv, alternated, on an empty device and with memory held by another process (issue 37):

    python3 benchmarks/bench_gpu_ready.py --bin-dir /tmp/lb/bin --model /tmp/big.gguf --out gpu-ready.json \
        [--args "-c 2000000 -ngl 99"] [--runs 5] [--planned-runs 2] [--conditions empty,held] [--hold-gib 80] \
        [--python /path/to/venv/bin/python]

safe-llama runs as installed: the console script pip writes into a venv's bin/ (CONSOLE_SCRIPT), under --python
(default: this interpreter; a venv's python sees the venv's site-packages only, as a user's install does).

Per condition (held: a process holding --hold-gib GiB of the GPU, started first and kept to the end of it):
safe-llama's first start there (the cache of the condition before it, or none: it plans and writes its
launch record), then --runs rounds of safe-llama (the start after a first one: from the record while the
GPU's free memory is within the plan's margin), bare llama-server with the final argv and environment of
`safe-llama plan --json` (taken there, before the rounds), and --planned-runs rounds of `safe-llama
--no-remember` (planning every time, the path before the early start), alternated. Each start waits for
/health 200 (polled every 5 ms) and is stopped (its process group, waited for: its GPU memory is free again
before the next). Before each safe-llama round, early.py's own check says whether it starts from its launch
record: `early` per run; `exec_s`: seconds from the spawn to the exec of llama-server, per run (safe-llama's own
part of the time).

Writes one JSON (replayed by tests/remembered/test_gpu_ready_replay.py from
tests/fixtures/nvidia-h200-cuda/gpu-ready/) and the logs of the first starts under --logs. Every wait is
bounded; the same fixed port per command (a launch record is keyed on the words, the port among them).
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from benchmarks.bench_first_start import _healthy, _port, stop_group

ROOT = Path(__file__).resolve().parent.parent
SETTLE = 5.0  # seconds a first start may take past /health to write its record (it polls /health every 0.2 s,
# then finds the least budgets its plan holds under: planning again, under a cgroup limit)
# whether the next `safe-llama ARGS` would start from its launch record (remembered/early.py's own check)
WOULD_START_EARLY = (
    "import os, sys; from safe_llama.remembered import early; hidden = early.secret_options(os.environ); "
    "path = early.record_path(os.environ, early.key('safe-llama', sys.argv[1:], os.getcwd(), hidden or ())); "
    "record = early.load(path) if hidden is not None else None; "
    "print(int(record is not None and early.still_valid(record, os.environ)))"
)
HOLD = (
    "import sys,time,torch; x=torch.empty({n}*2**30,dtype=torch.uint8,device='cuda'); x.fill_(1); "
    "torch.cuda.synchronize(); print('held', flush=True); time.sleep(3000)"
)


def _server_exec(pid: int) -> bool:
    """Whether pid, or a child of it, runs llama-server already (the exec of the real binary has happened)."""
    try:
        children = Path(f"/proc/{pid}/task/{pid}/children").read_text().split()
    except OSError:
        children = []
    for one in [str(pid), *children]:
        try:
            if os.path.basename(os.readlink(f"/proc/{one}/exe")) == "llama-server":
                return True
        except OSError:
            continue
    return False


def ready_time(
    argv: list[str],
    env: dict[str, str],
    port: int,
    timeout: float,
    log: Path,
    cache: Path | None = None,
    execs: list[float | None] | None = None,
) -> float | None:
    """Seconds from the spawn of argv to /health 200 on port (None: not ready within timeout); then stopped.
    cache: a first safe-llama start's, given time (at most SETTLE s) to write its launch record once ready, so
    that the next start finds it; not counted in the time. execs: gets the seconds from the spawn to the exec of
    llama-server (polled every millisecond until then: what safe-llama spends before the real binary runs)."""
    with log.open("wb") as out:
        began = time.monotonic()
        proc = subprocess.Popen(argv, env=env, stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT,
                                start_new_session=True)  # fmt: skip
        took, exec_at = None, None
        while execs is not None and exec_at is None and time.monotonic() - began < timeout and proc.poll() is None:
            if _server_exec(proc.pid):
                exec_at = time.monotonic() - began
            else:
                time.sleep(0.001)
        if execs is not None:
            execs.append(exec_at)
        while time.monotonic() - began < timeout and proc.poll() is None:
            if _healthy(port):
                took = time.monotonic() - began
                was, settled = _records(cache) if cache else {}, time.monotonic() + SETTLE
                while cache is not None and _records(cache) == was and time.monotonic() < settled:
                    time.sleep(0.01)
                break
            time.sleep(0.005)
        stop_group(proc)
    return took


# what pip writes for the console script `safe-llama = "safe_llama.entry:main"` (pyproject.toml), under a shebang
CONSOLE_SCRIPT = """#!{python}
# -*- coding: utf-8 -*-
import re
import sys
from safe_llama.entry import main
if __name__ == '__main__':
    sys.argv[0] = re.sub(r'(-script\\.pyw|\\.exe)?$', '', sys.argv[0])
    sys.exit(main())
"""


def console_script(python: str, folder: Path) -> Path:
    """An installed `safe-llama` entry point for this interpreter (as pip writes it into a venv's bin/)."""
    folder.mkdir(parents=True, exist_ok=True)
    script = folder / "safe-llama"
    script.write_text(CONSOLE_SCRIPT.format(python=python))
    script.chmod(0o755)
    return script


def would_start_early(python: str, words: list[str], env: dict[str, str]) -> bool:
    done = subprocess.run([python, "-c", WOULD_START_EARLY, *words], env=env, capture_output=True, text=True)
    return done.stdout.strip() == "1"


def _records(cache: Path) -> dict[str, int]:
    """The launch records under this cache folder and when each was written."""
    folder = cache / "safe-llama" / "launch"
    return {p.name: p.stat().st_mtime_ns for p in folder.glob("*.marshal")} if folder.is_dir() else {}


def _hold(gib: int, timeout: float) -> subprocess.Popen[bytes]:
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    proc = subprocess.Popen([os.environ.get("HOLD_PYTHON", sys.executable), "-c", HOLD.format(n=gib)], env=env,
                            stdout=subprocess.PIPE,
                            start_new_session=True)  # fmt: skip
    assert proc.stdout is not None
    began = time.monotonic()
    while time.monotonic() - began < timeout:
        if proc.stdout.readline().strip() == b"held":
            return proc
        if proc.poll() is not None:
            break
    os.killpg(proc.pid, signal.SIGKILL)
    raise RuntimeError(f"could not hold {gib} GiB of the GPU")


def summary(row: dict[str, list[float | None]]) -> dict[str, float | None]:
    """Medians of the rows that reached /health, and the ratios against bare (None where a row never did)."""
    med = {name: statistics.median([t for t in times if t is not None]) if any(times) else None
           for name, times in row.items()}  # fmt: skip
    bare = med.get("bare")
    out: dict[str, float | None] = {f"median_{k}": v for k, v in med.items()}
    for name in ("safe_llama", "planned"):
        value = med.get(name)
        out[f"ratio_{name}"] = value / bare if value is not None and bare else None
    return out


def condition(name: str, ns: argparse.Namespace, env: dict[str, str], cache: Path) -> dict[str, object]:
    py = [str(console_script(ns.python, Path(tempfile.mkdtemp()) / "bin"))]
    user = [*shlex.split(ns.args), "--host", "127.0.0.1"]
    port_safe, port_bare, port_planned = _port(), _port(), _port()
    args = ["-m", ns.model, *user, "--port", str(port_safe)]
    logs = Path(ns.logs)
    before = _records(cache)
    first_log = logs / f"{name}-first-safe-llama.log"
    first = ready_time([*py, "server", *args], env, port_safe, ns.timeout, first_log, cache)
    after = _records(cache)
    plan = subprocess.run([*py, "plan", "--json", "server", *args], env=env, capture_output=True, text=True,
                          timeout=ns.timeout)  # fmt: skip
    decision = json.loads(plan.stdout)["decision"] if plan.returncode == 0 else {"argv": [], "env": {}}
    final = [a if a != str(port_safe) else str(port_bare) for a in decision["argv"]]
    bare = [str(Path(ns.bin_dir) / "llama-server"), *final]
    bare_env = {**env, **decision["env"]}
    planned_args = ["-m", ns.model, *user, "--port", str(port_planned)]
    planned = [*py, "--no-remember", "server", *planned_args]
    rows: dict[str, list[float | None]] = {"safe_llama": [], "bare": [], "planned": []}
    early: list[bool] = []
    execs: dict[str, list[float | None]] = {"safe_llama": [], "bare": []}
    scratch = Path(tempfile.mkdtemp())
    for i in range(ns.runs):
        early.append(would_start_early(ns.python, ["server", *args], env))
        rows["safe_llama"].append(
            ready_time([*py, "server", *args], env, port_safe, ns.timeout, scratch / "s.log", None, execs["safe_llama"])
        )
        rows["bare"].append(ready_time(bare, bare_env, port_bare, ns.timeout, scratch / "b.log", None, execs["bare"]))
        if i < ns.planned_runs:
            rows["planned"].append(ready_time(planned, env, port_planned, ns.timeout, scratch / "p.log"))
    for log in ("s.log", "b.log", "p.log"):
        if (scratch / log).exists():
            (scratch / log).replace(logs / f"{name}-last-{log}")
    return {
        "first_start_s": first,
        "first_start_wrote_a_record": after != before and bool(after),
        "final_argv": final,
        "final_env": decision["env"],
        "plan_returncode": plan.returncode,
        "runs": rows,
        "early": early,
        "exec_s": execs,
        **summary(rows),
    }


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--bin-dir", required=True)
    parser.add_argument("--model", required=True)
    parser.add_argument("--args", default="-c 2000000 -ngl 99")
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--planned-runs", type=int, default=2)
    parser.add_argument("--conditions", default="empty,held")
    parser.add_argument("--hold-gib", type=int, default=80)
    parser.add_argument("--timeout", type=float, default=60.0)
    parser.add_argument("--python", default=sys.executable, help="the interpreter of the safe-llama entry point")
    parser.add_argument("--out", required=True)
    parser.add_argument("--logs", default=tempfile.mkdtemp(prefix="gpu-ready-logs-"))
    ns = parser.parse_args()
    Path(ns.logs).mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix="gpu-ready-"))
    env = {k: v for k, v in os.environ.items() if not k.startswith(("XDG_", "SAFE_LLAMA_"))}
    env.pop("PYTHONDONTWRITEBYTECODE", None)  # bytecode written and used, as in an installed package
    for folder in ("cache", "state", "config", "runtime"):
        (work / folder).mkdir(mode=0o700)
    env.update(XDG_CACHE_HOME=str(work / "cache"), XDG_STATE_HOME=str(work / "state"),
               XDG_CONFIG_HOME=str(work / "config"), XDG_RUNTIME_DIR=str(work / "runtime"),
               SAFE_LLAMA_BIN_DIR=str(Path(ns.bin_dir).resolve()))  # fmt: skip
    env["PYTHONPATH"] = os.pathsep.join(p for p in [env.get("PYTHONPATH", ""), str(ROOT)] if p)
    version = subprocess.run([ns.python, "-c", "import sys; print(sys.version.split()[0], sys.prefix)"],
                             capture_output=True, text=True, check=True).stdout.split()  # fmt: skip
    result: dict[str, object] = {"args": ns.args, "model": ns.model, "runs": ns.runs, "bin_dir": ns.bin_dir,
                                 "python": version[0], "python_prefix": version[1], "conditions": {}}  # fmt: skip
    conditions = result["conditions"]
    assert isinstance(conditions, dict)
    for name in ns.conditions.split(","):
        holder = _hold(ns.hold_gib, ns.timeout) if name == "held" else None
        try:
            conditions[name] = condition(name, ns, env, work / "cache")
        finally:
            if holder is not None:
                os.killpg(holder.pid, signal.SIGKILL)
                holder.wait()
                time.sleep(1.0)  # the held memory is the driver's to free after the exit
        print(json.dumps({name: {k: v for k, v in conditions[name].items() if k != "final_argv"}}), flush=True)
    Path(ns.out).write_text(json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
