"""The console scripts' entry points: pass-through invocations (help, version, usage errors) exec the
real llama.cpp binary first; launches and `plan` run without typer; only help and the admin commands
load cli (typer, about 0.15 s of imports).

A launch whose plan is known from a launch record starts llama.cpp first of all (run/early.py), before
even the pass-through's option table is read: a record exists only for words that loaded a model.

Owns those early exits and the mapping of failures to exit codes, and hands the process's environment to
what it calls; must not import typer (nor, at import, anything but constants.py, a leaf: the early start runs
before anything else, and the planner and the supervisor are imported where used).
"""

from __future__ import annotations

import os
import sys

from safe_llama.constants import TOOLS

TYPE_CHECKING = False  # typing.TYPE_CHECKING without importing typing (mypy reads the name)
if TYPE_CHECKING:
    from safe_llama.run.early import Early

# `plan`'s own options (cli.plan declares the same for help): name -> (keyword, takes a value)
PLAN_OPTIONS = {
    "--json": ("json_out", False), "--ladder": ("ladder", True), "--min-ctx": ("min_ctx", True),
    "--profile": ("profile", True), "--max-alloc": ("max_alloc", True), "--device-memory": ("device_memory", True),
    "--integrated": ("integrated", False), "--discrete": ("integrated", False),
    "--host-memory": ("host_memory", True), "--llama-bin": ("llama_bin", True), "--rpc-memory": ("rpc_memory", True),
    "--llama-version": ("llama_version", True), "--kv-split": ("kv_split", False), "--kv-single": ("kv_split", False),
}  # fmt: skip
_FLAG_VALUES = {"--json": True, "--integrated": True, "--discrete": False, "--kv-split": True, "--kv-single": False}


def plan_call(args: list[str]) -> dict[str, object] | None:
    """`plan [options] TOOL [llama.cpp args]` as run_plan's keywords, read as typer reads them (options
    before the tool, everything after it llama.cpp's); None for anything else (--help, an unknown or
    malformed option, a missing or unknown tool), which typer then answers."""
    call: dict[str, object] = {}
    i = 0
    while i < len(args):
        arg = args[i]
        if arg in TOOLS:
            return {**call, "tool": arg, "args": args[i + 1 :]}
        name, eq, value = arg.partition("=")
        if name not in PLAN_OPTIONS:
            return None
        key, takes_value = PLAN_OPTIONS[name]
        if not takes_value:
            if eq:
                return None
            call[key] = _FLAG_VALUES[name]
        else:
            if not eq:
                i += 1
                if i >= len(args):
                    return None
                value = args[i]
            if key == "min_ctx":
                try:
                    call[key] = int(value)
                except ValueError:
                    return None
            else:
                call[key] = value
        i += 1
    return None


def main(argv: list[str] | None = None) -> int:
    """Console-script entry: a launch goes straight to the launcher, `plan` to the planner, everything else
    to the typer app. A symlink named llama-cli/-server/-completion behaves as that tool."""
    args = sys.argv[1:] if argv is None else argv
    name = os.path.basename(sys.argv[0])
    # a launch's first word is a tool or an option (launch_args.split); a drop-in's name takes _drop_in's
    if argv is None and not name.startswith("llama-") and args[:1] and (args[0] in TOOLS or args[0][:1] == "-"):
        early = _early("safe-llama", args)
        if early is not None:
            return _adopt(early, args)
    from safe_llama.cmdline.launch_args import DROP_IN, split
    from safe_llama.errors import SafeLlamaError
    from safe_llama.run.exits import guarded

    if argv is None and name in DROP_IN:
        return _drop_in(DROP_IN[name], argv)
    if args[:1] == ["rpc-server"]:
        return guarded(lambda: _rpc_server(args[1:]))
    try:
        request = split(args)
    except SafeLlamaError as err:
        sys.stderr.write(f"{err.message}\n")
        return int(err.status)
    if request is not None:
        from safe_llama.run.passthrough import pass_through_early

        tool, tool_args, given = request.tool, list(request.args), dict(request.settings)
        pass_through_early(tool, tool_args, given)
        door = None if argv is not None else ("safe-llama", list(args))
        return guarded(lambda: _launch(tool, tool_args, given, door))
    call = plan_call(args[1:]) if args[:1] == ["plan"] else None
    if call is not None:
        from safe_llama.commands.plan import run_plan

        return guarded(lambda: run_plan(**call))  # type: ignore[arg-type]
    from safe_llama import cli

    return cli.run_app(args)


def _early(door: str, args: list[str]) -> Early | None:
    """Attempt 1 started from a launch record (run/early.py), or None."""
    from safe_llama.run import early

    return early.start(door, args, os.environ)


def _adopt(started: Early, args: list[str]) -> int:
    """The supervisor takes over the early start."""
    from safe_llama.run.exits import guarded

    def body() -> int:
        from safe_llama.run.launch import adopted

        return adopted(started, args)

    return guarded(body)


def _launch(tool: str, args: list[str], given: dict[str, str], door: tuple[str, list[str]] | None) -> int:
    from safe_llama.run.launch import launch

    return launch(tool, args, given, door=door)


def _rpc_server(args: list[str]) -> int:
    from safe_llama.run.worker import run_rpc_server

    return run_rpc_server(args, os.environ)


def _drop_in(tool: str, argv: list[str] | None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if argv is None:
        early = _early(tool, args)
        if early is not None:
            return _adopt(early, args)
    from safe_llama.run.passthrough import pass_through_early

    pass_through_early(tool, args, {})
    from safe_llama.run.exits import guarded

    return guarded(lambda: _launch(tool, args, {}, None if argv is not None else (tool, args)))


def main_cli(argv: list[str] | None = None) -> int:
    """safe-llama-cli: exactly llama-cli's arguments."""
    return _drop_in("cli", argv)


def main_server(argv: list[str] | None = None) -> int:
    """safe-llama-server: exactly llama-server's arguments."""
    return _drop_in("server", argv)


def main_completion(argv: list[str] | None = None) -> int:
    """safe-llama-completion: exactly llama-completion's arguments."""
    return _drop_in("completion", argv)
