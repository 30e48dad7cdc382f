"""The command line: collects options and makes one call per command.

Owns argument parsing and rendering choices; must not hold policy (that lives in the core modules and
configs/). Heavy modules are imported inside the commands so `--help` and the launch path stay fast.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Annotated

import typer

from safe_llama import __version__
from safe_llama.constants import TOOLS
from safe_llama.errors import ExitStatus, SafeLlamaError


def _epilog() -> str:
    from safe_llama.cmdline.launch_args import ENV, HELP, OPTIONS

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


def _check_tool(tool: str | None) -> str:
    if tool is None:
        raise SafeLlamaError(
            f"safe-llama: which tool? Expected one of {', '.join(TOOLS)} (e.g. safe-llama plan server -m model.gguf)",
            ExitStatus.USAGE,
        )
    if tool not in TOOLS:
        raise SafeLlamaError(f"safe-llama: unknown tool '{tool}': expected one of {', '.join(TOOLS)}", ExitStatus.USAGE)
    return tool


TOOL_METAVAR = "cli|server|completion"
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
RpcMemOpt = Annotated[
    str | None, typer.Option("--rpc-memory", help="What each RPC worker may hold: HOST:PORT=SIZE[,...].")
]
LlamaBinOpt = Annotated[str | None, typer.Option("--llama-bin", help="The llama.cpp binary or its directory.")]
LlamaVersionOpt = Annotated[
    str | None, typer.Option("--llama-version", help="Plan for this llama.cpp version (e.g. 0.4.1-dev).")
]
KvSplitOpt = Annotated[
    bool | None,
    typer.Option("--kv-split/--kv-single", help="Force the KV allocation model: split at max alloc, or one."),
]


@app.command(context_settings=PASSTHROUGH)
def plan(
    # optional for typer, so that a missing tool gets _check_tool's words (naming the three) instead of click's
    tool: Annotated[str | None, typer.Argument(help="cli, server or completion", metavar=TOOL_METAVAR)] = None,
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
    rpc_memory: RpcMemOpt = None,
) -> None:
    """Show what llama.cpp will allocate for a command line, and the settings that fit."""
    from safe_llama.commands.plan import run_plan

    code = run_plan(
        tool=_check_tool(tool), args=list(args or []), json_out=json_out, ladder=ladder, min_ctx=min_ctx,
        profile=profile, max_alloc=max_alloc, device_memory=device_memory, integrated=integrated,
        host_memory=host_memory, llama_bin=llama_bin, llama_version=llama_version, kv_split=kv_split,
        rpc_memory=rpc_memory,
    )  # fmt: skip
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
    from safe_llama.commands import devices as devices_module

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

    from safe_llama.commands import shims

    folder = Path(directory) if directory else shims.default_dir()
    lines, ok = shims.install_shims(folder, scripts=shims.scripts_dir(), remove=remove, path=os.environ.get("PATH", ""))
    for line in lines:
        typer.echo(f"safe-llama: {line}")
    if not ok:
        raise typer.Exit(1)


@app.command()
def forget() -> None:
    """Forget every remembered plan and learned limit."""
    from safe_llama.run import remember

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
    from safe_llama.commands import explain as explain_module

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
    from safe_llama.commands import doctor as doctor_module

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


@app.command(name="rpc-server", context_settings=PASSTHROUGH)
def _rpc_server(args: ToolArgs = None) -> None:
    """Run llama.cpp's RPC worker (ggml-rpc-server) supervised: READY to systemd when it listens, its exit code."""
    from safe_llama.run.worker import run_rpc_server

    raise typer.Exit(run_rpc_server(list(args or [])))


def _launch(tool: str, args: list[str], given: dict[str, str]) -> int:
    from safe_llama.run.launch import launch
    from safe_llama.run.passthrough import pass_through_early

    pass_through_early(tool, args, given)  # help, version, usage errors: llama.cpp's own
    return launch(tool, args, given)


def run_app(args: list[str]) -> int:
    # without standalone mode click returns a command's typer.Exit code instead of raising it
    return _guarded(lambda: int(app(args=args, prog_name="safe-llama", standalone_mode=False) or 0))


def _guarded(body: Callable[[], int]) -> int:
    """entry.guarded, with typer's own ways out (Exit, Abort) mapped to their codes."""
    from safe_llama.run.exits import guarded

    def typer_codes() -> int:
        try:
            return body()
        except typer.Exit as done:
            return int(done.exit_code)
        except typer.Abort:
            return int(ExitStatus.INTERRUPTED)

    return guarded(typer_codes)
