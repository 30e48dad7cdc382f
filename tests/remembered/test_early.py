"""The early start end to end: `python -m safe_llama` twice, the second from the launch record the first wrote.
The child is the real pinned llama-completion on the bundled model, behind a shim that logs the argv and the
whole environment it was given (FAKE-free: the shim only logs, then execs the real binary); the seed's
OpenVINO fake stands in where a start must fail for memory (no real part fails on demand).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from safe_llama.constants import GUARD_ENV
from safe_llama.remembered import early
from tests import ROOT
from tests.llama_run import free_port, healthy
from tests.tiny_gguf import LLAMA_3B, write_metadata_gguf

SHIM = """#!{python}
# logs the argv and environment llama-completion is started with, then runs the real one
import json, os, sys
if not {{"--version", "--list-devices"}} & set(sys.argv[1:]):
    with open(os.environ["SHIM_LOG"], "a") as log:
        log.write(json.dumps([sys.argv[1:], dict(os.environ)]) + "\\n")
    for n in range(int(os.environ.get("SHIM_FLOOD", "0"))):  # at once, before the supervisor is imported
        os.write(1, b"out %d\\n" % n)
        os.write(2, b"err %d\\n" % n)
os.execv({real!r}, [{real!r}, *sys.argv[1:]])
"""


def _run(args: list[str], env: dict[str, str], cwd: Path) -> tuple[int, str, str, int]:
    proc = subprocess.Popen(
        [sys.executable, "-m", "safe_llama", *args],
        env=env,
        cwd=cwd,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    out, err = proc.communicate(timeout=120)
    return proc.returncode, out, err, proc.pid


def _ours(stderr: str) -> list[str]:
    return [line for line in stderr.splitlines() if line.startswith("safe-llama:")]


@pytest.fixture
def shimmed(
    tmp_path: Path, llama_bin: Path, bundled_model: Path, clean_env: dict[str, str]
) -> tuple[dict[str, str], list[str]]:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    shim = bin_dir / "llama-completion"
    shim.write_text(SHIM.format(python=sys.executable, real=str(llama_bin / "llama-completion")))
    shim.chmod(0o755)
    env = {
        **clean_env,
        "XDG_CACHE_HOME": str(tmp_path / "cache"),
        "XDG_CONFIG_HOME": str(tmp_path / "config"),
        "SAFE_LLAMA_BIN_DIR": str(bin_dir),
        "SHIM_LOG": str(tmp_path / "shim.log"),
    }
    return env, ["completion", "-m", str(bundled_model), "-c", "512", "-n", "2", "-p", "hi", "-no-cnv", "--seed", "1"]


def _logged(env: dict[str, str]) -> list[tuple[list[str], dict[str, str]]]:
    return [tuple(json.loads(line)) for line in Path(env["SHIM_LOG"]).read_text().splitlines()]


def _plans(env: dict[str, str]) -> dict[str, int]:
    folder = Path(env["XDG_CACHE_HOME"]) / "safe-llama" / "plans"
    return {p.name: p.stat().st_mtime_ns for p in folder.glob("*.json")}


def _records(env: dict[str, str]) -> list[Path]:
    return list((Path(env["XDG_CACHE_HOME"]) / "safe-llama" / early.FOLDER).glob("*.marshal"))


@pytest.mark.slow
def test_an_early_start_gives_the_child_what_a_full_launch_gives(
    shimmed: tuple[dict[str, str], list[str]], tmp_path: Path
) -> None:
    env, args = shimmed
    full = _run(args, env, tmp_path)
    assert full[0] == 0, full[2][-2000:]
    assert len(_records(env)) == 1
    plans = _plans(env)
    fast = _run(args, env, tmp_path)
    assert fast[0] == 0, fast[2][-2000:]
    assert _plans(env) == plans  # nothing planned nor remembered again: the record started it
    (argv_full, env_full), (argv_fast, env_fast) = _logged(env)
    assert argv_fast == argv_full and "-fit" in argv_full
    assert env_full.pop(GUARD_ENV) == str(full[3]) and env_fast.pop(GUARD_ENV) == str(fast[3])
    assert env_fast == env_full
    assert _ours(fast[2]) == _ours(full[2]) and _ours(full[2])
    assert fast[1] == full[1]  # the same seed: the same words, relayed


@pytest.mark.slow
def test_a_changed_input_takes_the_full_path(shimmed: tuple[dict[str, str], list[str]], tmp_path: Path) -> None:
    env, args = shimmed
    assert _run(args, env, tmp_path)[0] == 0
    plans = _plans(env)
    changed = {**env, "LLAMA_ARG_BATCH": "64"}  # read by the planner: the record does not hold
    assert _run(args, changed, tmp_path)[0] == 0
    assert _plans(env) != plans  # planned and remembered again
    assert _logged(env)[1][1]["LLAMA_ARG_BATCH"] == "64"


@pytest.mark.slow
def test_the_recursion_guard_still_refuses(shimmed: tuple[dict[str, str], list[str]], tmp_path: Path) -> None:
    env, args = shimmed
    assert _run(args, env, tmp_path)[0] == 0
    code, _, err, _ = _run(args, {**env, GUARD_ENV: "1"}, tmp_path)
    assert code == 127 and "started by safe-llama" in err
    assert len(_logged(env)) == 1


@pytest.mark.slow
def test_no_remember_takes_the_full_path(shimmed: tuple[dict[str, str], list[str]], tmp_path: Path) -> None:
    env, args = shimmed
    assert _run(args, env, tmp_path)[0] == 0
    code, _, err, _ = _run(["--no-remember", *args], env, tmp_path)
    assert code == 0, err[-2000:]
    assert len(_records(env)) == 1  # a record for other words is not used, none is written for these


@pytest.mark.slow
def test_an_unusable_cache_takes_the_full_path(shimmed: tuple[dict[str, str], list[str]], tmp_path: Path) -> None:
    env, args = shimmed
    assert _run(args, env, tmp_path)[0] == 0
    record = _records(env)[0]
    record.chmod(0o644 | 0o002)  # others may write it: not trusted
    code, _, err, _ = _run(args, env, tmp_path)
    assert code == 0, err[-2000:]
    assert record.stat().st_mode & 0o077 == 0  # written again, by the full path


def _fake_bin(tmp_path: Path) -> Path:
    bin_dir = tmp_path / "fakebin"
    bin_dir.mkdir()
    shim = bin_dir / "llama-completion"
    shim.write_text(
        f"#!/bin/sh\n# FAKE: an Intel-GPU OpenVINO llama.cpp build (see tests/fakes/fake_openvino_llama.py)\n"
        f'exec {sys.executable} {ROOT / "tests" / "fakes" / "fake_openvino_llama.py"} "$@"\n'
    )
    shim.chmod(0o755)
    return bin_dir


@pytest.mark.slow
def test_a_memory_failure_of_an_early_start_retries_as_a_full_launch_does(
    tmp_path: Path, clean_env: dict[str, str]
) -> None:
    """The record started attempt 1, which failed for memory: the same lines, retries and exit code as a
    launch without a record, and the record is dropped."""
    model = write_metadata_gguf(tmp_path / "Llama-3.2-3B-Instruct-Q4_K_M.gguf", "llama", LLAMA_3B)
    env: dict[str, Any] = {
        **clean_env,
        "XDG_CACHE_HOME": str(tmp_path / "cache"),
        "SAFE_LLAMA_BIN_DIR": str(_fake_bin(tmp_path)),
        "FAKE_ARGV_LOG": str(tmp_path / "argv.log"),
    }
    args = ["completion", "-m", str(model), "-c", "4096", "-p", "Once", "-n", "8"]
    first = _run(args, env, tmp_path)
    assert first[0] == 0, first[2][-2000:]
    assert len(_records(env)) == 1
    failing = {**env, "FAKE_ALWAYS_FAIL": "1"}  # the fake's own switch: no input of the plan
    from_record = _run(args, failing, tmp_path)
    assert not _records(env)
    cold = {**failing, "XDG_CACHE_HOME": str(tmp_path / "cold")}
    assert _run(args, {**env, "XDG_CACHE_HOME": cold["XDG_CACHE_HOME"]}, tmp_path)[0] == 0  # same history
    for record in _records(cold):
        record.unlink()  # but no record: attempt 1 planned
    from_plan = _run(args, cold, tmp_path)
    assert from_record[0] == from_plan[0] != 0
    assert _ours(from_record[2]) == _ours(from_plan[2])
    assert any("attempt 1 failed" in line for line in _ours(from_record[2]))


@pytest.mark.slow
def test_an_exec_failure_of_a_record_s_binary_is_reported_by_the_full_path(
    shimmed: tuple[dict[str, str], list[str]], tmp_path: Path
) -> None:
    env, args = shimmed
    assert _run(args, env, tmp_path)[0] == 0
    shim = Path(env["SAFE_LLAMA_BIN_DIR"]) / "llama-completion"
    os.chmod(shim, 0o644)
    code, _, err, _ = _run(args, env, tmp_path)
    assert code == 126 and "not executable" in err


def test_the_host_figures_are_probe_host_s() -> None:
    from safe_llama.device.probe_host import read_meminfo, read_rlimit_as

    total, available = early.meminfo() or (0, 0)
    probed = read_meminfo()
    assert probed is not None and total == probed[0] and abs(available - probed[1]) < 1 << 30
    assert early.address_space_unlimited() == (read_rlimit_as() is None)


def test_a_record_someone_else_can_write_is_not_read(tmp_path: Path) -> None:
    import marshal

    from safe_llama.trust import SHAPES

    def typed(kind: type | tuple[type, ...]) -> object:
        first = kind[0] if isinstance(kind, tuple) else kind
        return first()

    record = {name: typed(kind) for name, kind in SHAPES["launch"].items()} | {"format": early.FORMAT}
    path = tmp_path / "r.marshal"
    path.write_bytes(marshal.dumps(record))
    path.chmod(0o600)
    assert early.load(str(path)) == record
    path.chmod(0o620)
    assert early.load(str(path)) is None
    path.chmod(0o600)
    path.write_bytes(marshal.dumps(record | {"format": early.FORMAT + 1}))
    assert early.load(str(path)) is None
    path.write_bytes(marshal.dumps(record))
    link = tmp_path / "link.marshal"
    link.symlink_to(path)
    assert early.load(str(link)) is None


def test_the_early_start_imports_nothing_heavy(tmp_path: Path) -> None:
    """A lookup that finds no record costs the interpreter's start, a stat and hashlib (a few ms): signal
    and the rest of the child's set-up come only with a record to start from."""
    code = (
        "import os, sys; before = set(sys.modules); from safe_llama.remembered import early; "
        "early.start('safe-llama', ['completion', '-m', 'x'], os.environ); "
        "print(sorted(m for m in set(sys.modules) - before if not m.startswith('safe_llama')))"
    )
    env = {**os.environ, "XDG_CACHE_HOME": str(tmp_path), "PYTHONPATH": str(ROOT)}
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, check=True)
    heavy = {"enum", "signal", "subprocess", "dataclasses", "typing", "pathlib", "json", "re", "collections"}
    assert not heavy & set(eval(done.stdout)), done.stdout  # noqa: S307 -- our own repr of a list


