"""The hand-off at the spawn (attempts/at_spawn.py), with the real llama-server in a real 256 MiB memory cgroup and
the wide-KV model: the small handed supervisor supervises from before /health answers, the plan counts what that
gives back (a larger context than with the full supervisor kept), the server is ready (READY=1, the remembered plan
put in place) and serves a request that fills that context without an OOM kill; a start that fails goes back to
the full safe-llama, which retries. Needs permission to create a cgroup (root here): skipped where refused."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests import ROOT
from tests.llama_run import free_port, healthy
from tests.memory_group import memory_group, oom_kills
from tests.tiny_gguf import write_wide_kv_gguf

LIMIT = 256 << 20


@pytest.fixture
def group() -> Iterator[Path]:
    with memory_group(LIMIT) as folder:
        yield folder


def _children(pid: int) -> list[int]:
    try:
        return [int(p) for p in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()]
    except OSError:
        return []


def _cmdline(pid: int) -> list[str]:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace").split("\0")
    except OSError:
        return []


class Served:
    def __init__(self, proc: subprocess.Popen[bytes], port: int) -> None:
        self.proc, self.port = proc, port
        self.handed_before_health = False
        self.ready_said: list[bytes] = []
        self.ctx: int | None = None


def _serve(folder: Path, args: list[str], env: dict[str, str], notify: socket.socket) -> Served:
    """`safe-llama server ARGS --port P` inside the group, stdin no terminal, until /health answers 200."""

    def enter() -> None:
        (folder / "cgroup.procs").write_text(str(os.getpid()))

    port = free_port()
    proc = subprocess.Popen([sys.executable, "-m", "safe_llama", "server", *args, "--port", str(port)], env=env,
                            cwd=ROOT, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                            preexec_fn=enter)  # fmt: skip
    served = Served(proc, port)
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and proc.poll() is None:
        handed = "from safe_llama.entry import handed; handed()" in "\0".join(_cmdline(proc.pid))
        if healthy(port):
            break
        served.handed_before_health |= handed
        time.sleep(0.01)
    time.sleep(0.5)  # READY=1 follows /slots
    while True:
        try:
            served.ready_said.append(notify.recv(4096))
        except BlockingIOError:
            break
    for child in _children(proc.pid):
        words = _cmdline(child)
        if "-c" in words:
            served.ctx = int(words[words.index("-c") + 1])
    return served


def _stop(served: Served) -> tuple[int, str]:
    served.proc.send_signal(signal.SIGTERM)
    _, err = served.proc.communicate(timeout=60)
    return served.proc.returncode, err.decode(errors="replace")


def _plan_ctx(folder: Path, args: list[str], env: dict[str, str]) -> int:
    def enter() -> None:
        (folder / "cgroup.procs").write_text(str(os.getpid()))

    command = [sys.executable, "-m", "safe_llama", "plan", "--json", *args]
    done = subprocess.run(command, env=env, cwd=ROOT, stdin=subprocess.DEVNULL, capture_output=True, text=True,
                          preexec_fn=enter, timeout=120)  # fmt: skip
    assert done.returncode == 0, done.stderr
    argv = json.loads(done.stdout)["decision"]["argv"]
    return int(argv[argv.index("-c") + 1])


@pytest.fixture
def env(tmp_path: Path, llama_bin: Path, clean_env: dict[str, str]) -> Iterator[tuple[dict[str, str], socket.socket]]:
    notify = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    address = tmp_path / "notify"
    notify.bind(str(address))
    notify.setblocking(False)
    yield {**clean_env, "XDG_CACHE_HOME": str(tmp_path / "cache"), "SAFE_LLAMA_BIN_DIR": str(llama_bin),
           "NOTIFY_SOCKET": str(address)}, notify  # fmt: skip
    notify.close()


@pytest.mark.slow
def test_a_server_in_a_cgroup_hands_off_as_it_starts_and_serves_the_larger_context(
    group: Path, env: tuple[dict[str, str], socket.socket], tmp_path: Path
) -> None:
    environ, notify = env
    model = write_wide_kv_gguf(tmp_path)
    kept = _plan_ctx(group, ["server", "-m", str(model)], {**environ, "SAFE_LLAMA_HAND_OFF": "0"})
    planned = _plan_ctx(group, ["server", "-m", str(model)], environ)
    assert planned >= kept + 512  # the full supervisor's charge given back: here 13,056 against 12,288
    kills = oom_kills(group)
    served = _serve(group, ["-m", str(model)], environ, notify)
    try:
        assert served.proc.poll() is None and served.handed_before_health
        assert any(b"READY=1" in said and b"ready (attempt 1)" in said for said in served.ready_said)
        assert served.ctx is not None and served.ctx >= planned - 256
        cache = Path(environ["XDG_CACHE_HOME"])
        assert list((cache / "safe-llama" / "plans").glob("*.json"))  # the plan remembered, once ready
        assert not [p for p in cache.rglob("*") if p.name.endswith(".at-ready")]
        prompt = [300 + i % 25 for i in range(served.ctx - 16)]  # one cell each
        body = json.dumps({"prompt": prompt, "n_predict": 2, "cache_prompt": False}).encode()
        request = urllib.request.Request(f"http://127.0.0.1:{served.port}/completion", body,
                                         {"Content-Type": "application/json"})  # fmt: skip
        with urllib.request.urlopen(request, timeout=600) as answer:  # noqa: S310 (loopback http)
            assert answer.status == 200
        assert served.proc.poll() is None and oom_kills(group) == kills
    finally:
        code, err = _stop(served)
    assert code == 0, err[-2000:]
    assert [line for line in err.splitlines() if line.startswith("safe-llama:")]


LIMITED_ONCE = """#!/bin/sh
# the real llama-server; its first run (safe-llama's probes aside) under a 300,000 KiB address space, where its KV
# buffer cannot be allocated (`failed to allocate buffer of size 213909504`): a real failed start, exit 1
case "$1" in --version|--list-devices) exec "{real}" "$@" ;; esac
echo "$*" >>"{runs}"
if [ ! -e "{once}" ]; then
  : >"{once}"
  ulimit -v 300000
