"""Tests for safe_llama/process/signals.py through supervise_child(): forwarding each signal once, Ctrl-C, job control,
the child's empty signal mask and its death with the wrapper (behaviours 1-6).

The wrapper runs as a process of its own (tests/process/supervision.py) so that signals, terminals and SIGKILL
can be aimed at it; the child is the FAKE llama.cpp, which logs the signals it gets.
"""

from __future__ import annotations

import json
import os
import shlex
import signal
import subprocess
import termios
import time
from pathlib import Path
from typing import Any

import pexpect
import pytest

from tests.process.supervision import (
    alive,
    child_pid,
    driver_argv,
    driver_env,
    fake,
    in_pty,
    lflag,
    log_lines,
    run_driver,
    spawned,
    state,
    wait_for,
)

# ---------------------------------------------------------------------------------------------------
# 1-3: signals
# ---------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("to_group", [False, True], ids=["to-wrapper", "to-its-group"])
def test_1_each_signal_reaches_the_child_exactly_once(scripts: dict[str, Path], tmp_path: Path, to_group: bool) -> None:
    """Sent to the wrapper's pid, or to its whole process group (`kill -SIG -PGID`): once either way."""
    log, out = tmp_path / "signals.log", tmp_path / "outcome.json"
    argv = driver_argv(scripts, {"out": str(out)}, *fake(scripts, "signals", str(log)))
    sent = [signal.SIGUSR1, signal.SIGUSR2, signal.SIGHUP, signal.SIGINT, signal.SIGQUIT, signal.SIGTERM]
    with spawned(argv, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, start_new_session=True) as proc:
        pid = child_pid(log)
        assert os.getpgid(pid) == pid != os.getpgid(proc.pid)  # a group of its own
        for n, signo in enumerate(sent, start=1):
            os.killpg(proc.pid, signo) if to_group else proc.send_signal(signo)
            wait_for(lambda: len(log_lines(log)) >= n + 1, what=f"{signo.name} logged")  # noqa: B023 - used at once
        assert proc.wait(timeout=10) == 0
    assert log_lines(log)[1:] == [*(s.name[3:] for s in sent), "shutdown"]
    outcome = json.loads(out.read_text())
    assert outcome["signals_forwarded"] == [int(s) for s in sent]
    assert outcome["user_stop_signal"] == signal.SIGHUP  # the first stop request; never retried
    assert outcome["failure"] is None and outcome["retry"] is False


@pytest.mark.slow
def test_2_ctrl_c_in_pipe_mode_reaches_the_child_once_from_the_terminal(
    scripts: dict[str, Path], tmp_path: Path
) -> None:
    # A terminal on stdin, stdout to a file: pipe mode; the child's group holds the terminal's foreground,
    # so ^C reaches it from the terminal, as it reaches a bare llama-cli, and the wrapper does not see it.
    log, out = tmp_path / "signals.log", tmp_path / "outcome.json"
    opts = {"out": str(out), "stdout_to": str(tmp_path / "stdout")}
    with in_pty(driver_argv(scripts, opts, *fake(scripts, "signals", str(log)))) as term:
        pid = child_pid(log)
        assert os.getpgid(pid) == pid != os.getpgid(term.pid)
        assert os.tcgetpgrp(term.child_fd) == pid
        term.sendintr()
        wait_for(lambda: "INT" in log_lines(log), what="INT logged")
        time.sleep(0.3)  # a double forward would show up by now
        term.kill(signal.SIGTERM)
        term.expect(pexpect.EOF)
        term.wait()
    assert log_lines(log)[1:] == ["INT", "TERM", "shutdown"]
    outcome = json.loads(out.read_text())
    assert outcome["used_pty"] is False
    assert outcome["signals_forwarded"] == [signal.SIGTERM]
    assert outcome["user_stop_signal"] == signal.SIGTERM


@pytest.mark.slow
def test_2_ctrl_c_with_the_terminal_not_on_stdin_is_forwarded_once(scripts: dict[str, Path], tmp_path: Path) -> None:
    # The terminal is only the controlling one: its ^C reaches the wrapper's group, the wrapper forwards it.
    log, out = tmp_path / "signals.log", tmp_path / "outcome.json"
    opts = {"out": str(out), "stdout_to": str(tmp_path / "stdout"), "stdin_null": True}
    with in_pty(driver_argv(scripts, opts, *fake(scripts, "signals", str(log)))) as term:
        child_pid(log)
        term.sendintr()
        wait_for(lambda: "INT" in log_lines(log), what="INT logged")
        time.sleep(0.3)
        term.kill(signal.SIGTERM)
        term.expect(pexpect.EOF)
        term.wait()
    assert log_lines(log)[1:] == ["INT", "TERM", "shutdown"]
    outcome = json.loads(out.read_text())
    assert outcome["signals_forwarded"] == [signal.SIGINT, signal.SIGTERM]
    assert outcome["exit_code"] == 0


