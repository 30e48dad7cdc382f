"""The one door for running a short helper process and capturing its output.

Owns subprocess use for short, bounded commands (`llama-server --list-devices`, `--version`); never a
shell. Must not launch or supervise llama.cpp for real work: the launcher owns that.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from safe_llama.constants import GUARD_ENV
from safe_llama.errors import ExitStatus, SafeLlamaError


@dataclass(frozen=True)
class Captured:
    """What a finished helper printed. `returncode` < 0 means killed by signal -returncode."""

    returncode: int
    stdout: str
    stderr: str
    timed_out: bool = False


def run_capture(
    argv: Sequence[str | os.PathLike[str]],
    *,
    env: Mapping[str, str],
    timeout: float = 10.0,
) -> Captured:
    """Run argv (no shell, stdin from /dev/null) and return its exit status and decoded output.

    The helper gets its own session so that a timeout kills everything it started (llama-cli starts a
    llama-server of its own), not only the first process. A missing or non-executable program raises
    SafeLlamaError with the shell's codes 127/126 and the path in the message.
    """
    import subprocess  # here: a launch whose probes are all cached never needs it before the spawn

    args = [os.fspath(a) for a in argv]
    try:
        child = subprocess.Popen(
            args,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            env={**env, GUARD_ENV: str(os.getpid())},
            start_new_session=True,
        )
    except FileNotFoundError:
        raise SafeLlamaError(f"safe-llama: {args[0]}: not found", ExitStatus.NOT_FOUND) from None
    except PermissionError:
        raise SafeLlamaError(f"safe-llama: {args[0]}: not executable", ExitStatus.NOT_EXECUTABLE) from None
    timed_out = False
    try:
        out, err = child.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        timed_out = True
        _kill_group(child.pid)
        out, err = child.communicate()
    except BaseException:
        _kill_group(child.pid)
        child.wait()
        raise
    return Captured(
        returncode=child.returncode,
        stdout=out.decode("utf-8", errors="replace"),
        stderr=err.decode("utf-8", errors="replace"),
        timed_out=timed_out,
    )


def _kill_group(pid: int) -> None:
    import signal  # here: a plan whose probes are cached runs no helper

    # The group may already be gone; that is the outcome we wanted.
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pid, signal.SIGKILL)


def run_module(module: str, env: Mapping[str, str], *, timeout: float) -> Captured:
    """`python -m MODULE` of this package in a child (a probe whose driver may crash or hang), with `env` as
    its whole environment and this package importable whatever PYTHONPATH says."""
    import sys
    from pathlib import Path

    package_root = str(Path(__file__).resolve().parent.parent.parent)
    child_env = dict(env)
    child_env["PYTHONPATH"] = os.pathsep.join(filter(None, [package_root, env.get("PYTHONPATH")]))
    return run_capture([sys.executable, "-m", module], env=child_env, timeout=timeout)
