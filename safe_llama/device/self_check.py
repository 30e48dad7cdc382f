"""Telling safe-llama itself from a llama.cpp binary: its own entry points, and scripts that run it.

Owns that test (binaries.py's search and the pass-through's quick lookup both ask it); must stay light
(os and sys only): the pass-through runs it before anything else is imported.
"""

from __future__ import annotations

import os
import sys

TYPE_CHECKING = False  # typing.TYPE_CHECKING without importing typing (mypy reads the name)
if TYPE_CHECKING:
    from collections.abc import Sequence

SCRIPTS = ("safe-llama", "safe-llama-cli", "safe-llama-server", "safe-llama-completion")


def own_paths() -> list[str]:
    """safe-llama's own entry points, as real paths: argv[0] and the console scripts beside it."""
    paths = [os.path.realpath(sys.argv[0])]
    here = os.path.dirname(os.path.realpath(sys.argv[0]))
    for name in SCRIPTS:
        candidate = os.path.join(here, name)
        if os.path.exists(candidate):
            paths.append(os.path.realpath(candidate))
    return paths


def is_self(path: str, own: Sequence[str]) -> bool:
    real = os.path.realpath(path)
    if real in own:
        return True
    # a symlink or copy of our console script: a Python script naming safe_llama
    try:
        with open(real, "rb") as f:
            head = f.read(512)
    except OSError:
        return False
    return head.startswith(b"#!") and b"safe_llama" in head
