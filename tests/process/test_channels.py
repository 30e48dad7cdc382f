"""process.channels: what a failed exec means (the program named, 127 not found, 126 not executable), and the child
started on pipes (stdout and stderr apart, or one pipe for one file) or on a pty of its own, with tiny
/bin/sh children; closing gives the terminal back as it was; no start where a PATH shim led back to safe-llama."""

from __future__ import annotations

import errno
import os
import select
import termios
from collections.abc import Iterator
from pathlib import Path

import pytest

from safe_llama.constants import GUARD_ENV
from safe_llama.errors import ExitStatus, SafeLlamaError
from safe_llama.process.channels import Child, check_not_nested, spawn_error
from safe_llama.process.relay import Relay, Stream

ENV = {"PATH": "/usr/bin:/bin"}


@pytest.mark.parametrize(
    ("err", "status", "said"),
    [
        pytest.param(FileNotFoundError(errno.ENOENT, "x"), ExitStatus.NOT_FOUND, "not found", id="enoent"),
        pytest.param(OSError(errno.ENOENT, "x"), ExitStatus.NOT_FOUND, "not found", id="enoent-oserror"),
        pytest.param(OSError(errno.ENOTDIR, "x"), ExitStatus.NOT_FOUND, "not found", id="enotdir"),
        pytest.param(
            OSError(errno.EACCES, "x"), ExitStatus.NOT_EXECUTABLE, "cannot execute: not executable", id="eacces"
        ),
        pytest.param(
            OSError(errno.EPERM, "x"), ExitStatus.NOT_EXECUTABLE, "cannot execute: not executable", id="eperm"
        ),
        pytest.param(
            OSError(errno.ENOEXEC, "Exec format error"),
            ExitStatus.NOT_EXECUTABLE,
            "cannot execute: Exec format error",
            id="enoexec",
        ),
        pytest.param(OSError(0, ""), ExitStatus.NOT_EXECUTABLE, "cannot execute: [Errno 0] ", id="no-reason"),
    ],
)
def test_spawn_error_names_the_program(err: OSError, status: ExitStatus, said: str) -> None:
    error = spawn_error("/opt/bin/llama-server", err)
    assert error.message == f"safe-llama: /opt/bin/llama-server: {said}"
    assert error.status == status and int(error.status) in (126, 127)


def _drain(relay: Relay) -> None:
    """Everything the child wrote to this relay's source until it closed, passed on to the relay's sink."""
    assert relay.src is not None
    while True:
        select.select([relay.src], [], [], 5)
        try:
            chunk = os.read(relay.src, 65536)
        except BlockingIOError:
            continue
        except OSError as err:  # a pty's master once the child's side is gone
            assert err.errno == errno.EIO
            return
        if not chunk:
            return
        relay.push(chunk)


@pytest.fixture
def outputs(tmp_path: Path) -> Iterator[tuple[int, int]]:
    out = os.open(tmp_path / "out", os.O_WRONLY | os.O_CREAT, 0o600)
    err = os.open(tmp_path / "err", os.O_WRONLY | os.O_CREAT, 0o600)
    yield out, err
    os.close(out)
    os.close(err)


def test_pipes_keep_stdout_and_stderr_apart(tmp_path: Path, outputs: tuple[int, int]) -> None:
    child = Child(["/bin/sh", "-c", "echo out; echo err >&2; exit 3"], ENV, use_pty=False, fds=(0, *outputs))
    child.start(None)
    assert child.proc is not None and child.master is None and child.input_relay is None
    assert [r.stream for r in child.relays] == [Stream.STDOUT, Stream.STDERR]
    for relay in child.relays:
        _drain(relay)
    assert child.proc.wait() == 3
    child.close()
    assert all(r.src is None for r in child.relays)
    assert (tmp_path / "out").read_bytes() == b"out\n"
    assert (tmp_path / "err").read_bytes() == b"err\n"


