"""Tests for safe_llama/process/handed.py: the hand-off's words read and checked (fast), and the handed supervisor
for real (the CPU build's llama-server, the bundled model): the same pid, its command line the small process's,
less memory; each signal forwarded once; the exit codes; llama-server's output after the hand-off passed on."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from safe_llama.process.handed import CODE, read_words
from tests import ROOT
from tests.llama_run import free_port, healthy

HANDED = "from safe_llama.entry import handed"


def _pipe_fd() -> int:
    read_end, write_end = os.pipe()
    os.close(write_end)
    return read_end


def test_the_words_are_read() -> None:
    fd = _pipe_fd()
    child = subprocess.Popen(["sleep", "5"])
    try:
        handed = read_words(
            [f"pid={child.pid}", "tool=llama-server", f"source={fd}", "source=-", "kill_after=5.0",
             "last_forward=15:12.5", "mask=-", "since=100.25", "counter=3=/proc/vmstat oom_kill", "health_path=/health",
             "health_host=127.0.0.1", "health_port=8080"]
        )  # fmt: skip
    finally:
        os.close(fd)
        child.kill()
        child.wait()
    assert (handed.pid, handed.tool, handed.sources, handed.kill_after) == (child.pid, "llama-server", [fd, None], 5.0)
    assert handed.last_forward == (15, 12.5) and handed.counters == {"/proc/vmstat oom_kill": 3}
    assert handed.health is not None and (handed.health.host, handed.health.port) == ("127.0.0.1", 8080)


@pytest.mark.parametrize(
    "words",
    [
        pytest.param(["pid=0", "tool=x", "source=-", "kill_after=5"], id="pid-0"),
        pytest.param([f"pid={os.getppid()}", "tool=x", "source=-", "kill_after=5"], id="pid-not-a-child"),
        pytest.param(["pid=12", "tool=x", "source=1", "kill_after=5"], id="source-below-3"),
        pytest.param(["pid=12", "tool=x", "source=999", "kill_after=5"], id="source-not-open"),
        pytest.param(["pid=12", "tool=x", "source=-", "kill_after=nan"], id="kill-after-nan"),
        pytest.param(["pid=12", "tool=x", "source=-"], id="no-kill-after"),
        pytest.param(["pid=12", "pid=13", "tool=x", "source=-", "kill_after=5"], id="twice"),
        pytest.param(["pid=12", "tool=x", "source=-", "kill_after=5", "group=relative/dir"], id="relative-group"),
        pytest.param(["pid=12", "tool=x\n", "source=-", "kill_after=5"], id="unprintable"),
        pytest.param(["pid=12", "tool=x", "source=-", "kill_after=5", "api_key=s"], id="unknown"),
        pytest.param(["pid"] * 65, id="too-many"),
    ],
)
def test_a_bad_word_is_refused(words: list[str]) -> None:
    with pytest.raises(ValueError, match="hand-off"):
        read_words(words)


def test_the_words_of_a_hand_off_at_the_spawn_are_read() -> None:
    """start=1 needs the /health address and what to say at ready; at most two ready actions, absolute paths."""
    fd = _pipe_fd()
    child = subprocess.Popen(["sleep", "5"])
    base = [f"pid={child.pid}", "tool=llama-server", f"source={fd}", "kill_after=5.0", "health_path=/health",
            "health_host=127.0.0.1", "health_port=8080"]  # fmt: skip
    try:
        handed = read_words([*base, "start=1", "status=ready (attempt 1)", "at_ready=/c/plans/x.json",
                             "at_ready=/run/ledger/12.json"])  # fmt: skip
        assert (handed.start, handed.status) == (True, "ready (attempt 1)")
        assert handed.at_ready == ["/c/plans/x.json", "/run/ledger/12.json"]
        assert read_words(base).start is False
        for bad in (["start=1"], ["start=1", "status=ready", "at_ready=relative/x.json"],
                    ["start=1", "status=ready", "at_ready=/a", "at_ready=/b", "at_ready=/c"]):  # fmt: skip
            with pytest.raises(ValueError, match="hand-off"):
                read_words([*base, *bad] if bad != ["start=1"] else [w for w in base if "health" not in w] + bad)
    finally:
        os.close(fd)
        child.kill()
        child.wait()


def test_the_small_process_is_started_by_the_door() -> None:
    assert CODE.endswith(f"{HANDED}; handed()")


# ---------------------------------------------------------------------------------------------------
# the real thing
# ---------------------------------------------------------------------------------------------------


def _cmdline(pid: int) -> str:
    return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")


def _charge(pid: int, resident: str = "RssAnon") -> int:
    """KiB: RssAnon (or VmRSS) + VmPTE, as benchmarks/bench_supervisor_memory.py reads them."""
    fields = dict(line.split(":", 1) for line in Path(f"/proc/{pid}/status").read_text().splitlines() if ":" in line)
    return int(fields[resident].split()[0]) + int(fields["VmPTE"].split()[0])


def _bare_python() -> int:
    """KiB: VmRSS + VmPTE of this interpreter at the start of `python3 -c pass` (held on a pipe to be read)."""
    proc = subprocess.Popen([sys.executable, "-c", "import os; os.read(0, 1)"], stdin=subprocess.PIPE)
    try:
        time.sleep(0.5)
        return _charge(proc.pid, "VmRSS")
    finally:
        assert proc.stdin is not None
        proc.stdin.close()
        proc.wait(30)


@contextmanager
def _server(
    llama_bin: Path, model: Path, env: dict[str, str], *words: str, tool_words: tuple[str, ...] = ()
) -> Iterator[tuple[subprocess.Popen[bytes], int]]:
    port = free_port()
    argv = ["server", "-m", str(model), "-c", "2048", "--port", str(port), *tool_words]
    proc = subprocess.Popen(
        [sys.executable, "-m", "safe_llama", *words, *argv],
        env={**env, "SAFE_LLAMA_BIN_DIR": str(llama_bin), "PYTHONPATH": str(ROOT)},
        stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE, cwd=ROOT,
    )  # fmt: skip
    try:
        deadline = time.monotonic() + 60
        while not healthy(port) and proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.05)
        assert proc.poll() is None, proc.communicate(timeout=30)
        if "--no-hand-off" not in words:
            while HANDED not in _cmdline(proc.pid) and time.monotonic() < deadline:
                time.sleep(0.05)
        yield proc, port
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate(timeout=30)


def _child(proc: subprocess.Popen[bytes]) -> int:
    return int(Path(f"/proc/{proc.pid}/task/{proc.pid}/children").read_text().split()[0])


@pytest.mark.slow
def test_the_hand_off_keeps_the_pid_and_frees_the_memory(
    llama_bin: Path, bundled_model: Path, clean_env: dict[str, str], tmp_path: Path
) -> None:
    env = {**clean_env, "XDG_CACHE_HOME": str(tmp_path)}
    with _server(llama_bin, bundled_model, env, "--no-hand-off") as (full, _):
        time.sleep(1.0)
        assert HANDED not in _cmdline(full.pid)
        full_charge = _charge(full.pid)
        full.send_signal(signal.SIGTERM)
        full.communicate(timeout=30)
    with _server(llama_bin, bundled_model, env) as (proc, _):
        child = _child(proc)
        assert HANDED in _cmdline(proc.pid)  # the same pid (Popen's), now the small process
        assert int(Path(f"/proc/{child}/stat").read_text().rsplit(")", 1)[1].split()[1]) == proc.pid  # its parent
        time.sleep(1.0)
        handed_charge, handed_total = _charge(proc.pid), _charge(proc.pid, "VmRSS")
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=30)
    assert proc.returncode == 0, err[-2000:]
    assert handed_charge < full_charge - 5 * 1024, (handed_charge, full_charge)
    bare = _bare_python()
    assert handed_total - bare <= 8 * 1024, (handed_total, bare)  # issue 37: at most 8 MiB over a bare interpreter
    print(
        f"KiB once ready: RssAnon+VmPTE full {full_charge}, handed {handed_charge}; VmRSS+VmPTE handed {handed_total}"
    )


@pytest.mark.slow
@pytest.mark.parametrize(
    ("signo", "code"), [(signal.SIGTERM, 0), (signal.SIGINT, 0), (signal.SIGHUP, 128 + signal.SIGHUP)]
)
def test_a_signal_reaches_llama_server_once_and_its_exit_code_is_kept(
    signo: int, code: int, llama_bin: Path, bundled_model: Path, clean_env: dict[str, str], tmp_path: Path
) -> None:
    """llama-server ends at its first SIGTERM or SIGINT (0) and at a second one says `Received second interrupt`
    and exits 1: one forward each. It has no SIGHUP handler: 129."""
    with _server(llama_bin, bundled_model, {**clean_env, "XDG_CACHE_HOME": str(tmp_path)}) as (proc, _):
        proc.send_signal(signo)
        _, err = proc.communicate(timeout=30)
    text = err.decode(errors="replace")
    assert proc.returncode == code, text[-2000:]
    assert "second interrupt" not in text


@pytest.mark.slow
def test_a_kill_of_llama_server_is_judged_and_its_code_kept(
    llama_bin: Path, bundled_model: Path, clean_env: dict[str, str], tmp_path: Path
) -> None:
    with _server(llama_bin, bundled_model, {**clean_env, "XDG_CACHE_HOME": str(tmp_path)}) as (proc, _):
        child = _child(proc)
        os.kill(child, signal.SIGKILL)
        _, err = proc.communicate(timeout=30)
    text = err.decode(errors="replace")
    assert proc.returncode == 128 + signal.SIGKILL
    assert f"safe-llama: llama-server (pid {child}) was killed by SIGKILL (no evidence of OOM" in text, text[-2000:]


@pytest.mark.slow
def test_output_after_the_hand_off_is_passed_on(
    llama_bin: Path, bundled_model: Path, clean_env: dict[str, str], tmp_path: Path
) -> None:
    with _server(llama_bin, bundled_model, {**clean_env, "XDG_CACHE_HOME": str(tmp_path)}) as (proc, port):
        body = b'{"prompt": "Hello", "n_predict": 4}'
        request = urllib.request.Request(f"http://127.0.0.1:{port}/completion", body)
        with urllib.request.urlopen(request, timeout=60) as answer:  # noqa: S310 (loopback http)
            assert answer.status == 200
        time.sleep(0.5)
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=30)
    lines = err.decode().splitlines()
    served = [i for i, line in enumerate(lines) if "print_timing" in line]
    assert served and any("release" in line for line in lines[served[-1] :]), lines[-20:]
    assert lines[-1].endswith("cleaning up before exit..."), lines[-5:]
    llama_lines = [line for line in lines if not line.startswith("safe-llama: ")]
    assert all(line[:1].isdigit() or not line for line in llama_lines[-40:]), llama_lines[-40:]


@pytest.mark.slow
def test_a_stopped_llama_server_is_said_and_a_stop_ends_it(
    llama_bin: Path, bundled_model: Path, clean_env: dict[str, str], tmp_path: Path
) -> None:
    """A SIGSTOP not ours after the hand-off: said in one line (messages.py imported only then), and a SIGTERM to
    safe-llama then gets llama-server SIGCONT, so it ends (as the full supervisor does)."""
    with _server(llama_bin, bundled_model, {**clean_env, "XDG_CACHE_HOME": str(tmp_path)}) as (proc, _):
        child = _child(proc)
        os.kill(child, signal.SIGSTOP)
        time.sleep(0.5)
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=30)
    text = err.decode(errors="replace")
    assert f"safe-llama: llama-server (pid {child}) is stopped (SIGSTOP): it does nothing" in text, text[-2000:]
    assert proc.returncode == 0, text[-2000:]


@pytest.mark.slow
def test_no_secret_is_on_the_small_process_command_line(
    llama_bin: Path, bundled_model: Path, clean_env: dict[str, str], tmp_path: Path
) -> None:
    """The hand-off passes no word of llama-server's: a key given on safe-llama's command line (which every user
    can read) is not on the small process's."""
    secret = "s3cr3t-key-value"  # noqa: S105 -- a test value, looked for where it must not be
    env = {**clean_env, "XDG_CACHE_HOME": str(tmp_path)}
    with _server(llama_bin, bundled_model, env, tool_words=("--api-key", secret)) as (proc, _):
        assert HANDED in _cmdline(proc.pid) and secret not in _cmdline(proc.pid)
        proc.send_signal(signal.SIGTERM)
        proc.communicate(timeout=30)
    assert proc.returncode == 0


