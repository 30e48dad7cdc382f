"""The child's set-up between fork and exec, seen from inside the child: a Python script reports its
process group, signal mask and dispositions, open descriptors and environment."""

from __future__ import annotations

import errno
import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from safe_llama.constants import GUARD_ENV
from safe_llama.process import fork_exec

REPORT = """
import json, os, signal, sys
try:
    stdin_open = bool(os.fstat(0))
except OSError:
    stdin_open = False
fds = sorted(int(fd) for fd in os.listdir("/proc/self/fd"))
print(json.dumps({
    "pgid": os.getpgrp(), "pid": os.getpid(),
    "mask": sorted(int(s) for s in signal.pthread_sigmask(signal.SIG_BLOCK, [])),
    "env": os.environ.get("ONLY"), "fds": fds, "stdin_open": stdin_open,
}))
sys.stderr.write("to stderr\\n")
"""


def _read_all(fd: int) -> bytes:
    out = b""
    while chunk := os.read(fd, 65536):
        out += chunk
    os.close(fd)
    return out


def test_the_child_gets_its_own_group_an_empty_mask_and_no_stray_descriptor(tmp_path: Path) -> None:
    stray = os.open(tmp_path, os.O_RDONLY)  # inheritable: Popen's close_fds closes it, so must spawn
    os.set_inheritable(stray, True)
    old = signal.pthread_sigmask(signal.SIG_BLOCK, [signal.SIGUSR1])
    try:
        proc, out, err = fork_exec.spawn_on_pipes(
            [sys.executable, "-c", REPORT], {"ONLY": "this", "PATH": os.environ["PATH"]}, (0, 1, 2), None
        )
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, old)
        os.close(stray)
    assert err is not None  # pytest's stdout and stderr are not one file here
    report = json.loads(_read_all(out))
    assert _read_all(err) == b"to stderr\n"
    assert proc.wait() == 0
    assert report["pgid"] == report["pid"] == proc.pid
    assert report["mask"] == []
    assert report["env"] == "this"
    assert stray not in report["fds"] and set(report["fds"]) <= {0, 1, 2, 3}  # 3: listdir's own


def test_one_pipe_when_stdout_and_stderr_are_one_file(tmp_path: Path) -> None:
    log = os.open(tmp_path / "log", os.O_WRONLY | os.O_CREAT, 0o600)
    try:
        proc, out, err = fork_exec.spawn_on_pipes([sys.executable, "-c", REPORT], dict(os.environ), (0, log, log), None)
    finally:
        os.close(log)
    assert err is None
    data = _read_all(out)
    assert data.endswith(b"to stderr\n") and proc.wait() == 0


@pytest.mark.parametrize(
    ("make", "code"),
    [
        pytest.param(lambda p: None, errno.ENOENT, id="missing"),
        pytest.param(lambda p: p.write_text("#!/bin/sh\n"), errno.EACCES, id="not-executable"),
    ],
)
def test_an_exec_failure_is_the_exec_s_errno_with_no_child_left(tmp_path: Path, make: object, code: int) -> None:
    target = tmp_path / "program"
    make(target)  # type: ignore[operator]
    with pytest.raises(OSError) as failed:
        fork_exec.spawn([str(target)], {}, (0, 1, 2), parent=os.getpid(), controlling_tty=False, foreground_fd=None)
    assert failed.value.errno == code
    with pytest.raises(ChildProcessError):
        os.waitpid(-1, os.WNOHANG)


def test_the_supervised_environment() -> None:
    env = {"A": "1", "NOTIFY_SOCKET": "/run/x", "WATCHDOG_USEC": "5", "WATCHDOG_PID": "1"}
    assert fork_exec.supervised_env(env, {"B": "2"}, 42) == {"A": "1", "B": "2", GUARD_ENV: "42"}


def test_sigpipe_and_sigxfsz_are_default_as_subprocess_leaves_them() -> None:
    """Python ignores SIGPIPE and SIGXFSZ; its children must not inherit that (subprocess restores them)."""
    assert signal.getsignal(signal.SIGPIPE) == signal.SIG_IGN
    proc, out, _ = fork_exec.spawn_on_pipes(["/bin/cat", "/proc/self/status"], {}, (0, 1, 2), None)
    status = dict(line.split(":\t", 1) for line in _read_all(out).decode().splitlines() if ":\t" in line)
    assert proc.wait() == 0
    ignored, blocked = int(status["SigIgn"], 16), int(status["SigBlk"], 16)
    for signo in (signal.SIGPIPE, signal.SIGXFSZ):
        assert not ignored & (1 << (signo - 1))
    assert blocked == 0


def test_a_closed_stdin_stays_closed_and_the_pipes_stay_above_2(tmp_path: Path) -> None:
    """Started with fd 0 closed (`<&-`): the child's stdin is left closed, as subprocess's stdin=None left it,
    and no pipe end lands on 0 (the child would read its own output)."""
    code = (
        "import os, sys, json; os.close(0); from safe_llama.process import fork_exec; "
        f"proc, out, err = fork_exec.spawn_on_pipes([sys.executable, '-c', {REPORT!r}], dict(os.environ), "
        "(None, 1, 2), None); data = b''\n"
        "while chunk := os.read(out, 65536): data += chunk\n"
        "print(json.dumps([out, json.loads(data)['stdin_open'], proc.wait()]))"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    out, stdin_open, status = json.loads(done.stdout)
    assert out > 2 and not stdin_open and status == 0


def _oom_score_of_child() -> int:
    proc, out, err = fork_exec.spawn_on_pipes(
        ["/bin/cat", "/proc/self/oom_score_adj"], {"PATH": os.environ["PATH"]}, (0, 1, 2), None
    )
    value = int(_read_all(out))
    if err is not None:
        _read_all(err)
    assert proc.wait() == 0
    return value


def test_the_child_is_the_oom_killer_s_choice_before_the_supervisor() -> None:
    """The child's oom_score_adj is the supervisor's raised by CHILD_OOM_SCORE_RAISE: seen by the child itself."""
    own = int(Path("/proc/self/oom_score_adj").read_text())
    assert _oom_score_of_child() == min(own + fork_exec.CHILD_OOM_SCORE_RAISE, 1000)


def test_a_supervisor_under_oom_score_adjust_gives_its_child_a_normal_score() -> None:
    """As under the shipped unit's OOMScoreAdjust=-1000 (set here in a forked supervisor where this process may
    lower it: CAP_SYS_RESOURCE, which this machine's root lacks; the guest test runs it under systemd): llama.cpp
    at 0, the supervisor never killed. A supervisor at 950 (raising needs no privilege): its child at 1000."""
    seen = {}
    for supervisor in (-1000, 950):
        read, write = os.pipe()
        pid = os.fork()
        if pid == 0:  # pragma: no cover -- the forked supervisor
            try:
                Path("/proc/self/oom_score_adj").write_text(str(supervisor))
                os.write(write, str(_oom_score_of_child()).encode())
            except PermissionError:
                os.write(write, b"not allowed")
            os._exit(0)
        os.close(write)
        seen[supervisor] = _read_all(read).decode()
        assert os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1]) == 0
    assert seen[950] == "1000"
    assert seen[-1000] in ("0", "not allowed")
    if seen[-1000] == "not allowed":
        pytest.skip("lowering oom_score_adj needs CAP_SYS_RESOURCE (the raise to 1000 was checked)")
