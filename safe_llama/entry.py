"""The console scripts' entry points: pass-through invocations (help, version, usage errors) exec the
real llama.cpp binary before typer or the planner is imported; everything else goes to cli.

Owns only that early exit; must not import typer.
"""

from __future__ import annotations

import os
import sys

from safe_llama.errors import SafeLlamaError
from safe_llama.launch_args import DROP_IN, split
from safe_llama.passthrough import exec_if_no_model


def _early(tool: str, args: list[str], given: dict[str, str]) -> None:
    try:
        exec_if_no_model(tool, args, os.environ, given)
    except SafeLlamaError:
        return  # a bad config file or option: the full path reports it


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    name = os.path.basename(sys.argv[0])
    if argv is None and name in DROP_IN:
        _early(DROP_IN[name], args, {})
    else:
        try:
            request = split(args)
        except SafeLlamaError:
            request = None
        if request is not None:
            _early(request.tool, list(request.args), dict(request.settings))
    from safe_llama import cli

    return cli.main(argv)


def _drop_in(tool: str, argv: list[str] | None) -> int:
    args = sys.argv[1:] if argv is None else argv
    _early(tool, list(args), {})
    from safe_llama import cli

    return cli._drop_in(tool, argv)


def main_cli(argv: list[str] | None = None) -> int:
    return _drop_in("cli", argv)


def main_server(argv: list[str] | None = None) -> int:
    return _drop_in("server", argv)


def main_completion(argv: list[str] | None = None) -> int:
    return _drop_in("completion", argv)
