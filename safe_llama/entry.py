"""The console scripts' entry points and the one dispatch: every command of `safe-llama` (a launch, a
drop-in, rpc-server, plan, the admin commands) is decided in `run`, its options read from the one table
(cmdline.own_options); an admin command runs as the main of the commands/ module its row names, imported
only then. Pass-through invocations (help, version, usage errors) exec the real llama.cpp
binary first; nothing here imports typer: only help (and typer's shell completion) loads cli.

A launch whose plan is known from a launch record starts llama.cpp first of all (remembered/early.py), before
even the pass-through's option table is read: a record exists only for words that loaded a model.

Owns those early exits, the dispatch and the mapping of failures to exit codes, and hands the process's
environment to what it calls; must not import typer (nor, at import, anything but constants.py, a leaf: the
early start runs before anything else, and the planner and the supervisor are imported where used).
"""

from __future__ import annotations

import os
import sys

from safe_llama.constants import TOOLS

TYPE_CHECKING = False  # typing.TYPE_CHECKING without importing typing (mypy reads the name)
if TYPE_CHECKING:
    from collections.abc import Callable, Mapping

    from safe_llama.cmdline.own_options import Command
    from safe_llama.remembered.early import Early

HELP_WORDS = ("--help", "--install-completion", "--show-completion")  # answered by cli (typer)


def _end(code: int) -> int:
    """A console script's process ends here once its output is flushed, without tearing down every module
    Python loaded (10-20 ms after a launch). safe-llama registers nothing to run at exit
    (tests/test_entry.py checks that no module calls atexit), so nothing is skipped."""
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):
            from safe_llama.errors import ExitStatus  # only then: enum stays off every launch's way out

            code = int(ExitStatus.UNWRITABLE)
    os._exit(code)


def main() -> int:
    """The safe-llama console script, on this process's own argv. A link named llama-cli/-server/-completion
    behaves as that tool's drop-in."""
    return _end(_main(sys.argv[1:]))


def _main(args: list[str]) -> int:
    name = os.path.basename(sys.argv[0])
    # a launch's first word is a tool or an option (launch_args.split); a drop-in's name takes _drop_in's
    if not name.startswith("llama-") and args[:1] and (args[0] in TOOLS or args[0][:1] == "-"):
        early = _early("safe-llama", args)
        if early is not None:
            return _adopt(early, args)
    from safe_llama.cmdline.launch_args import DROP_IN

    if name in DROP_IN:
        return _drop_in(DROP_IN[name], args, console=True)
    return run(args, console=True)


def run(args: list[str], *, console: bool = False) -> int:
    """`safe-llama ARGS`: the one place that decides which command runs. console: this is the console script's
    own process (a launch keys a launch record on its words); False for a caller inside another program
    (tests), which gets the exit code back."""
    word = args[0] if args else ""
    if word == "rpc-server":
        from safe_llama.attempts.exits import guarded

        return guarded(lambda: _rpc_server(args[1:]))
    from safe_llama.cmdline import own_options

    if word in own_options.COMMANDS:
        return _command(own_options.COMMANDS[word], args[1:])
    if word in ("", *HELP_WORDS):
        return _help(args)
    if word in own_options.options_of(own_options.ROOT):  # --version, the one option before any word
        from safe_llama import __version__

        sys.stdout.write(f"safe-llama {__version__}\n")
        return 0
    if word in TOOLS or word[:1] == "-":
        return _launch_words(args, console)
    commands = ", ".join(own_options.COMMANDS)
    tools = ", ".join(TOOLS)
    from safe_llama.errors import ExitStatus

    sys.stderr.write(f"safe-llama: unknown command '{word}' (one of {commands}, rpc-server, or a tool: {tools})\n")
    return int(ExitStatus.USAGE)