fi
exec "{real}" "$@"
"""


@pytest.mark.slow
def test_a_start_that_fails_after_the_hand_off_goes_back_to_the_full_launch_which_retries(
    group: Path, env: tuple[dict[str, str], socket.socket], tmp_path: Path, llama_bin: Path
) -> None:
    """The handed supervisor saw attempt 1 fail before it was ready: it execs the full safe-llama again (the same
    pid), which reads what the child said, plans smaller and starts attempt 2 under its own supervision."""
    environ, notify = env
    bin_dir, runs = tmp_path / "bin", tmp_path / "runs"
    bin_dir.mkdir()
    shim = bin_dir / "llama-server"
    shim.write_text(LIMITED_ONCE.format(real=llama_bin / "llama-server", runs=runs, once=tmp_path / "once"))
    shim.chmod(0o755)
    environ = {**environ, "SAFE_LLAMA_BIN_DIR": str(bin_dir)}
    model = write_wide_kv_gguf(tmp_path)
    served = _serve(group, ["-m", str(model)], environ, notify)
    try:
        assert served.proc.poll() is None, served.proc.stderr.read().decode() if served.proc.stderr else ""
        assert served.handed_before_health  # attempt 1 was handed off as it started
    finally:
        code, err = _stop(served)
    first, second = (line.split() for line in runs.read_text().splitlines())
    ctx = [int(words[words.index("-c") + 1]) for words in (first, second)]
    assert ctx[1] < ctx[0]
    ours = [line for line in err.splitlines() if line.startswith("safe-llama:")]
    assert any("attempt 1 failed" in line and "retrying" in line for line in ours), ours
    assert code == 0, err[-2000:]


@pytest.mark.parametrize(
    ("tool", "args", "hand_off", "door", "tty", "expected"),
    [
        pytest.param("server", ["-m", "m.gguf", "--port", "8080"], True, "safe-llama", False, True, id="a-service"),
        pytest.param("server", ["-m", "m.gguf"], True, "safe-llama", False, True, id="the-default-port"),
        pytest.param("server", ["-m", "m.gguf"], True, "safe-llama", True, False, id="stdin-a-terminal"),
        pytest.param("server", ["-m", "m.gguf"], False, "safe-llama", False, False, id="hand-off-off"),
        pytest.param("server", ["-m", "m.gguf"], True, None, False, False, id="no-door-to-go-back-to"),
        pytest.param("cli", ["-m", "m.gguf"], True, "safe-llama", False, False, id="not-a-server"),
        pytest.param("server", ["-m", "m.gguf", "--port", "0"], True, "safe-llama", False, False, id="port-0"),
        pytest.param(
            "server",
            ["-m", "m.gguf", "--ssl-key-file", "k", "--ssl-cert-file", "c"],
            True,
            "safe-llama",
            False,
            False,
            id="tls",
        ),
    ],
)
def test_who_hands_off_at_the_spawn(
    tool: str, args: list[str], hand_off: bool, door: str | None, tty: bool, expected: bool,
    monkeypatch: pytest.MonkeyPatch,
) -> None:  # fmt: skip
    """A server launched by safe-llama's door with no terminal on its stdin, plain HTTP on a known port or socket,
    the launcher's hand_off on (the plan then decides: a cgroup limit, the CPU)."""
    from safe_llama.attempts import at_spawn
    from safe_llama.pipeline.prepare import LaunchOptions

    monkeypatch.setattr(os, "isatty", lambda fd: tty)
    options = LaunchOptions(hand_off=hand_off)
    assert at_spawn.eligible(tool, args, {}, options, (door, args) if door else None) is expected