def test_other_launches_are_read_from_the_ledger_only_where_it_holds_an_entry(tmp_path: Path) -> None:
    """No entry in any ledger folder: no other launch, and the ledger (json, dataclasses, the device limits) is
    not imported; an entry of a live launch: the ledger reads it, as the plan did when the record was made."""
    code = (
        "import json, os, sys; from safe_llama.remembered import early; "
        "print(json.dumps([early.other_launches(os.environ), 'safe_llama.device.ledger' in sys.modules]))"
    )
    run = tmp_path / "run"
    env = {**os.environ, "XDG_RUNTIME_DIR": str(run), "PYTHONPATH": str(ROOT)}
    env.pop("RUNTIME_DIRECTORY", None)
    folder = run / "safe-llama" / "ledger"
    folder.mkdir(parents=True)
    run.chmod(0o700)
    (folder / "notes.txt").write_text("not an entry")
    system = "/run/safe-llama/ledger"
    if os.path.isdir(system) and any(name.endswith(".json") for name in os.listdir(system)):
        pytest.skip("the services' ledger of this machine holds entries")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, check=True)
    assert json.loads(done.stdout) == ["", False]
    other = subprocess.Popen(["sleep", "30"])
    try:
        from safe_llama.device.ledger import start_time

        start = start_time(other.pid)
        entry = {"pid": other.pid, "start": start, "tool": "server", "label": "x", "state": "ready", "device": "GPU-1",
                 "device_name": "CUDA0", "device_bytes": 1, "host_bytes": 1, "cgroup": ""}  # fmt: skip
        (folder / f"{other.pid}.json").write_text(json.dumps(entry))
        (folder / f"{other.pid}.json").chmod(0o600)
        done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, check=True)
        assert json.loads(done.stdout) == [f"{other.pid}:{start}:GPU-1", True]
    finally:
        other.kill()
        other.wait()


