"""Invocations that load no model (--help, --version, --list-devices, --completion-bash, -cl, a usage
error) are llama.cpp's own business: the real binary replaces this process, argv untouched.

Owns that decision and the exec; must stay light (no typer, no probing): it runs before anything else.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence

from safe_llama.cmdline.launch_args import resolve
from safe_llama.cmdline.llama_args import parse
from safe_llama.errors import SafeLlamaError

GUARD_ENV = "SAFE_LLAMA_SUPERVISOR_PID"  # proc.GUARD_ENV, not imported: proc pulls in subprocess


def loads_no_model(tool: str, args: Sequence[str], env: Mapping[str, str]) -> bool:
    return parse(tool, args, env).loads_no_model


def exec_if_no_model(tool: str, args: Sequence[str], env: Mapping[str, str], given: Mapping[str, str]) -> None:
    """Replace this process with the real binary when llama.cpp will load no model; return otherwise
    (also when the binary cannot be found: the launch path then says why)."""
    if GUARD_ENV in env or not loads_no_model(tool, args, env):
        return  # started by safe-llama in place of llama.cpp: the launch path refuses the loop
    from safe_llama.device.binaries import find_binary

    try:
        binary = find_binary(tool, env=env, explicit=resolve(given, env).get("bin_dir"))
    except SafeLlamaError:
        return
    os.execv(binary, [str(binary), *args])  # noqa: S606 -- argv handed on as a list, never through a shell


def pass_through_early(tool: str, args: list[str], given: dict[str, str]) -> None:
    """exec_if_no_model for the doors: a bad config file or option is left to the full path, which reports it."""
    try:
        exec_if_no_model(tool, args, os.environ, given)
    except SafeLlamaError:
        return
