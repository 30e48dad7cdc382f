"""The command line: collects options and makes one call per command.

Owns argument parsing and rendering choices; must not hold policy (that lives in the core modules and
configs/). Heavy modules are imported inside the commands so `--help` and the launch path stay fast.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Annotated

import typer

from safe_llama import __version__
from safe_llama.errors import ExitStatus, SafeLlamaError

if TYPE_CHECKING:
    from safe_llama.commands import PlanOptions


def _epilog() -> str:
    from safe_llama.launch_args import ENV, HELP, OPTIONS

    lines = [
        "\b",
        "Launch: safe-llama [launcher options] cli|server|completion [llama.cpp arguments]",
        "(or the drop-ins safe-llama-cli, safe-llama-server, safe-llama-completion with llama.cpp's arguments).",
        "Launcher options, each also a SAFE_LLAMA_* variable or a key of [launcher] in config.toml:",
    ]
    for option, (key, takes_value) in OPTIONS.items():
        metavar, text = HELP[option]
        variable = ENV[key] + ("=1" if not takes_value and key in ("integrated", "discrete") else "")
        variable += "=0" if not takes_value and key in ("predict", "remember") else ""
        lines.append(f"  {option + ' ' + metavar:<20} {text} ({variable})")
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
        raise SafeLlamaError(f"safe-llama: unknown tool '{tool}': expected one of {', '.join(TOOLS)}", ExitStatus.USAGE)
    return tool


LadderOpt = Annotated[
    str | None, typer.Option("--ladder", help="Degrade steps to try, in order (e.g. stateful,ctx,kv-q4).")
]
MinCtxOpt = Annotated[int | None, typer.Option("--min-ctx", help="Never plan a context below this.")]
ProfileOpt = Annotated[str | None, typer.Option("--profile", help="A device profile in configs/devices/.")]
MaxAllocOpt = Annotated[str | None, typer.Option("--max-alloc", help="Declare the device's max allocation.")]
DevMemOpt = Annotated[str | None, typer.Option("--device-memory", help="Declare the device's memory.")]
IntegratedOpt = Annotated[
    bool | None, typer.Option("--integrated/--discrete", help="Declare the GPU integrated or not.")
]
HostMemOpt = Annotated[str | None, typer.Option("--host-memory", help="Declare the host memory budget.")]
LlamaBinOpt = Annotated[str | None, typer.Option("--llama-bin", help="The llama.cpp binary or its directory.")]
LlamaVersionOpt = Annotated[
    str | None, typer.Option("--llama-version", help="Plan for this llama.cpp version (e.g. 0.4.1-dev).")
]
KvSplitOpt = Annotated[
    bool | None,
    typer.Option("--kv-split/--kv-single", help="Force the KV allocation model: split at max alloc, or one."),
]


def plan_options(
    *,
    ladder: str | None,
    min_ctx: int | None,
    profile: str | None,
    max_alloc: str | None,
    device_memory: str | None,
    integrated: bool | None,
    host_memory: str | None,
    llama_bin: str | None,
    llama_version: str | None,
    kv_split: bool | None,
    origins: Mapping[str, str] | None = None,
) -> PlanOptions:
    from safe_llama.commands import PlanOptions
    from safe_llama.devices import declared_limits
    from safe_llama.policy import STEPS

    steps = None
    if ladder is not None:
        steps = tuple(s.strip() for s in ladder.split(",") if s.strip())
        bad = [s for s in steps if s not in STEPS]
        if bad:
            raise SafeLlamaError(
                f"safe-llama: --ladder: unknown step '{bad[0]}' (one of {', '.join(STEPS)})", ExitStatus.USAGE
            )
    if min_ctx is not None and min_ctx < 1:
        raise SafeLlamaError("safe-llama: --min-ctx: must be at least 1", ExitStatus.USAGE)
    declared = declared_limits(
        profile=profile, max_alloc=max_alloc, device_memory=device_memory, integrated=integrated,
        host_memory=host_memory, origins=origins,
    )  # fmt: skip
    return PlanOptions(
        ladder=steps, min_ctx=min_ctx, declared=declared, llama_bin=llama_bin, llama_version=llama_version,
        kv_split=kv_split,
    )  # fmt: skip


@app.command(context_settings=PASSTHROUGH)
def plan(
    tool: Annotated[str, typer.Argument(help="cli, server or completion")],
    args: Annotated[list[str] | None, typer.Argument(help="the llama.cpp tool's own arguments")] = None,
    json_out: Annotated[bool, typer.Option("--json", help="Print the plan as JSON.")] = False,
    ladder: LadderOpt = None,
    min_ctx: MinCtxOpt = None,
    profile: ProfileOpt = None,
    max_alloc: MaxAllocOpt = None,
    device_memory: DevMemOpt = None,
    integrated: IntegratedOpt = None,
    host_memory: HostMemOpt = None,
    llama_bin: LlamaBinOpt = None,
    llama_version: LlamaVersionOpt = None,
    kv_split: KvSplitOpt = None,
) -> None:
    """Show what llama.cpp will allocate for a command line, and the settings that fit."""
    from dataclasses import replace

    from safe_llama import commands, launch_args

    # the same resolution as the launch: these options over SAFE_LLAMA_* over the config file
    typed = {
        "ladder": ladder, "min_ctx": None if min_ctx is None else str(min_ctx), "profile": profile,
        "max_alloc": max_alloc, "device_memory": device_memory, "host_memory": host_memory, "bin_dir": llama_bin,
        "llama_version": llama_version,
        "integrated": None if integrated is not True else "1", "discrete": None if integrated is not False else "1",
    }  # fmt: skip
    given = {k: v for k, v in typed.items() if v is not None}
    settings, origins = launch_args.resolve_sourced(given, os.environ)
    options = replace(launch_args.launch_options(settings, origins).plan, kv_split=kv_split)
    code = commands.plan_command(tool=_check_tool(tool), args=list(args or []), json_out=json_out, options=options)
    if code:
        raise typer.Exit(code)


@app.command()
def devices(
    llama_bin: Annotated[
        str | None, typer.Option("--llama-bin", help="The llama-server to ask, or its directory.")
    ] = None,
    device: Annotated[str | None, typer.Option("--device", "-dev", help="As llama.cpp's --device.")] = None,
    openvino_device: Annotated[
        str | None, typer.Option("--openvino-device", help="GGML_OPENVINO_DEVICE: CPU, GPU, GPU.1, NPU.")
    ] = None,
    profile: Annotated[str | None, typer.Option("--profile", help="A profile in configs/devices/.")] = None,
    max_alloc: Annotated[str | None, typer.Option("--max-alloc", help="Declare the max allocation.")] = None,
    device_memory: Annotated[str | None, typer.Option("--device-memory", help="Declare its memory.")] = None,
    integrated: Annotated[
        bool | None, typer.Option("--integrated/--discrete", help="Declare the GPU integrated or not.")
    ] = None,
    host_memory: Annotated[str | None, typer.Option("--host-memory", help="Declare the host budget.")] = None,
    refresh: Annotated[bool, typer.Option("--refresh", help="Ignore cached probe results.")] = False,
    json_out: Annotated[bool, typer.Option("--json", help="Print the report as JSON.")] = False,
) -> None:
    """Show the devices, the limits that apply to the target, and the host memory budget."""
    from safe_llama import devices as devices_module

    devices_module.run_devices_command(
        llama_bin=llama_bin,
        device=device,
        openvino_device=openvino_device,
        profile=profile,
        max_alloc=max_alloc,
        device_memory=device_memory,
        integrated=integrated,
        host_memory=host_memory,
        refresh=refresh,
        json_out=json_out,
    )


@app.command(name="install-shims")
def install_shims(
    directory: Annotated[
        str | None, typer.Option("--dir", help="Where to put the links (root: /usr/local/bin, else ~/.local/bin).")
    ] = None,
    remove: Annotated[bool, typer.Option("--remove", help="Remove the links this command made.")] = False,
) -> None:
    """Put llama-cli, llama-server, llama-completion links to safe-llama's drop-ins on PATH (exit 1: one was
    left alone because a file safe-llama did not make is there)."""
    from pathlib import Path

    from safe_llama import shims

    folder = Path(directory) if directory else shims.default_dir()
    lines, ok = shims.install_shims(folder, scripts=shims.scripts_dir(), remove=remove, path=os.environ.get("PATH", ""))
    for line in lines:
        typer.echo(f"safe-llama: {line}")
    if not ok:
        raise typer.Exit(1)


@app.command()
def forget() -> None:
    """Forget every remembered plan and learned limit."""
    from safe_llama import remember

    count = remember.forget()
    typer.echo(f"safe-llama: forgot {count} remembered plan(s)")


# Options may follow the log file; llama.cpp's own options (-c 65536) are collected as the failed run's.
EXPLAIN_ARGS = {"ignore_unknown_options": True, "allow_extra_args": True}


@app.command(context_settings=EXPLAIN_ARGS)
def explain(
    file: Annotated[str, typer.Argument(help="the llama.cpp log to read; - (the default) reads stdin")] = "-",
    args: Annotated[
        list[str] | None, typer.Argument(help="the failed run's llama.cpp arguments, when the log lacks them")
    ] = None,
    model: Annotated[str | None, typer.Option("--model", "-m", help="The model, for an exact plan.")] = None,
    tool: Annotated[str | None, typer.Option("--tool", help="cli, server or completion, if the log hides it.")] = None,
    json_out: Annotated[bool, typer.Option("--json", help="Print the explanation as JSON.")] = False,
) -> None:
    """Explain a failed llama.cpp run from its log, and what would fit (exit 1: no failure recognised)."""
    from safe_llama import explain as explain_module

    code = explain_module.run_explain(
        file=file, args=list(args or []), model=model, tool=None if tool is None else _check_tool(tool),
        json_out=json_out,
    )  # fmt: skip
    if code:
        raise typer.Exit(code)


@app.command()
def doctor(
    json_out: Annotated[bool, typer.Option("--json", help="Print the checks as JSON.")] = False,
    refresh: Annotated[bool, typer.Option("--refresh", help="Ignore cached probe results.")] = False,
) -> None:
    """Check this machine's set-up for llama.cpp, one line each with a fix (exit 1: a check failed)."""
    from safe_llama import doctor as doctor_module

    code = doctor_module.run_doctor(json_out=json_out, refresh=refresh)
    if code:
        raise typer.Exit(code)