@pytest.mark.slow
def test_output_written_before_the_supervisor_is_imported_is_relayed_whole_and_in_order(
    shimmed: tuple[dict[str, str], list[str]], tmp_path: Path
) -> None:
    """The child writes more than a pipe holds before the supervisor can read: it waits, nothing is lost."""
    env, args = shimmed
    assert _run(args, env, tmp_path)[0] == 0
    plans = _plans(env)
    count = 20000  # about 180 KiB on each stream
    code, out, err, _ = _run(args, {**env, "SHIM_FLOOD": str(count)}, tmp_path)
    assert code == 0 and _plans(env) == plans  # started early
    lines = err.splitlines()
    flood = [line for line in lines if line.startswith("err ")]
    assert flood == [f"err {n}" for n in range(count)]
    assert out.splitlines()[:count] == [f"out {n}" for n in range(count)]
    assert lines.index(_ours(err)[0]) < lines.index("err 0")  # safe-llama's lines first, as before a spawn


def _serve_until_ready(args: list[str], env: dict[str, str]) -> tuple[bool, str]:
    """`safe-llama server ARGS` (its --port among them, the same each time: the record is keyed on the words)
    until /health answers 200 or it exits, then SIGTERM: (ready, stderr)."""
    port = int(args[args.index("--port") + 1])
    proc = subprocess.Popen([sys.executable, "-m", "safe_llama", "server", *args], env=env, cwd=ROOT,
                            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)  # fmt: skip
    ready = False
    deadline = time.monotonic() + 120
    try:
        while time.monotonic() < deadline and proc.poll() is None and not ready:
            ready = healthy(port)
            time.sleep(0.05)
        before, settle = {p: p.stat().st_mtime_ns for p in _records(env)}, time.monotonic() + 5
        while {p: p.stat().st_mtime_ns for p in _records(env)} == before and time.monotonic() < settle:
            time.sleep(0.05)  # safe-llama's own readiness check, then its record (none when it started early)
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    return ready, err.decode(errors="replace")


