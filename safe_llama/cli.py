"""The help of `safe-llama` and of each command, and typer's shell completion, built from the rows of
cmdline.own_options: each row becomes one of typer's own option objects (typer.core), so help and completion
list exactly the options entry.py reads; the README's launcher table is rendered here too.

Owns how the help looks; must not run a command (entry.run is the one dispatch: these commands have no
body) nor declare an option of its own (the table does: a test holds it).
"""

from __future__ import annotations

from typing import Any

from typer.core import TyperArgument, TyperCommand, TyperGroup, TyperOption
from typer.main import get_install_completion_arguments

from safe_llama.cmdline.own_options import (
    COMMANDS,
    LAUNCH,
    OPTIONS,
    ROOT,
    TOOL_ARGS,
    TOOLS,
    Argument,
    Command,
    Option,
)

# Everything after the tool name belongs to llama.cpp, --help included; explain's options may follow the log
# file, and llama.cpp's own options (-c 65536) are collected as the failed run's.
PASSTHROUGH = {"ignore_unknown_options": True, "allow_interspersed_args": False, "allow_extra_args": True}
LOOSE = {"ignore_unknown_options": True, "allow_extra_args": True}
LAUNCHER = tuple(option for option in OPTIONS if LAUNCH in option.commands)


def _variable(option: Option) -> str:
    """A launcher option's SAFE_LLAMA_* variable as it is set: a flag's with the value the flag stores."""
    return option.env + (f"={option.flag_value}" if option.kind == "flag" else "")


def _spelled(option: Option) -> str:
    return f"{option.names[0]} {option.metavar}".strip()


def launcher_table() -> str:
    """The README's "Launcher options" table (tests/test_readme.py holds the README to it)."""
    rows = [f"| `{_spelled(option)}` | `{_variable(option)}` | {option.help} |" for option in LAUNCHER]
    return "\n".join(["| option | variable | what it does |", "|---|---|---|", *rows])


def _epilog() -> str:
    lines = [
        "\b",
        f"Launch: safe-llama [launcher options] {'|'.join(TOOLS)} [llama.cpp arguments]",
        "(or the drop-ins safe-llama-cli, safe-llama-server, safe-llama-completion with llama.cpp's arguments).",
        "RPC worker: safe-llama rpc-server [ggml-rpc-server arguments], supervised: READY to systemd when it listens.",
        "Launcher options, each also a SAFE_LLAMA_* variable or a key of [launcher] in config.toml:",
    ]
    lines += [f"  {_spelled(option):<20} {option.help} ({_variable(option)})" for option in LAUNCHER]
    return "\n".join(lines)


def _option(option: Option) -> TyperOption:
    if option.kind == "flag":
        return TyperOption(param_decls=list(option.names), is_flag=True, default=False, help=option.help)
    return TyperOption(param_decls=list(option.names), type=str, metavar=option.metavar, help=option.help)


def _argument(argument: Argument) -> TyperArgument:
    if argument.many:
        return TyperArgument(param_decls=["args"], nargs=-1, help=argument.help)
    return TyperArgument(param_decls=[argument.name.split("|")[0]], metavar=argument.name, help=argument.help)


def _command(command: Command) -> TyperCommand:
    """A command with the table's arguments and options and no body: entry.run runs the command itself."""
    settings: dict[str, Any] = LOOSE if command.loose else PASSTHROUGH if command.arguments else {}
    params = [*map(_argument, command.arguments), *map(_option, (o for o in OPTIONS if command.name in o.commands))]
    return TyperCommand(
        name=command.name, params=params, help=command.help, context_settings=settings, rich_markup_mode=None
    )


def _launch_word(word: str, help_text: str) -> TyperCommand:
    """A word entry.run launches (a tool, rpc-server): listed and completed like a command, its arguments
    llama.cpp's."""
    return TyperCommand(
        name=word, help=help_text, context_settings=PASSTHROUGH, rich_markup_mode=None, params=[_argument(TOOL_ARGS)]
    )


LAUNCH_WORDS = (
    *((tool, f"Launch llama-{tool} with settings that fit (llama.cpp's arguments follow).") for tool in TOOLS),
    ("rpc-server", "Run ggml-rpc-server supervised (its arguments follow)."),
)


def _group() -> TyperGroup:
    """`safe-llama` itself: its own options, typer's completion options, every command of the table and every
    word that launches (shell completion offers them all)."""
    return TyperGroup(
        name=ROOT,
        commands=[*(_command(command) for command in COMMANDS.values()), *(_launch_word(*w) for w in LAUNCH_WORDS)],
        params=[*map(_option, (o for o in OPTIONS if ROOT in o.commands)), *get_install_completion_arguments()],
        help="Start llama.cpp the first time: predict its memory, pick settings that fit, launch it.",
        epilog=_epilog(),
        no_args_is_help=True,
        rich_markup_mode=None,
    )


group = _group()


def show_help(args: list[str]) -> int:
    """Print the help for args (no words, --help, COMMAND --help) or answer typer's completion options."""
    from typer import Abort, Exit

    from safe_llama.attempts.exits import guarded
    from safe_llama.errors import ExitStatus

    def body() -> int:
        try:  # without standalone mode a command's exit code comes back instead of ending the process
            return int(group.main(args=args, prog_name=ROOT, standalone_mode=False) or 0)
        except Exit as done:
            return int(done.exit_code)
        except Abort:
            return int(ExitStatus.INTERRUPTED)

    return guarded(body)