ToolArgs = Annotated[list[str] | None, typer.Argument(help="the llama.cpp tool's own arguments")]


@app.command(name="cli", context_settings=PASSTHROUGH)
def _cli(args: ToolArgs = None) -> None:
    """Run llama-cli with a plan that fits (safe-llama [options] cli [llama-cli args])."""
    raise typer.Exit(_launch("cli", list(args or []), {}))


@app.command(name="server", context_settings=PASSTHROUGH)
def _server(args: ToolArgs = None) -> None:
    """Run llama-server with a plan that fits (safe-llama [options] server [llama-server args])."""
    raise typer.Exit(_launch("server", list(args or []), {}))


@app.command(name="completion", context_settings=PASSTHROUGH)
def _completion(args: ToolArgs = None) -> None:
    """Run llama-completion with a plan that fits (safe-llama [options] completion [args])."""
    raise typer.Exit(_launch("completion", list(args or []), {}))


def _launch(tool: str, args: list[str], given: dict[str, str]) -> int:
    import os

    from safe_llama import launch, launch_args
    from safe_llama.passthrough import exec_if_no_model

    exec_if_no_model(tool, args, os.environ, given)  # help, version, usage errors: llama.cpp's own
    settings, origins = launch_args.resolve_sourced(given, os.environ)
    return launch.run(tool, args, os.environ, launch_args.launch_options(settings, origins))