def _imported(importtime: str) -> set[str]:
    return {line.rsplit("|", 1)[1].strip() for line in importtime.splitlines() if line.startswith("import time: ")}


# what the handed supervisor must not import while llama-server runs (each a MiB or more; its end may)
HEAVY = ("typing", "dataclasses", "json", "re", "ctypes", "threading", "pathlib", "subprocess", "http.client")


@pytest.mark.slow
def test_the_handed_supervisor_imports_only_what_it_needs(
    llama_bin: Path, bundled_model: Path, clean_env: dict[str, str], tmp_path: Path
) -> None:
    """`-X importtime` (PYTHONPROFILEIMPORTTIME, which the exec keeps) of the small process, read while it runs."""
    port, log = free_port(), tmp_path / "stderr"
    argv = ["server", "-m", str(bundled_model), "-c", "2048", "--port", str(port)]
    env = {**clean_env, "XDG_CACHE_HOME": str(tmp_path), "SAFE_LLAMA_BIN_DIR": str(llama_bin),
           "PYTHONPATH": str(ROOT), "PYTHONPROFILEIMPORTTIME": "1"}  # fmt: skip
    with log.open("wb") as err:
        proc = subprocess.Popen([sys.executable, "-m", "safe_llama", *argv], env=env, stdin=subprocess.DEVNULL,
                                stdout=subprocess.DEVNULL, stderr=err, cwd=ROOT)  # fmt: skip
        try:
            deadline = time.monotonic() + 60
            while HANDED not in _cmdline(proc.pid) and proc.poll() is None and time.monotonic() < deadline:
                time.sleep(0.05)
            time.sleep(1.0)
            running = log.read_text(errors="replace")
        finally:
            proc.send_signal(signal.SIGTERM)
            proc.wait(30)
    assert running.count("import time: self") == 2, running[-2000:]  # the full process's, then the small one's
    bare = subprocess.run([sys.executable, "-c", "pass"], env=env, capture_output=True, text=True, check=True).stderr
    modules = _imported(running.split("import time: self")[2]) - _imported(bare)  # the interpreter's own start aside
    assert "safe_llama.process.handed" in modules
    assert not modules & set(HEAVY), sorted(modules & set(HEAVY))
    assert not any(m.startswith(("safe_llama.plan", "safe_llama.device", "safe_llama.pipeline")) for m in modules)


