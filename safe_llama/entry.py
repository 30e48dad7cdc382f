"""The console scripts' entry points: pass-through invocations (help, version, usage errors) exec the
real llama.cpp binary first; launches and `plan` run without typer; only help and the admin commands
load cli (typer, about 0.15 s of imports).

Owns those early exits and the mapping of failures to exit codes; must not import typer (nor, at import,
anything the pass-through does not need: the planner and the supervisor are imported where used).
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable

from safe_llama.errors import ExitStatus, SafeLlamaError
from safe_llama.launch_args import DROP_IN, split
from safe_llama.passthrough import exec_if_no_model

# `plan`'s own options (cli.plan declares the same for help): name -> (keyword, takes a value)
PLAN_OPTIONS = {
    "--json": ("json_out", False), "--ladder": ("ladder", True), "--min-ctx": ("min_ctx", True),
    "--profile": ("profile", True), "--max-alloc": ("max_alloc", True), "--device-memory": ("device_memory", True),
    "--integrated": ("integrated", False), "--discrete": ("integrated", False),
    "--host-memory": ("host_memory", True), "--llama-bin": ("llama_bin", True),
    "--llama-version": ("llama_version", True), "--kv-split": ("kv_split", False), "--kv-single": ("kv_split", False),
}  # fmt: skip
_FLAG_VALUES = {"--json": True, "--integrated": True, "--discrete": False, "--kv-split": True, "--kv-single": False}
TOOLS = ("cli", "server", "completion")


def pass_through_early(tool: str, args: list[str], given: dict[str, str]) -> None:
    try:
        exec_if_no_model(tool, args, os.environ, given)
    except SafeLlamaError:
        return  # a bad config file or option: the full path reports it


def launch(tool: str, args: list[str], given: dict[str, str]) -> int:
    """The supervised launch; callers have already handed no-model invocations to llama.cpp (`pass_through_early`)."""
    from safe_llama import launch as launch_module
    from safe_llama import launch_args

    settings, origins = launch_args.resolve_sourced(given, os.environ)
    return launch_module.run(tool, args, os.environ, launch_args.launch_options(settings, origins))


def run_plan(
    *,
    tool: str,
    args: list[str],
    json_out: bool = False,
    ladder: str | None = None,
    min_ctx: int | None = None,
    profile: str | None = None,
    max_alloc: str | None = None,
    device_memory: str | None = None,
    integrated: bool | None = None,
    host_memory: str | None = None,
    llama_bin: str | None = None,
    llama_version: str | None = None,
    kv_split: bool | None = None,
) -> int:
    """`safe-llama plan`: the same resolution as the launch (these options over SAFE_LLAMA_* over the config
    file), then the plan printed."""
    from dataclasses import replace

    from safe_llama import commands, launch_args

    typed = {
        "ladder": ladder, "min_ctx": None if min_ctx is None else str(min_ctx), "profile": profile,
        "max_alloc": max_alloc, "device_memory": device_memory, "host_memory": host_memory, "bin_dir": llama_bin,
        "llama_version": llama_version,
        "integrated": None if integrated is not True else "1", "discrete": None if integrated is not False else "1",
    }  # fmt: skip
    given = {k: v for k, v in typed.items() if v is not None}
    settings, origins = launch_args.resolve_sourced(given, os.environ)
    options = replace(launch_args.launch_options(settings, origins).plan, kv_split=kv_split)
    return commands.plan_command(tool=tool, args=args, json_out=json_out, options=options)


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


def guarded(body: Callable[[], int]) -> int:
    """Maps every failure to a documented exit code; a message, never a traceback, for known errors."""
    try:
        return body()
    except SafeLlamaError as err:
        sys.stderr.write(f"{err.message}\n")
        return int(err.status)
    except KeyboardInterrupt:
        return int(ExitStatus.INTERRUPTED)
    except Exception as err:  # the command line's usage errors, and the unexpected
        show = getattr(err, "show", None)
        if callable(show) and isinstance(getattr(err, "exit_code", None), int):  # typer's (vendored click) usage
            show()
            return int(ExitStatus.USAGE)
        if os.environ.get("SAFE_LLAMA_DEBUG"):
            import traceback

            traceback.print_exc()
        sys.stderr.write(f"safe-llama: internal error: {type(err).__name__}: {err} (SAFE_LLAMA_DEBUG=1 for details)\n")
        return int(ExitStatus.INTERNAL)


def main(argv: list[str] | None = None) -> int:
    """Console-script entry: a launch goes straight to the launcher, `plan` to the planner, everything else
    to the typer app. A symlink named llama-cli/-server/-completion behaves as that tool."""
    args = sys.argv[1:] if argv is None else argv
    name = os.path.basename(sys.argv[0])
    if argv is None and name in DROP_IN:
        return _drop_in(DROP_IN[name], argv)
    try:
        request = split(args)
    except SafeLlamaError as err:
        sys.stderr.write(f"{err.message}\n")
        return int(err.status)
    if request is not None:
        tool, tool_args, given = request.tool, list(request.args), dict(request.settings)
        pass_through_early(tool, tool_args, given)
        return guarded(lambda: launch(tool, tool_args, given))
    call = plan_call(args[1:]) if args[:1] == ["plan"] else None
    if call is not None:
        return guarded(lambda: run_plan(**call))  # type: ignore[arg-type]
    from safe_llama import cli

    return cli.run_app(args)


def _drop_in(tool: str, argv: list[str] | None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    pass_through_early(tool, args, {})
    return guarded(lambda: launch(tool, args, {}))


def main_cli(argv: list[str] | None = None) -> int:
    """safe-llama-cli: exactly llama-cli's arguments."""
    return _drop_in("cli", argv)


def main_server(argv: list[str] | None = None) -> int:
    """safe-llama-server: exactly llama-server's arguments."""
    return _drop_in("server", argv)


def main_completion(argv: list[str] | None = None) -> int:
    """safe-llama-completion: exactly llama-completion's arguments."""
    return _drop_in("completion", argv)