@pytest.mark.slow
def test_a_gpu_launch_starts_early_while_its_free_memory_is_within_the_margin(
    tmp_path: Path, clean_env: dict[str, str]
) -> None:
    """On the fake H200 (tests/fakes/fake_cuda_llama.py: its llama-server and NVML, no NVIDIA GPU here): the first
    `server -c 2000000 -ngl 99` plans to what NVML says is free and records it; the second starts from the record
    (its record not rewritten, the same argv); with 8 GiB less free (beyond the plan's 2%) the third plans again."""
    from tests.attempts.test_shared_gpu_retry import _machine
    from tests.fakes.fake_cuda_llama import build_nvml
    from tests.tiny_gguf import write_tiny_gguf

    big = write_tiny_gguf(tmp_path / "big.gguf", n_layer=8, n_head=16, n_head_kv=16, head_dim=256, n_ff=64,
                          n_ctx_train=2_000_000, sparse=True)  # fmt: skip
    gpu = _machine(tmp_path, clean_env, build_nvml(tmp_path / "nvml").parent)
    gpu.free_file.write_text("60610")
    args = ["-m", str(big), "-c", "2000000", "-ngl", "99", "--port", str(free_port())]

    def serve() -> tuple[list[str], dict[str, int]]:
        ready, err = _serve_until_ready(args, gpu.env)
        assert ready, err
        records = {p.name: p.stat().st_mtime_ns for p in _records(gpu.env)}
        return gpu.starts()[-1], records

    first, recorded = serve()
    assert len(recorded) == 1
    record = early.load(str(_records(gpu.env)[0]))
    assert record is not None
    assert list(record["device"][:3]) == ["nvml", "GPU-12c88ba7-4229-5615-d2f3-4c8f50f61e5b", 60610 << 20]
    second, again = serve()
    assert second == first and again == recorded  # from the record: not planned, not rewritten
    gpu.free_file.write_text(str(60610 - 8192))
    third, replanned = serve()
    assert replanned != recorded and third != first  # planned again, to less memory