def test_one_file_for_both_is_one_pipe(tmp_path: Path, outputs: tuple[int, int]) -> None:
    out, _ = outputs
    child = Child(["/bin/sh", "-c", "echo a; echo b >&2; echo c"], ENV, use_pty=False, fds=(0, out, out))
    child.start(None)
    assert [r.stream for r in child.relays] == [Stream.COMBINED]
    _drain(child.relays[0])
    assert child.proc is not None and child.proc.wait() == 0
    child.close()
    assert (tmp_path / "out").read_bytes() == b"a\nb\nc\n"  # in the order written


@pytest.mark.parametrize("use_pty", [False, True], ids=["pipes", "pty"])
def test_a_missing_program_is_named(tmp_path: Path, use_pty: bool) -> None:
    user, tty = os.openpty()
    try:
        child = Child([str(tmp_path / "no-such-llama")], ENV, use_pty=use_pty, fds=(tty, tty, tty))
        with pytest.raises(SafeLlamaError) as caught:
            child.start(None)
        assert caught.value.message == f"safe-llama: {tmp_path / 'no-such-llama'}: not found"
        assert caught.value.status == ExitStatus.NOT_FOUND and child.proc is None
        child.close()
        assert child.master is None
    finally:
        os.close(user)
        os.close(tty)


def test_a_file_without_exec_permission_is_not_executable(tmp_path: Path, outputs: tuple[int, int]) -> None:
    program = tmp_path / "llama-server"
    program.write_text("#!/bin/sh\necho hi\n")
    program.chmod(0o644)
    child = Child([str(program)], ENV, use_pty=False, fds=(0, *outputs))
    with pytest.raises(SafeLlamaError) as caught:
        child.start(None)
    assert caught.value.message == f"safe-llama: {program}: cannot execute: not executable"
    assert caught.value.status == ExitStatus.NOT_EXECUTABLE
    assert child.relays == []  # the pipes were closed with the failure


def test_a_pty_child_gets_a_terminal_and_the_users_is_raw_until_closed(tmp_path: Path) -> None:
    user, tty = os.openpty()  # the user's terminal: the wrapper's stdin and stdout
    err = os.open(tmp_path / "err", os.O_WRONLY | os.O_CREAT, 0o600)  # stderr not a terminal: a pipe of its own
    try:
        script = "test -t 0 && test -t 1 && echo on-a-tty; test -t 2 || echo err-apart >&2"
        child = Child(["/bin/sh", "-c", script], ENV, use_pty=True, fds=(tty, tty, err))
        child.start(None)
        assert child.master is not None and child.terminal is not None
        assert [r.stream for r in child.relays] == [Stream.COMBINED, Stream.STDERR]
        assert child.relays[0].src == child.master
        assert child.input_relay is not None and child.input_relay.src == tty
        assert not termios.tcgetattr(tty)[3] & termios.ICANON  # raw while the child runs
        for relay in child.relays:
            _drain(relay)
        assert child.proc is not None and child.proc.wait() == 0
        child.close()
        assert termios.tcgetattr(tty)[3] & termios.ICANON  # restored
        assert child.master is None
        assert (tmp_path / "err").read_bytes() == b"err-apart\n"
        select.select([user], [], [], 5)
        assert b"on-a-tty" in os.read(user, 4096)  # through the relay to the user's terminal
    finally:
        os.close(err)
        os.close(user)
        os.close(tty)


def test_a_pty_child_with_a_terminal_for_stderr_has_one_relay() -> None:
    user, tty = os.openpty()
    try:
        child = Child(["/bin/sh", "-c", "echo x >&2"], ENV, use_pty=True, fds=(tty, tty, tty))
        child.start(None)
        assert [r.stream for r in child.relays] == [Stream.COMBINED]
        _drain(child.relays[0])
        assert child.proc is not None and child.proc.wait() == 0
        child.close()
        select.select([user], [], [], 5)
        assert b"x" in os.read(user, 4096)
    finally:
        os.close(user)
        os.close(tty)


def test_check_not_nested() -> None:
    check_not_nested({})
    with pytest.raises(SafeLlamaError) as err:
        check_not_nested({GUARD_ENV: "123"})
    assert err.value.status == ExitStatus.NOT_FOUND and "123" in err.value.message
