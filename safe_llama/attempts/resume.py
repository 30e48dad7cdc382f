"""A server handed off as it started (attempts/at_spawn.py) whose start failed before it was ready: the handed
supervisor writes how the child ended and what it said while it started (process/starting.py's capture) into a
resume file, and execs the full safe-llama again, the same pid and words, with RESUME_ENV naming the file. That
launch reads it as attempt 1's outcome (run_attempts' first, as an early start's) and goes on as after any failed
attempt (it plans, learns, retries), with the full supervisor.

Owns the file (its words, its place: the cache folder, by pid), its reading and checks, and the exec back. write
and exec_full must stay light (os, sys, marshal): the handed supervisor runs them once its child has ended.
"""

from __future__ import annotations

import marshal
import os
import sys

from safe_llama.constants import RESUME_ENV

TYPE_CHECKING = False  # typing.TYPE_CHECKING without importing typing (mypy reads the name)
if TYPE_CHECKING:
    from collections.abc import Mapping, Sequence
    from typing import Any

    from safe_llama.diagnosis.signatures import SignatureTable
    from safe_llama.process.startup import Outcome

# the full safe-llama's own argv (argv[0] first) for the handed supervisor, in its environment, which only its user
# can read (its command line every user can, and the argv may hold a key): each word's bytes in hex, space-separated
ARGV_ENV = "SAFE_LLAMA_RESUME_ARGV"
FORMAT = 1
MOST_OUTPUT = 1 << 18  # bytes of one stream's capture (starting.CAPTURE)
MOST_EVIDENCE = 512
STREAMS = ("stdout", "stderr", "combined")  # relay.Stream's values
# The full safe-llama again: the package's folder first on the path (-P: not the working directory), then its
# console entry on the argv it had (argv[0] too: a drop-in's name says which tool).
CODE = (
    "import sys\n"
    "if sys.argv[1] not in sys.path: sys.path.insert(0, sys.argv[1])\n"
    "del sys.argv[:2]\n"
    "from safe_llama.entry import main; main()"
)


def argv_words(argv: Sequence[str]) -> str:
    """ARGV_ENV's value for argv."""
    return " ".join(os.fsencode(word).hex() for word in argv)


def take_argv() -> list[str] | None:
    """The argv ARGV_ENV holds, removed from this process's environment; None where none is (or it is garbled)."""
    value = os.environ.pop(ARGV_ENV, None)
    if not value:
        return None
    try:
        return [os.fsdecode(bytes.fromhex(word)) for word in value.split(" ")]
    except ValueError:
        return None


def path_for(env: Mapping[str, str], pid: int) -> str:
    from safe_llama.constants import cache_root

    return os.path.join(cache_root(env), f"resume-{pid}.marshal")


def write(
    env: Mapping[str, str], returncode: int, evidence: str | None, captured: Mapping[str, bytes | bytearray]
) -> str:
    """The resume file of this process (0600, replaced if one is left from an earlier process of the same pid)."""
    path = path_for(env, os.getpid())
    data = {
        "format": FORMAT,
        "pid": os.getpid(),
        "returncode": returncode,
        "evidence": evidence or "",
        "outputs": [(name, bytes(kept[-MOST_OUTPUT:])) for name, kept in captured.items() if name in STREAMS],
    }
    temporary = path + ".tmp"
    fd = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    with os.fdopen(fd, "wb") as file:
        file.write(marshal.dumps(data))
    os.replace(temporary, path)
    return path


def exec_full(argv: Sequence[str], path: str) -> None:
    """Become the full safe-llama again on its own argv, told where the failed start's file is; returns only when
    the exec failed."""
    package = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    flags = [flag for flag, on in (("-E", sys.flags.ignore_environment), ("-s", sys.flags.no_user_site)) if on]
    env = {**os.environ, RESUME_ENV: path}
    try:
        os.execve(sys.executable, [sys.executable, *flags, "-P", "-c", CODE, package, *argv], env)  # noqa: S606
    except OSError:
        return


def take(env: Mapping[str, str]) -> dict[str, Any] | None:
    """The resume file RESUME_ENV names, read and removed: None where there is none, or it is not this process's
    (its place and name are fixed by the pid), or not of its shape or bounds."""
    from safe_llama import trust

    given = env.get(RESUME_ENV)
    os.environ.pop(RESUME_ENV, None)  # not for llama.cpp, nor for a later exec
    if given is None or given != path_for(env, os.getpid()):
        return None
    data = trust.load_entry(given, trust.SHAPES["resume"])
    try:  # noqa: SIM105 -- read once: a resumed launch that fails again is not resumed from it
        os.unlink(given)
    except OSError:
        pass
    if data is None or data["format"] != FORMAT or data["pid"] != os.getpid():
        return None
    outputs = data["outputs"]
    ok = (
        type(data["returncode"]) is int
        and -64 <= data["returncode"] <= 255
        and len(data["evidence"]) <= MOST_EVIDENCE
        and data["evidence"].isprintable()
        and len(outputs) <= 2
        and all(
            isinstance(o, (tuple, list)) and len(o) == 2 and o[0] in STREAMS and isinstance(o[1], bytes)
            and len(o[1]) <= MOST_OUTPUT
            for o in outputs
        )
    )  # fmt: skip
    return data if ok else None


def outcome(data: Mapping[str, Any], table: SignatureTable) -> Outcome:
    """Attempt 1's outcome, judged from the capture as the full supervisor judges a start's output."""
    from safe_llama.process.relay import Stream
    from safe_llama.process.startup import Outcome, StartupWatcher
    from safe_llama.process.steady import exit_code_for

    watcher = StartupWatcher(table)
    for name, said in data["outputs"]:
        watcher.output(Stream(name), said)
    returncode = int(data["returncode"])
    failure = watcher.conclude(returncode, oom_evidence=data["evidence"] or None)
    return Outcome(exit_code_for(returncode), returncode, False, failure, False, None, (), int(data["pid"]), False)
