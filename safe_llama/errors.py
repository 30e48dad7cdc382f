"""Exit codes and the one user-facing error class.

Owns the mapping from failures to exit codes; must not print or touch the OS.
"""

from __future__ import annotations

import enum


class ExitStatus(enum.IntEnum):
    """safe-llama's own exit codes. A child's exit code is passed on unchanged instead.

    The codes from 64 on are chosen so they do not collide with llama.cpp's (0, 1, 130) nor with
    the shell's 126/127/128+N; the permanent ones are listed in the systemd unit's
    RestartPreventExitStatus=.
    """

    OK = 0
    USAGE = 2  # bad safe-llama option or argument
    BAD_MODEL = 65  # model file missing, not GGUF, truncated, corrupt header
    BAD_CONFIG = 66  # a config file or device profile is invalid
    NOTHING_FITS = 67  # no setting fits the device, even at the context floor
    RETRIES_EXHAUSTED = 68  # every attempt failed with an allocation error
    WORKER_UNAVAILABLE = 69  # an RPC worker (--rpc) does not answer, or stopped and did not come back
    INTERNAL = 70  # a bug in safe-llama
    NOT_EXECUTABLE = 126
    NOT_FOUND = 127
    INTERRUPTED = 130


class SafeLlamaError(Exception):
    """An error meant for the user: one line, and the exit code to leave with."""

    def __init__(self, message: str, status: ExitStatus) -> None:
        super().__init__(message)
        self.message = message
        self.status = status

    def __str__(self) -> str:
        return self.message


class ModelNotOnDisk(SafeLlamaError):
    """A model source (-hf, -mu, -dr) llama.cpp has not downloaded yet: nothing to plan from; llama.cpp
    downloads it and fits it itself on this start."""

    def __init__(self, message: str) -> None:
        super().__init__(message, ExitStatus.BAD_MODEL)