@pytest.mark.slow
def test_a_stop_asked_during_the_start_ends_it_with_the_child_s_code_and_no_retry(
    group: Path, env: tuple[dict[str, str], socket.socket], tmp_path: Path
) -> None:
    """SIGTERM while the handed supervisor watches the start-up: forwarded once, llama-server ends, and its code is
    safe-llama's (no way back to the full launch: nothing failed). A key on safe-llama's command line is not on the
    handed supervisor's (its way back keeps the argv in its environment, which only its user can read)."""
    environ, _ = env
    model = write_wide_kv_gguf(tmp_path)
    secret = "s3cr3t-key-value"  # noqa: S105 -- a test value, looked for where it must not be

    def enter() -> None:
        (group / "cgroup.procs").write_text(str(os.getpid()))

    port = str(free_port())
    command = [sys.executable, "-m", "safe_llama", "server", "-m", str(model), "--port", port, "--api-key", secret]
    proc = subprocess.Popen(command, env=environ, cwd=ROOT, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE, preexec_fn=enter)  # fmt: skip
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and "entry import handed" not in "\0".join(_cmdline(proc.pid)):
        time.sleep(0.002)
    assert proc.poll() is None
    handed = "\0".join(_cmdline(proc.pid))
    assert "entry import handed" in handed and secret not in handed
    children = _children(proc.pid)
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=60)
    text = err.decode(errors="replace")
    assert children and proc.returncode in (0, 128 + signal.SIGTERM), text[-2000:]
    assert "attempt 1 failed" not in text and "retrying" not in text
    left = [p.name for p in Path(environ["XDG_CACHE_HOME"]).rglob("*")]
    assert not [name for name in left if name.endswith(".at-ready") or name.startswith("resume-")], left


@pytest.mark.slow
def test_a_server_whose_slots_cannot_answer_is_ready_once_it_has_lived_the_settle_time(
    group: Path, env: tuple[dict[str, str], socket.socket], tmp_path: Path
) -> None:
    """With an API key /slots answers 401: the handed supervisor says READY=1 once the server has lived
    starting.SERVE_SETTLE seconds past /health 200, as the full supervisor does (readiness.HealthProbe)."""
    from safe_llama.process.starting import SERVE_SETTLE

    environ, notify = env
    model = write_wide_kv_gguf(tmp_path)
    served = _serve(group, ["-m", str(model), "--api-key", "k"], environ, notify)
    try:
        assert served.proc.poll() is None and served.handed_before_health
        deadline = time.monotonic() + SERVE_SETTLE + 5
        while not any(b"READY=1" in said for said in served.ready_said) and time.monotonic() < deadline:
            try:
                served.ready_said.append(notify.recv(4096))
            except BlockingIOError:
                time.sleep(0.05)
        assert any(b"READY=1" in said for said in served.ready_said)
    finally:
        code, err = _stop(served)
    assert code == 0, err[-2000:]