@pytest.mark.slow
def test_1_timeout_sends_one_sigterm(scripts: dict[str, Path], tmp_path: Path) -> None:
    # coreutils timeout signals its child, then its whole process group: the child must get one.
    log, out = tmp_path / "signals.log", tmp_path / "outcome.json"
    argv = [
        "timeout",
        "-s",
        "TERM",
        "1.5",
        *driver_argv(scripts, {"out": str(out)}, *fake(scripts, "signals", str(log))),
    ]
    proc = subprocess.run(argv, env=driver_env(), stdin=subprocess.DEVNULL, timeout=30, check=False)
    assert proc.returncode == 124  # timeout's own "timed out"
    assert log_lines(log)[1:] == ["TERM", "shutdown"]
    assert json.loads(out.read_text())["exit_code"] == 0


def test_1_shell_job_kill_sends_one_sigterm(scripts: dict[str, Path], tmp_path: Path) -> None:
    # bash's `kill %1` signals the job's process group.
    log, out = tmp_path / "signals.log", tmp_path / "outcome.json"
    command = " ".join(
        shlex.quote(a) for a in driver_argv(scripts, {"out": str(out)}, *fake(scripts, "signals", str(log)))
    )
    script = (
        f"set -m; {command} </dev/null & "
        f"for i in $(seq 200); do grep -q ready {shlex.quote(str(log))} 2>/dev/null && break; sleep 0.05; done; "
        "kill %1; wait %1; echo rc=$?"
    )
    proc = subprocess.run(["bash", "-c", script], env=driver_env(), capture_output=True, timeout=30, check=False)
    assert b"rc=0" in proc.stdout
    assert log_lines(log)[1:] == ["TERM", "shutdown"]


def test_2_ctrl_c_in_pty_mode_is_the_byte(scripts: dict[str, Path], tmp_path: Path) -> None:
    log, out = tmp_path / "signals.log", tmp_path / "outcome.json"
    with in_pty(driver_argv(scripts, {"out": str(out)}, *fake(scripts, "tty", str(log)))) as term:
        term.expect("ready")
        term.sendcontrol("c")  # 0x03 through our raw terminal, the child's pty makes it a SIGINT
        term.expect("got INT")
        term.sendline("quit")
        term.expect(pexpect.EOF)
        term.wait()
    assert log_lines(log)[1:] == ["INT"]
    outcome = json.loads(out.read_text())
    assert outcome["used_pty"] is True and outcome["signals_forwarded"] == []
    assert outcome["user_stop_signal"] == signal.SIGINT  # seen as a key: never a retry
    assert outcome["exit_code"] == 0


def test_3_stop_while_loading_is_forwarded_and_never_a_retry(scripts: dict[str, Path], tmp_path: Path) -> None:
    log, out = tmp_path / "log", tmp_path / "outcome.json"
    argv = driver_argv(scripts, {"out": str(out), "probe": "completion"}, *fake(scripts, "loading", str(log)))
    with spawned(argv, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL) as proc:
        child_pid(log)
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=10) == 128 + signal.SIGTERM
    outcome = json.loads(out.read_text())
    assert outcome["ready"] is False and outcome["signals_forwarded"] == [signal.SIGTERM]
    assert outcome["user_stop_signal"] == signal.SIGTERM
    assert outcome["failure"] is None and outcome["retry"] is False


def test_3_memory_line_printed_on_the_way_out_of_a_user_stop_is_not_retried(
    scripts: dict[str, Path], tmp_path: Path
) -> None:
    log, out = tmp_path / "log", tmp_path / "outcome.json"
    argv = driver_argv(scripts, {"out": str(out)}, *fake(scripts, "loading", str(log), "alloc-on-term"))
    with spawned(argv, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE) as proc:
        child_pid(log)
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=10) == 1
        assert proc.stderr is not None and b"insufficient memory" in proc.stderr.read()
    outcome = json.loads(out.read_text())
    assert outcome["user_stop_signal"] == signal.SIGTERM
    assert outcome["failure"] is None and outcome["retry"] is False


# ---------------------------------------------------------------------------------------------------
# 4-6: job control, signal mask, the wrapper's death
# ---------------------------------------------------------------------------------------------------


def test_4_ctrl_z_suspends_and_resume_resizes(scripts: dict[str, Path], tmp_path: Path) -> None:
    log, out = tmp_path / "log", tmp_path / "outcome.json"
    with in_pty(driver_argv(scripts, {"out": str(out)}, *fake(scripts, "tty", str(log)))) as term:
        term.expect("size 24x80")
        term.expect("ready")
        child = child_pid(log)
        wait_for(lambda: not lflag(term.child_fd) & termios.ICANON, what="raw terminal")
        term.sendcontrol("z")
        wait_for(lambda: state(term.pid) == "T" and state(child) == "T", what="both stopped")
        assert lflag(term.child_fd) & termios.ICANON and lflag(term.child_fd) & termios.ECHO  # usable
        term.setwinsize(40, 120)
        os.kill(term.pid, signal.SIGCONT)  # what the shell's `fg` does
        term.expect("size 40x120")
        assert state(child) != "T"
        wait_for(lambda: not lflag(term.child_fd) & termios.ICANON, what="raw again")
        term.sendline("still here")
        term.expect("line still here")
        term.sendline("quit")
        term.expect(pexpect.EOF)
        term.wait()
    assert term.exitstatus == 0
    assert json.loads(out.read_text())["tty_restored"] is True


