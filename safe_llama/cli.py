"""The command line: collects options and makes one call per command.

Owns argument parsing and rendering choices; must not hold policy (that lives in the core modules and
configs/). Heavy modules are imported inside the commands so `--help` and the launch path stay fast.
"""

from __future__ import annotations

import sys
from typing import Annotated

import typer

from safe_llama import __version__
from safe_llama.errors import ExitStatus, SafeLlamaError

app = typer.Typer(
    name="safe-llama",
    help="Start llama.cpp the first time: predict its memory, pick settings that fit, launch it.",
    no_args_is_help=True,
    add_completion=True,
    pretty_exceptions_show_locals=False,  # locals may hold secrets (--api-key)
    rich_markup_mode=None,
)

# Everything after the tool name belongs to llama.cpp, --help included.
PASSTHROUGH = {"ignore_unknown_options": True, "allow_interspersed_args": False, "allow_extra_args": True}

TOOLS = ("cli", "server", "completion")


def _version(value: bool) -> None:
    if value:
        typer.echo(f"safe-llama {__version__}")
        raise typer.Exit()


@app.callback()
def _root(
    version: Annotated[
        bool, typer.Option("--version", callback=_version, is_eager=True, help="Print the version and exit.")
    ] = False,
) -> None:
    """safe-llama: a launcher for llama-cli, llama-server and llama-completion."""


def _check_tool(tool: str) -> str:
    if tool not in TOOLS:
        raise SafeLlamaError(
            f"safe-llama: unknown tool '{tool}': expected one of {', '.join(TOOLS)}", ExitStatus.USAGE
        )
    return tool


@app.command(context_settings=PASSTHROUGH)
def plan(
    tool: Annotated[str, typer.Argument(help="cli, server or completion")],
    args: Annotated[list[str] | None, typer.Argument(help="the llama.cpp tool's own arguments")] = None,
    json_out: Annotated[bool, typer.Option("--json", help="Print the plan as JSON.")] = False,
) -> None:
    """Show what llama.cpp will allocate for a command line, and the settings that fit."""
    from safe_llama import commands

    commands.plan(tool=_check_tool(tool), args=list(args or []), json_out=json_out)


def main(argv: list[str] | None = None) -> int:
    """Console-script entry: runs the app and maps every failure to a documented exit code."""
    try:
        app(args=argv, prog_name="safe-llama", standalone_mode=False)
    except SafeLlamaError as err:
        sys.stderr.write(f"{err.message}\n")
        return int(err.status)
    except typer.Exit as done:
        return int(done.exit_code)
    except KeyboardInterrupt:
        return int(ExitStatus.INTERRUPTED)
    except Exception as err:  # click's usage errors and the unexpected
        import click

        if isinstance(err, click.exceptions.ClickException):
            err.show()
            return int(ExitStatus.USAGE)
        if isinstance(err, click.exceptions.Abort):
            return int(ExitStatus.INTERRUPTED)
        raise
    return 0


if __name__ == "__main__":
    sys.exit(main())
