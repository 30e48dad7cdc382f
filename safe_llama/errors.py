"""Exit codes and the one user-facing error class.

Owns the one table of safe-llama's exit codes (each with its meaning and whether a restart can fix it: the
README's table and the systemd units' RestartPreventExitStatus= are checked against it) and the mapping from
failures to them; must not print or touch the OS.
"""

from __future__ import annotations

import enum


class ExitStatus(enum.IntEnum):
    """safe-llama's own exit codes. A child's exit code is passed on unchanged instead.

    The codes from 64 on are chosen so they do not collide with llama.cpp's (0, 1, 130) nor with the shell's
    126/127/128+N. Each member is (code, meaning, permanent): permanent says which processes end with it for
    a cause a restart cannot fix ("all", or "launch": only a launch that plans a model), and so which codes
    each systemd unit lists in RestartPreventExitStatus=.
    """

    meaning: str
    permanent: str

    def __new__(cls, code: int, meaning: str, permanent: str = "") -> ExitStatus:
        member = int.__new__(cls, code)
        member._value_ = code
        member.meaning = meaning
        member.permanent = permanent
        return member

    OK = 0, "success (or the child's own 0)"
    FAILED = 1, ("`explain`: no failure found in the log; `doctor`: a check failed; `install-shims`: a file was "
                 "left alone (otherwise: the child's own 1)")  # fmt: skip
    USAGE = 2, "bad safe-llama option or argument (e.g. `explain` on a log that cannot be read)", "all"
    BAD_MODEL = (
        65,
        "model file missing, not GGUF, truncated or corrupt header, a header over llama.cpp's caps or the 32 MiB "
        "safe-llama keeps, or a model that cannot work (no heads, a head dimension of 0, a NaN)",
        "launch",
    )
    BAD_CONFIG = 66, "invalid config file (names the file and key) or device profile", "launch"
    NOTHING_FITS = 67, "nothing fits the device, even at the context floor (nothing launched)", "launch"
    RETRIES_EXHAUSTED = 68, "every retry failed with an allocation error"
    WORKER_UNAVAILABLE = 69, ("an RPC worker (`--rpc`) does not answer, or stopped during a start and did not "
                              "come back (names it)")  # fmt: skip
    INTERNAL = 70, "internal error in safe-llama"
    UNWRITABLE = 120, "stdout or stderr could not be written at the end (as Python's own exit reports it)"
    NOT_EXECUTABLE = 126, "the llama.cpp binary is not executable", "all"
    NOT_FOUND = 127, "the llama.cpp binary is not found", "all"
    INTERRUPTED = 130, ("interrupted (Ctrl-C) before llama.cpp started; once it runs, the signal is llama.cpp's "
                        "and so is the exit code: llama-completion 130, llama-server and llama-cli 0")  # fmt: skip


class SafeLlamaError(Exception):
    """An error meant for the user: one line, and the exit code to leave with."""

    def __init__(self, message: str, status: ExitStatus) -> None:
        super().__init__(message)
        self.message = message
        self.status = status

    def __str__(self) -> str:
        return self.message


class ModelNotOnDisk(SafeLlamaError):
    """A model source (-hf, -mu, -dr) llama.cpp has not downloaded yet, whose header could not be read over
    HTTP either: nothing to plan from; llama.cpp downloads it and fits it itself on this start."""

    def __init__(self, message: str) -> None:
        super().__init__(message, ExitStatus.BAD_MODEL)
