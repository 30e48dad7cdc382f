"""The supervisor's own memory while llama-server runs, against a bare interpreter measured the same way, side by
side in one run (issue 37):

    /opt/safe-llama/venv/bin/python benchmarks/bench_supervisor_memory.py [--runs N] [--python /usr/bin/python3]

Each round, alternated: `safe-llama server -m <bundled> -c 4096` started from its launch record (the second launch
of the same words: the early start, the usual launch after the first), with --no-remember planned (the first
launch's path), and planned with --no-hand-off (the full supervisor kept); each read once llama-server answers
/health 200 and a second has passed (by then a ready server's supervision is handed to the small handed
supervisor, process/handed.py, unless --no-hand-off); and the same interpreter running `import os; os.read(0, 1)`
(the start of `python3 -c pass`, held on a pipe so it can be read); and the planned launch inside a fresh
GROUP_MIB memory cgroup, where it hands off as llama-server starts (attempts/at_spawn.py; needs root). The figure
is /proc/PID/status's VmRSS + VmPTE (resident pages, anonymous and file-backed, and page tables: what a cgroup is
charged for the process, the file pages it shares with others aside), and RssAnon apart. Medians. Issue 37's goal:
at most 8 MiB over the bare interpreter once llama-server runs (tests/process/test_handed.py holds it).

Last, what a hand-off once ready gives back to a cgroup (not counted by such a plan: configs/planner.toml says
why): RssAnon + VmPTE of the planned launch at its probe of the host (device/probe_host.probe_host, where it reads
the cgroup's usage), less the handed supervisor's.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from benchmarks.bench_host_limits import Limit, memory_group  # noqa: E402
from safe_llama.model.bundled import bundled_model_path  # noqa: E402
from safe_llama.paths import pinned_bin_dir  # noqa: E402
from tests.llama_run import free_port, healthy  # noqa: E402

FIELDS = ("VmRSS", "VmPTE", "RssAnon")
# a group the bundled model's -c 4096 server fits in: the launch hands off as it starts (attempts/at_spawn.py)
GROUP_MIB = 1024


def memory(pid: int) -> dict[str, int]:
    """The FIELDS of /proc/PID/status, in KiB."""
    out = {}
    with open(f"/proc/{pid}/status") as status:
        for line in status:
            name, _, value = line.partition(":")
            if name in FIELDS:
                out[name] = int(value.split()[0])
    return out


def supervisor(argv: list[str], env: dict[str, str], port: int, group: Path | None = None) -> dict[str, int]:
    """The supervisor's FIELDS a second after /health 200 (group: started inside that memory cgroup)."""

    def enter() -> None:
        if group is not None:
            (group / "cgroup.procs").write_text(str(os.getpid()))

    proc = subprocess.Popen([*argv, "--port", str(port)], env=env, stdin=subprocess.DEVNULL,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, preexec_fn=enter)  # fmt: skip
    try:
        deadline = time.monotonic() + 120
        while not healthy(port):
            if proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"{argv} did not become ready")
            time.sleep(0.02)
        time.sleep(1.0)
        return memory(proc.pid)
    finally:
        proc.terminate()
        proc.wait(30)


# the planned launch, its RssAnon + VmPTE written to a file the first time it probes the host
AT_PROBE = """import sys
from safe_llama.device import probe_host
probe, where = probe_host.probe_host, [sys.argv.pop(1)]
def noted(*args, **kwargs):
    if where:
        with open(where.pop(), "w") as out, open("/proc/self/status") as status:
            out.write(status.read())
    return probe(*args, **kwargs)
probe_host.probe_host = noted
from safe_llama.entry import main
main()
"""


def at_probe(python: str, model: str, env: dict[str, str], port: int) -> dict[str, int]:
    with tempfile.NamedTemporaryFile("r", suffix=".status") as noted:
        argv = [python, "-c", AT_PROBE, noted.name, "--no-remember", "server", "-m", model, "-c", "4096"]
        supervisor(argv, env, port)
        fields = dict(line.split(":", 1) for line in noted.read().splitlines() if ":" in line)
    return {name: int(fields[name].split()[0]) for name in FIELDS}


def bare(python: str, env: dict[str, str]) -> dict[str, int]:
    proc = subprocess.Popen([python, "-c", "import os; os.read(0, 1)"], env=env, stdin=subprocess.PIPE)
    try:
        time.sleep(0.5)
        return memory(proc.pid)
    finally:
        assert proc.stdin is not None
        proc.stdin.close()
        proc.wait(30)


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--python", default=sys.executable)
    opts = parser.parse_args()
    model = str(bundled_model_path(os.environ))
    env = {**os.environ, "SAFE_LLAMA_BIN_DIR": str(pinned_bin_dir("cpu", os.environ)), "PYTHONSAFEPATH": "1"}
    env.update(XDG_CACHE_HOME=tempfile.mkdtemp(), PYTHONPATH=str(ROOT))
    env.pop("PYTHONDONTWRITEBYTECODE", None)
    server = [opts.python, "-m", "safe_llama", "server", "-m", model, "-c", "4096"]
    planned = [opts.python, "-m", "safe_llama", "--no-remember", "server", "-m", model, "-c", "4096"]
    kept = [opts.python, "-m", "safe_llama", "--no-remember", "--no-hand-off", "server", "-m", model, "-c", "4096"]
    port = free_port()  # the same words each time: the launch record is keyed on them
    supervisor(server, env, port)  # the first launch: plans, writes the record
    rows: dict[str, list[dict[str, int]]] = {"python3 (bare start)": [], "safe-llama, early start": [],
                                             "safe-llama, planned": [], "planned, --no-hand-off": [],
                                             "planned, at its probe": [],
                                             f"planned, {GROUP_MIB} MiB cgroup (at the spawn)": []}  # fmt: skip
    for _ in range(opts.runs):
        rows["python3 (bare start)"].append(bare(opts.python, env))
        rows["safe-llama, early start"].append(supervisor(server, env, port))
        rows["safe-llama, planned"].append(supervisor(planned, env, free_port()))
        rows["planned, --no-hand-off"].append(supervisor(kept, env, free_port()))
        rows["planned, at its probe"].append(at_probe(opts.python, model, env, free_port()))
        with memory_group(Limit("cgroup", GROUP_MIB << 20), prefix="safe-llama-bench-memory") as group:
            rows[f"planned, {GROUP_MIB} MiB cgroup (at the spawn)"].append(supervisor(planned, env, free_port(), group))
    base = statistics.median(r["VmRSS"] + r["VmPTE"] for r in rows["python3 (bare start)"])
    print(f"{opts.runs} alternated rounds, {opts.python}; KiB: VmRSS + VmPTE (RssAnon), over the bare interpreter")
    for name, samples in rows.items():
        total = statistics.median(r["VmRSS"] + r["VmPTE"] for r in samples)
        anon = statistics.median(r["RssAnon"] for r in samples)
        print(f"{name:<28}{total:>9} KiB ({anon:>6} anon){(total - base) / 1024:>9.1f} MiB over")
    probe, handed = (statistics.median(r["RssAnon"] + r["VmPTE"] for r in rows[name])
                     for name in ("planned, at its probe", "safe-llama, planned"))  # fmt: skip
    print(f"given back by the hand-off (RssAnon + VmPTE at the probe less handed): {(probe - handed) / 1024:.2f} MiB")
    return 0


if __name__ == "__main__":
    sys.exit(main())