@pytest.mark.slow
def test_the_handed_supervisor_feeds_the_watchdog_while_healthy_and_says_stopping(
    llama_bin: Path, bundled_model: Path, clean_env: dict[str, str], tmp_path: Path
) -> None:
    """systemd's side after the hand-off (a datagram receiver stands in for it, tests/process/test_sdnotify.py):
    WATCHDOG=1 every half WATCHDOG_USEC while /health answers 200, none while llama-server is stopped, STOPPING=1
    last."""
    from tests.process.test_sdnotify import Receiver

    address = str(tmp_path / "notify")
    rx = Receiver(address)
    env = {**clean_env, "XDG_CACHE_HOME": str(tmp_path), "NOTIFY_SOCKET": address, "WATCHDOG_USEC": "1000000"}
    try:
        with _server(llama_bin, bundled_model, env) as (proc, _):
            assert HANDED in _cmdline(proc.pid)
            before = rx.names().count("WATCHDOG")
            time.sleep(2.2)
            assert rx.names().count("WATCHDOG") - before >= 3
            child = _child(proc)
            os.kill(child, signal.SIGSTOP)
            time.sleep(1.2)  # a check in flight when it stopped may still answer
            stopped = rx.names().count("WATCHDOG")
            time.sleep(2.5)
            assert rx.names().count("WATCHDOG") == stopped
            os.kill(child, signal.SIGCONT)
            time.sleep(1.5)
            assert rx.names().count("WATCHDOG") > stopped
            proc.send_signal(signal.SIGTERM)
            proc.communicate(timeout=30)
            assert proc.returncode == 0
        time.sleep(0.3)
    finally:
        rx.close()
    assert rx.names()[-1] == "STOPPING"