def test_a_record_of_the_format_before_the_ledger_s_figures_is_refused(tmp_path: Path) -> None:
    """Format 2 kept no ledger figures (book): such a record is not read (an early start would write no entry)."""
    import marshal

    from safe_llama.trust import SHAPES

    def typed(kind: type | tuple[type, ...]) -> object:
        first = kind[0] if isinstance(kind, tuple) else kind
        return first()

    current = {name: typed(kind) for name, kind in SHAPES["launch"].items()} | {"format": early.FORMAT}
    path = tmp_path / "r.marshal"
    for old in ({**current, "format": 2}, {k: v for k, v in current.items() if k != "book"} | {"format": 2}):
        path.write_bytes(marshal.dumps(old))
        path.chmod(0o600)
        assert early.load(str(path)) is None
    assert early.FORMAT > 2


GOOD_BOOK = ("model m.gguf", "GPU-1", "CUDA0", 5 << 30, 300 << 20, "/sys/fs/cgroup/x")


@pytest.mark.parametrize(
    ("book", "booked"),
    [
        pytest.param(GOOD_BOOK, GOOD_BOOK, id="as-written"),
        pytest.param(list(GOOD_BOOK), GOOD_BOOK, id="a-list"),
        pytest.param(GOOD_BOOK[:5], None, id="a-field-short"),
        pytest.param((*GOOD_BOOK, 1), None, id="a-field-more"),
        pytest.param(("model\nx", *GOOD_BOOK[1:]), None, id="unprintable-label"),
        pytest.param(("m" * 257, *GOOD_BOOK[1:]), None, id="label-too-long"),
        pytest.param((*GOOD_BOOK[:3], -1, *GOOD_BOOK[4:]), None, id="negative-bytes"),
        pytest.param((*GOOD_BOOK[:3], 1 << 62, *GOOD_BOOK[4:]), None, id="bytes-too-large"),
        pytest.param((*GOOD_BOOK[:4], True, GOOD_BOOK[5]), None, id="bool-bytes"),
        pytest.param((*GOOD_BOOK[:5], 7), None, id="cgroup-not-text"),
        pytest.param("abcdef", None, id="a-string"),
    ],
)
def test_a_record_s_ledger_figures_are_read_within_the_ledger_s_bounds(book: object, booked: object) -> None:
    assert early.booking({"book": book}) == booked


class _Free:
    """A GPU reading that answers `free` and notes, when asked, whether the child had been spawned by then."""

    def __init__(self, free: int, spawned: list[int]) -> None:
        self.free, self.spawned = free, spawned
        self.asked_after: list[int] = []

    def result(self) -> int:
        self.asked_after.append(len(self.spawned))
        return self.free

    def cancel(self) -> None:
        pass


def _gpu_record(tmp_path: Path, tool: str) -> dict[str, Any]:
    """A record whose every rule but the GPU's holds here, for a binary that talks at once and then waits."""
    binary = tmp_path / "talks-then-waits"
    binary.write_text("#!/bin/sh\necho the ahead start spoke\necho and on stderr >&2\nexec sleep 30\n")
    binary.chmod(0o755)
    return {"salt": b"s" * 16, "files": [], "contents": [], "env": [], "env_present": [], "env_prefixes": [],
            "host": None, "cgroup": None, "others": "", "binary": str(binary), "argv": [], "extra_env": {},
            "tool": tool, "status": "planned", "counters": [], "book": GOOD_BOOK, "lines": [],
            "device": ("nvml", "GPU-1", 60 << 30, 1 << 30)}  # fmt: skip


