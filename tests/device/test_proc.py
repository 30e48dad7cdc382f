"""proc.run_capture: real short processes, no shell, nothing left behind after a timeout."""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

import pytest

from safe_llama.constants import GUARD_ENV
from safe_llama.device.proc import run_capture
from safe_llama.errors import ExitStatus, SafeLlamaError


def test_captures_both_streams_and_the_exit_status() -> None:
    done = run_capture(
        [sys.executable, "-c", "import sys; print('out'); print('err', file=sys.stderr); sys.exit(3)"], env=os.environ
    )
    assert (done.returncode, done.stdout, done.stderr, done.timed_out) == (3, "out\n", "err\n", False)


def test_arguments_reach_the_program_unchanged() -> None:
    nasty = "$(touch /tmp/pwned); rm -rf ~ 'quoted' \"double\"\nnew line *"
    done = run_capture(["printf", "%s", nasty], env=os.environ)
    assert done.stdout == nasty


def test_environment_is_exactly_the_one_given_plus_the_guard() -> None:
    """Nothing leaks from safe-llama's own environment; the guard marks the child as safe-llama's."""
    done = run_capture(["/usr/bin/env"], env={"ONLY": "this"})
    assert sorted(done.stdout.splitlines()) == ["ONLY=this", f"{GUARD_ENV}={os.getpid()}"]


def test_invalid_utf8_is_replaced_not_fatal() -> None:
    done = run_capture([sys.executable, "-c", "import sys; sys.stdout.buffer.write(b'a\\xffb')"], env=os.environ)
    assert done.stdout == "a\ufffdb"


def test_signal_death_is_a_negative_status() -> None:
    done = run_capture(
        [sys.executable, "-c", "import os, signal; os.kill(os.getpid(), signal.SIGABRT)"], env=os.environ
    )
    assert done.returncode == -6


def test_missing_program_is_127() -> None:
    with pytest.raises(SafeLlamaError) as err:
        run_capture(["/nonexistent/llama-server", "--list-devices"], env=os.environ)
    assert err.value.status == ExitStatus.NOT_FOUND
    assert "/nonexistent/llama-server" in err.value.message


def test_not_executable_is_126(tmp_path: Path) -> None:
    script = tmp_path / "llama-server"
    script.write_text("#!/bin/sh\n")
    script.chmod(0o644)
    with pytest.raises(SafeLlamaError) as err:
        run_capture([script], env=os.environ)
    assert err.value.status == ExitStatus.NOT_EXECUTABLE


@pytest.mark.slow
def test_timeout_kills_the_whole_group(tmp_path: Path) -> None:
    pid_file = tmp_path / "grandchild.pid"
    # A child that starts a grandchild and waits, as llama-cli does with its llama-server.
    code = (
        "import subprocess, sys, time\n"
        "p = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)'])\n"
        f"open({str(pid_file)!r}, 'w').write(str(p.pid))\n"
        "time.sleep(60)\n"
    )
    started = time.monotonic()
    done = run_capture([sys.executable, "-c", code], env=os.environ, timeout=2.0)
    assert done.timed_out
    assert time.monotonic() - started < 10
    grandchild = int(pid_file.read_text())
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline:
        try:
            os.kill(grandchild, 0)
        except ProcessLookupError:
            break
        # It may linger as a zombie of its dead parent until init reaps it.
        status = Path(f"/proc/{grandchild}/stat")
        if status.exists() and status.read_text().split(")")[-1].split()[0] == "Z":
            break
        time.sleep(0.05)
    else:
        pytest.fail(f"grandchild {grandchild} survived the timeout")
