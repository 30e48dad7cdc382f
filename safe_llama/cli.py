"""The help of `safe-llama` and of each command, and typer's shell completion: a typer app made from the rows
of cmdline.own_options, so help lists exactly the options entry.py reads.

Owns how the help looks; must not run a command (entry.run is the one dispatch: this app's commands have
no body) nor declare an option of its own (the table does: a test holds it).
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import Annotated, Any

import typer

from safe_llama.cmdline.own_options import COMMANDS, LAUNCH, OPTIONS, ROOT, TOOLS, Argument, Command, Option


def _epilog() -> str:
    lines = [
        "\b",
        f"Launch: safe-llama [launcher options] {'|'.join(TOOLS)} [llama.cpp arguments]",
        "(or the drop-ins safe-llama-cli, safe-llama-server, safe-llama-completion with llama.cpp's arguments).",
        "RPC worker: safe-llama rpc-server [ggml-rpc-server arguments], supervised: READY to systemd when it listens.",
        "Launcher options, each also a SAFE_LLAMA_* variable or a key of [launcher] in config.toml:",
    ]
    for option in OPTIONS:
        if LAUNCH in option.commands:
            variable = option.env + (f"={option.flag_value}" if option.kind == "flag" else "")
            lines.append(f"  {option.names[0] + ' ' + option.metavar:<20} {option.help} ({variable})")
    return "\n".join(lines)


app = typer.Typer(
    name="safe-llama",
    help="Start llama.cpp the first time: predict its memory, pick settings that fit, launch it.",
    epilog=_epilog(),
    no_args_is_help=True,
    add_completion=True,
    pretty_exceptions_show_locals=False,  # locals may hold secrets (--api-key)
    rich_markup_mode=None,
)

# Everything after the tool name belongs to llama.cpp, --help included; explain's options may follow the log
# file, and llama.cpp's own options (-c 65536) are collected as the failed run's.
PASSTHROUGH = {"ignore_unknown_options": True, "allow_interspersed_args": False, "allow_extra_args": True}
LOOSE = {"ignore_unknown_options": True, "allow_extra_args": True}


def _parameter(option: Option) -> inspect.Parameter:
    """One row of the table as the keyword typer reads a command's option from."""
    if option.kind == "flag":
        kind: Any = bool
        info = typer.Option(*option.names, help=option.help)
    else:
        kind = str | None
        info = typer.Option(*option.names, help=option.help, metavar=option.metavar)
    name = option.names[0].lstrip("-").replace("-", "_")
    default = False if option.kind == "flag" else None
    return inspect.Parameter(name, inspect.Parameter.KEYWORD_ONLY, default=default, annotation=Annotated[kind, info])


def _argument(argument: Argument) -> inspect.Parameter:
    kind: Any = list[str] | None if argument.many else str | None
    info = typer.Argument(help=argument.help, metavar=None if argument.many else argument.name)
    name = "args" if argument.many else argument.name.split("|")[0]
    return inspect.Parameter(
        name, inspect.Parameter.POSITIONAL_OR_KEYWORD, default=None, annotation=Annotated[kind, info]
    )


def _help_only(command: Command) -> Callable[..., None]:
    """A command with the table's options and arguments and no body: entry.run runs the command itself.
    Typer reads a command's parameters from its function's signature (inspect.signature, which honours
    __signature__), so the function is given the signature the table describes."""

    def shown(**_: object) -> None:
        """Reached only for help and completion."""

    options = [option for option in OPTIONS if command.name in option.commands]
    parameters = [*map(_argument, command.arguments), *map(_parameter, options)]
    shown.__signature__ = inspect.Signature(parameters)  # type: ignore[attr-defined]
    shown.__annotations__ = {p.name: p.annotation for p in parameters}
    shown.__doc__ = command.help
    return shown


def _add_commands() -> None:
    app.callback()(
        _help_only(Command(ROOT, "safe-llama: a launcher for llama-cli, llama-server and llama-completion."))
    )
    for command in COMMANDS:
        settings = LOOSE if command.loose else PASSTHROUGH if command.arguments else None
        app.command(name=command.name, context_settings=settings)(_help_only(command))


_add_commands()


def show_help(args: list[str]) -> int:
    """Print the help for args (no words, --help, COMMAND --help) or answer typer's completion options."""
    from safe_llama.errors import ExitStatus
    from safe_llama.run.exits import guarded

    def body() -> int:
        try:  # without standalone mode click returns a command's typer.Exit code instead of raising it
            return int(app(args=args, prog_name="safe-llama", standalone_mode=False) or 0)
        except typer.Exit as done:
            return int(done.exit_code)
        except typer.Abort:
            return int(ExitStatus.INTERRUPTED)

    return guarded(body)