@pytest.fixture
def spawns(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """The pids early's starts spawn (its cache folder one with no ledger: no other launches)."""
    from safe_llama.process import fork_exec

    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    pids: list[int] = []
    real = fork_exec.spawn_on_pipes

    def spawn(*args: Any, **kwargs: Any) -> Any:
        started = real(*args, **kwargs)
        pids.append(started[0].pid)
        return started

    monkeypatch.setattr(fork_exec, "spawn_on_pipes", spawn)
    return pids


def test_a_server_starts_while_its_gpu_reading_answers(tmp_path: Path, spawns: list[int]) -> None:
    """The server's child is spawned before the reading is collected (NVML's tens of ms overlap its start)."""
    reading = _Free(60 << 30, spawns)
    started = early._start("safe-llama", [], os.environ, _gpu_record(tmp_path, "server"), "r", reading)  # type: ignore[arg-type]
    assert started is not None and reading.asked_after == [1]
    from safe_llama.process import fork_exec

    child = started.started
    fork_exec.kill_unseen(fork_exec.Proc(child.pid), child.stdout_src, child.stderr_src)
    fork_exec.restore_mask(child.mask_before)


def test_a_server_started_ahead_of_a_reading_that_says_no_is_killed_unseen(
    tmp_path: Path, spawns: list[int], capfd: pytest.CaptureFixture[str]
) -> None:
    """8 GiB less free than planned (the margin is 1 GiB): the child started ahead is killed and reaped, and
    nothing it wrote reaches safe-llama's output; the normal path then plans."""
    reading = _Free(52 << 30, spawns)
    record = _gpu_record(tmp_path, "server")
    assert early._start("safe-llama", [], os.environ, record, "r", reading) is None  # type: ignore[arg-type]
    assert reading.asked_after == [1] and len(spawns) == 1
    with pytest.raises(ProcessLookupError):  # reaped: not even a zombie
        os.kill(spawns[0], 0)
    out, err = capfd.readouterr()
    assert "spoke" not in out and "stderr" not in err


def test_any_other_tool_starts_only_once_its_gpu_reading_holds(tmp_path: Path, spawns: list[int]) -> None:
    """llama-cli and llama-completion read the user's stdin: nothing is started ahead of the reading."""
    for tool in ("cli", "completion"):
        reading = _Free(52 << 30, spawns)
        assert early._start("safe-llama", [], os.environ, _gpu_record(tmp_path, tool), "r", reading) is None  # type: ignore[arg-type]
        assert reading.asked_after == [0] and not spawns


@pytest.mark.slow
def test_an_early_start_whose_log_was_cut_short_runs_again_from_the_plan(
    tmp_path: Path, llama_bin: Path, bundled_model: Path, clean_env: dict[str, str]
) -> None:
    """Attempt 1 started from the record and its log was cut short (attempts/test_launch.py's CUT_SHIM): the full
    path plans and runs the same argv again, and the record stays (nothing says the plan was wrong)."""
    from tests import FIXTURES
    from tests.attempts.test_launch import CUT_SHIM

    bin_dir, runs, cut_once = tmp_path / "bin", tmp_path / "runs", tmp_path / "cut-once"
    bin_dir.mkdir()
    shim = bin_dir / "llama-completion"
    shim.write_text(CUT_SHIM.format(runs=runs, cut_once=cut_once, real=llama_bin / "llama-completion",
                                    fixture=FIXTURES / "logs" / "completion-log-cut.log"))  # fmt: skip
    shim.chmod(0o755)
    env = {**clean_env, "XDG_CACHE_HOME": str(tmp_path / "cache"), "SAFE_LLAMA_BIN_DIR": str(bin_dir)}
    args = ["completion", "-m", str(bundled_model), "-c", "512", "-n", "2", "-p", "hi", "-no-cnv", "--seed", "1"]
    cut_once.touch()  # the first launch runs the real binary: it plans and writes its record
    assert _run(args, env, tmp_path)[0] == 0
    assert len(_records(env)) == 1
    cut_once.unlink()
    code, _, err, _ = _run(args, env, tmp_path)
    assert code == 0, err[-2000:]
    assert sum("before llama.cpp's log said why" in line for line in _ours(err)) == 1, _ours(err)
    assert len(set(runs.read_text().splitlines())) == 1 and len(runs.read_text().splitlines()) == 3
    assert len(_records(env)) == 1