def _drop_in(tool: str, argv: list[str] | None) -> int:
    args = sys.argv[1:] if argv is None else argv
    return _guarded(lambda: _launch(tool, list(args), {}))


def main_cli(argv: list[str] | None = None) -> int:
    """safe-llama-cli: exactly llama-cli's arguments."""
    return _drop_in("cli", argv)


def main_server(argv: list[str] | None = None) -> int:
    """safe-llama-server: exactly llama-server's arguments."""
    return _drop_in("server", argv)


def main_completion(argv: list[str] | None = None) -> int:
    """safe-llama-completion: exactly llama-completion's arguments."""
    return _drop_in("completion", argv)


def main(argv: list[str] | None = None) -> int:
    """Console-script entry: a launch goes straight to the launcher (no typer on that path); everything
    else runs the typer app. A symlink named llama-cli/-server/-completion behaves as that tool."""
    import os

    from safe_llama.launch_args import DROP_IN, split

    args = sys.argv[1:] if argv is None else argv
    name = os.path.basename(sys.argv[0])
    if argv is None and name in DROP_IN:
        return _drop_in(DROP_IN[name], args)
    try:
        request = split(args)
    except SafeLlamaError as err:
        sys.stderr.write(f"{err.message}\n")
        return int(err.status)
    if request is not None:
        return _guarded(lambda: _launch(request.tool, list(request.args), dict(request.settings)))
    return _guarded(lambda: _run_app(args))


def _run_app(args: list[str]) -> int:
    # without standalone mode click returns a command's typer.Exit code instead of raising it
    return int(app(args=args, prog_name="safe-llama", standalone_mode=False) or 0)


def _guarded(body: Callable[[], int]) -> int:
    """Maps every failure to a documented exit code; a message, never a traceback, for known errors."""
    try:
        return body()
    except SafeLlamaError as err:
        sys.stderr.write(f"{err.message}\n")
        return int(err.status)
    except typer.Exit as done:
        return int(done.exit_code)
    except KeyboardInterrupt:
        return int(ExitStatus.INTERRUPTED)
    except typer.Abort:
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


if __name__ == "__main__":
    sys.exit(main())