def _launch_words(args: list[str], console: bool) -> int:
    """`safe-llama [launcher options] TOOL [llama.cpp args]`."""
    from safe_llama.attempts.exits import guarded
    from safe_llama.cmdline.launch_args import split
    from safe_llama.errors import SafeLlamaError

    try:
        request = split(args)
    except SafeLlamaError as err:
        sys.stderr.write(f"{err.message}\n")
        return int(err.status)
    if request is None:  # --help before the tool
        return _help(["--help"])
    from safe_llama.remembered.passthrough import pass_through_early

    tool, tool_args, given = request.tool, list(request.args), dict(request.settings)
    pass_through_early(tool, tool_args, given)
    door = ("safe-llama", list(args)) if console else None
    return guarded(lambda: _launch(tool, tool_args, given, door))


def _command(command: Command, args: list[str]) -> int:
    """A command word's own options read from the table, then the main of the module its row names, imported
    only now (`--help`: cli shows it)."""
    from importlib import import_module

    from safe_llama.attempts.exits import guarded
    from safe_llama.cmdline.own_options import read
    from safe_llama.errors import ExitStatus, SafeLlamaError

    def body() -> int:
        reading = read(command.name, args)
        if reading.help:
            return _help([command.name, "--help"])
        if reading.words and not command.arguments:
            raise SafeLlamaError(
                f"safe-llama: {command.name}: takes no arguments ('{reading.words[0]}')", ExitStatus.USAGE
            )
        runner: Callable[[Mapping[str, str], list[str]], int] = import_module(command.module).main
        return runner(reading.settings, reading.words)

    return guarded(body)


def _help(args: list[str]) -> int:
    """The help made from the table (and typer's shell completion): the only path that loads typer."""
    from safe_llama import cli

    return cli.show_help(args)


def _early(door: str, args: list[str]) -> Early | None:
    """Attempt 1 started from a launch record (remembered/early.py), or None."""
    from safe_llama.remembered import early

    return early.start(door, args, os.environ)


def _adopt(started: Early, args: list[str]) -> int:
    """The supervisor takes over the early start."""
    from safe_llama.attempts.exits import guarded

    def body() -> int:
        from safe_llama.attempts.launch import adopted

        return adopted(started, args)

    return guarded(body)


def _launch(tool: str, args: list[str], given: dict[str, str], door: tuple[str, list[str]] | None) -> int:
    from safe_llama.attempts.launch import run_launch

    return run_launch(tool, args, given, door=door)


def _rpc_server(args: list[str]) -> int:
    from safe_llama.commands.rpc_server import run_rpc_server

    return run_rpc_server(args, os.environ)


def _drop_in(tool: str, args: list[str], *, console: bool) -> int:
    """A drop-in: exactly the tool's own arguments."""
    if console:
        early = _early(tool, args)
        if early is not None:
            return _adopt(early, args)
    from safe_llama.remembered.passthrough import pass_through_early

    pass_through_early(tool, args, {})
    from safe_llama.attempts.exits import guarded

    return guarded(lambda: _launch(tool, args, {}, (tool, args) if console else None))


def main_cli() -> int:
    """The safe-llama-cli console script: exactly llama-cli's arguments."""
    return _end(_drop_in("cli", sys.argv[1:], console=True))


def main_server() -> int:
    """The safe-llama-server console script: exactly llama-server's arguments."""
    return _end(_drop_in("server", sys.argv[1:], console=True))


def handed() -> int:
    """The handed supervisor's process (process/handed.py): a ready llama-server's launch, exec'd in place of the
    full one with the hand-off's words; it ends as the launch would have (attempts/handoff.py)."""

    def body() -> int:
        from safe_llama.attempts.handoff import main as handed_main

        return handed_main(sys.argv[2:])  # after -c's "-c" and the package's folder

    from safe_llama.attempts.exits import guarded

    return _end(guarded(body))


def main_completion() -> int:
    """The safe-llama-completion console script: exactly llama-completion's arguments."""
    return _end(_drop_in("completion", sys.argv[1:], console=True))
