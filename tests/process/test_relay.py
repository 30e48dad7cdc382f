"""Tests for safe_llama/process/relay.py through supervise_child(): every byte passes unchanged and at once, on pipes or
through a pty of the terminal's size, and the terminal is restored on every way out (behaviours 11-14).

The wrapper runs as a process of its own (tests/process/supervision.py); the child is the FAKE llama.cpp, which
writes every byte value, floods, trickles and reads raw keys on demand.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from pathlib import Path

import pexpect
import pytest

from tests.process.supervision import alive, child_pid, driver_argv, driver_env, fake, in_pty, run_driver, spawned

# ---------------------------------------------------------------------------------------------------
# 11-14: bytes
# ---------------------------------------------------------------------------------------------------


def test_11_all_256_byte_values_pass_unchanged_on_both_streams(scripts: dict[str, Path], tmp_path: Path) -> None:
    rc, stdout, stderr, outcome = run_driver(scripts, tmp_path, fake(scripts, "bytes"))
    data = bytes(range(256)) * 64
    assert rc == 0 and outcome["used_pty"] is False
    assert stdout == data
    assert stderr == data[::-1]


def test_11_stdin_bytes_and_eof_reach_the_child(scripts: dict[str, Path], tmp_path: Path) -> None:
    data = bytes(range(256)) * 4096  # 1 MiB, every value, \r\n and NUL included
    rc, stdout, stderr, _ = run_driver(scripts, tmp_path, fake(scripts, "cat"), stdin=data)
    assert rc == 7  # the child exits after EOF
    assert stdout == data
    assert stderr == b"EOF\n"


def test_11_no_terminal_in_pipe_mode(scripts: dict[str, Path], tmp_path: Path) -> None:
    (tmp_path / "log").touch()
    _, stdout, _, outcome = run_driver(scripts, tmp_path, fake(scripts, "tty", str(tmp_path / "log")))
    assert stdout.startswith(b"tty False False False\r\n")
    assert outcome["used_pty"] is False


def test_13_a_megabyte_without_newline_then_exit_loses_nothing(scripts: dict[str, Path], tmp_path: Path) -> None:
    rc, stdout, _, _ = run_driver(scripts, tmp_path, fake(scripts, "big"))
    assert rc == 0
    assert stdout == b"x" * (1 << 20) + b"END"


@pytest.mark.slow
def test_13_a_byte_is_visible_at_once(scripts: dict[str, Path], tmp_path: Path) -> None:
    argv = driver_argv(scripts, {"out": str(tmp_path / "o.json")}, *fake(scripts, "trickle"))
    with spawned(argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE) as proc:
        assert proc.stdout is not None
        started = time.monotonic()
        assert os.read(proc.stdout.fileno(), 10) == b"A"  # while the child sleeps 3 s before "B"
        assert time.monotonic() - started < 2.0
        assert proc.stdout.read() == b"B"


def test_14_stderr_stays_separate(scripts: dict[str, Path], tmp_path: Path) -> None:
    rc, stdout, _, _ = run_driver(scripts, tmp_path, fake(scripts, "interleave"), stderr=subprocess.DEVNULL)
    assert rc == 0
    assert stdout == "".join(f"o{i}\n" for i in range(200)).encode()


def test_14_two_to_one_keeps_the_childs_order(scripts: dict[str, Path], tmp_path: Path) -> None:
    out = tmp_path / "o.json"
    proc = subprocess.run(
        driver_argv(scripts, {"out": str(out)}, *fake(scripts, "interleave")),
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        env=driver_env(),
        timeout=30,
        check=True,
    )
    assert proc.stdout == "".join(f"o{i}\ne{i}\n" for i in range(200)).encode()


def test_13_a_reader_that_goes_away_gives_the_child_sigpipe(scripts: dict[str, Path], tmp_path: Path) -> None:
    out = tmp_path / "o.json"
    argv = driver_argv(scripts, {"out": str(out)}, *fake(scripts, "flood"))
    with spawned(argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL) as proc:
        assert proc.stdout is not None
        os.read(proc.stdout.fileno(), 10)
        proc.stdout.close()
        assert proc.wait(timeout=10) == 128 + signal.SIGPIPE  # as if it had written to the pipe itself
    assert json.loads(out.read_text())["returncode"] == -signal.SIGPIPE


# ---------------------------------------------------------------------------------------------------
# 12-13: the terminal
# ---------------------------------------------------------------------------------------------------


def test_12_pty_has_the_terminals_size_and_follows_sigwinch(scripts: dict[str, Path], tmp_path: Path) -> None:
    log, out = tmp_path / "log", tmp_path / "outcome.json"
    with in_pty(driver_argv(scripts, {"out": str(out)}, *fake(scripts, "tty", str(log))), rows=33, cols=101) as term:
        term.expect("tty True True True")
        term.expect("size 33x101")
        term.expect("ready")
        term.setwinsize(50, 160)
        term.expect("size 50x160")
        term.sendline("quit")
        term.expect(pexpect.EOF)
        term.wait()
    outcome = json.loads(out.read_text())
    assert outcome["used_pty"] is True and outcome["tty_restored"] is True


@pytest.mark.slow
def test_12_raw_passthrough_with_no_escape_character(scripts: dict[str, Path], tmp_path: Path) -> None:
    (tmp_path / "log").touch()
    out = tmp_path / "outcome.json"
    with in_pty(driver_argv(scripts, {"out": str(out)}, *fake(scripts, "tty", str(tmp_path / "log"), "raw"))) as term:
        term.expect("ready")
        for key in (b"\x1d", b"\x03", b"\x1a", b"\x1c", b"\x04", b"\xff", b"\r"):  # ^] ^C ^Z ^\ ^D
            term.send(key)
            term.expect(f"key {key.hex()}")
        term.send(b"q")
        term.expect(pexpect.EOF)
        term.wait()
    assert term.exitstatus == 0
    assert json.loads(out.read_text())["tty_restored"] is True


def test_12_terminal_restored_when_launch_raises(scripts: dict[str, Path], tmp_path: Path) -> None:
    log, out = tmp_path / "log", tmp_path / "outcome.json"
    opts = {"out": str(out), "raise_in_watcher": True}
    with in_pty(driver_argv(scripts, opts, *fake(scripts, "tty", str(log)))) as term:
        term.expect(pexpect.EOF)
        term.wait()
    outcome = json.loads(out.read_text())
    assert outcome == {"exception": "watcher failed", "tty_restored": True}
    assert not alive(child_pid(log))  # the child did not outlive the loop


def test_13_pty_output_at_exit_is_not_lost(scripts: dict[str, Path], tmp_path: Path) -> None:
    with in_pty(driver_argv(scripts, {"out": str(tmp_path / "o.json")}, *fake(scripts, "big"))) as term:
        term.expect(pexpect.EOF, timeout=30)
        term.wait()
        received = term.before
    assert received == b"x" * (1 << 20) + b"END"