def test_4_sigtstp_to_the_wrapper_in_pty_mode(scripts: dict[str, Path], tmp_path: Path) -> None:
    log, out = tmp_path / "log", tmp_path / "outcome.json"
    with in_pty(driver_argv(scripts, {"out": str(out)}, *fake(scripts, "tty", str(log)))) as term:
        term.expect("ready")
        child = child_pid(log)
        os.kill(term.pid, signal.SIGTSTP)
        wait_for(lambda: state(term.pid) == "T" and state(child) == "T", what="both stopped")
        assert lflag(term.child_fd) & termios.ICANON
        os.kill(term.pid, signal.SIGCONT)
        term.expect("cont")
        term.sendline("quit")
        term.expect(pexpect.EOF)
        term.wait()
    assert json.loads(out.read_text())["exit_code"] == 0


@pytest.mark.slow
@pytest.mark.parametrize("pty_mode", [False, True], ids=["pipes", "pty"])
def test_4_job_control_in_an_interactive_shell(scripts: dict[str, Path], tmp_path: Path, pty_mode: bool) -> None:
    log, out = tmp_path / "log", tmp_path / "outcome.json"
    opts: dict[str, Any] = {"out": str(out)} if pty_mode else {"out": str(out), "stdout_to": str(tmp_path / "so")}
    child = fake(scripts, "tty", str(log)) if pty_mode else fake(scripts, "signals", str(log))
    command = " ".join(shlex.quote(arg) for arg in driver_argv(scripts, opts, *child))
    env = {**driver_env(), "PS1": "PROMPT$ "}
    shell = pexpect.spawn("bash", ["--norc", "--noprofile", "-i"], env=env, dimensions=(24, 80), timeout=20)
    wrapper = 0
    try:
        shell.expect("PROMPT\\$ ")
        shell.sendline(command)
        pid = child_pid(log)
        wrapper = int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])  # its parent
        if pty_mode:
            shell.expect("ready")
        shell.sendcontrol("z")
        shell.expect("Stopped")
        shell.expect("PROMPT\\$ ")
        wait_for(lambda: state(wrapper) == "T" and state(pid) == "T", what="both stopped")
        shell.setwinsize(30, 100)
        shell.sendline("fg")
        if pty_mode:
            shell.expect("size 30x100")
            shell.sendline("quit")
        else:
            wait_for(lambda: state(pid) != "T" and state(wrapper) != "T", what="running again")
            os.kill(wrapper, signal.SIGTERM)
        shell.expect("PROMPT\\$ ")
        shell.sendline("exit")
        shell.expect(pexpect.EOF)
    finally:
        shell.close(force=True)
        if wrapper and alive(wrapper):  # a failed test must not leave the job behind (its child dies with it)
            os.kill(wrapper, signal.SIGKILL)
    outcome = json.loads(out.read_text())
    assert outcome["exit_code"] == 0 and outcome["used_pty"] is pty_mode
    if pty_mode:
        assert outcome["tty_restored"] is True


def test_5_child_starts_with_an_empty_signal_mask(scripts: dict[str, Path], tmp_path: Path) -> None:
    direct = subprocess.run(fake(scripts, "sigmask"), capture_output=True, check=True, stdin=subprocess.DEVNULL)
    _, stdout, _, _ = run_driver(scripts, tmp_path, fake(scripts, "sigmask"))
    assert stdout == direct.stdout
    assert b"SigBlk:\t0000000000000000" in stdout


@pytest.mark.parametrize("pty_mode", [False, True], ids=["pipes", "pty"])
def test_6_sigkill_of_the_wrapper_kills_the_child(scripts: dict[str, Path], tmp_path: Path, pty_mode: bool) -> None:
    log, out = tmp_path / "log", tmp_path / "outcome.json"
    argv = driver_argv(scripts, {"out": str(out)}, *fake(scripts, "sleep", str(log)))
    if pty_mode:
        with in_pty(argv) as term:
            child = child_pid(log)
            term.kill(signal.SIGKILL)
            wait_for(lambda: not alive(child), timeout=1.5, what="child gone")
    else:
        with spawned(argv, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL) as proc:
            child = child_pid(log)
            proc.kill()
            wait_for(lambda: not alive(child), timeout=1.5, what="child gone")
