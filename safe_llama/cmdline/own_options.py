"""safe-llama's own options and commands, once: the one table of every option of every command (the
launcher's, `plan`'s, the admin commands'), the one table of the admin commands (each word, the commands/
module that runs it, its help and its arguments), and the one reader of those options.

Owns the options' names, which commands take them, their values, help texts and SAFE_LLAMA_* variables, and
which module runs each command; entry.py reads argv with `read` and imports a command's module only when its
word runs, cli.py builds the help and the completion from the same rows, and cmdline.launch_args takes the
launcher's variables and config keys from here. Must stay light (no typer, no dataclasses, no command module
imported: the launch and `plan` paths read it before anything else) and must not resolve values
(launch_args, pipeline.options do).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import NamedTuple

from safe_llama.constants import TOOLS as TOOLS  # the tools a launch names (one definition)
from safe_llama.errors import ExitStatus, SafeLlamaError

LAUNCH = "launch"  # the launcher: `safe-llama [options] TOOL [llama.cpp args]`; not a command word
ROOT = "safe-llama"  # `safe-llama` itself, before any word: --version (and --help)


class Option(NamedTuple):  # not a dataclass: read before every launch
    names: tuple[str, ...]  # the first is the long name, the others its aliases
    key: str  # the setting it fills; for the launcher's, also its [launcher] key in config.toml
    commands: tuple[str, ...]  # LAUNCH and the command words that take it
    kind: str  # "text", "number", "fraction" (0.5), "size" (bytes or "4G") or "flag"
    metavar: str  # its value's name in help; "" for a flag
    help: str
    flag_value: str = ""  # what a flag stores under key
    env: str = ""  # its SAFE_LLAMA_* variable (the launcher's options)


class Argument(NamedTuple):
    name: str  # its name in help, e.g. cli|server|completion
    help: str
    many: bool = False  # takes every remaining word


class Command(NamedTuple):
    name: str
    module: str  # the commands/ module whose main(settings, words) runs it, imported only then (entry.py)
    help: str
    arguments: tuple[Argument, ...] = ()
    loose: bool = False  # words and unknown options may mix with its own options (explain)
    tool_first: bool = False  # its first word is a tool: it and everything after are llama.cpp's (plan)


DECLARE = (LAUNCH, "plan", "devices", "models")  # the commands that take the declared device and host limits
SHOWN = ("plan", "devices", "explain", "doctor", "models")  # those that can print JSON

OPTIONS: tuple[Option, ...] = (
    Option(("--llama-bin",), "bin_dir", DECLARE, "text", "PATH", "the llama.cpp binary to run, or its bin/ directory",
           env="SAFE_LLAMA_BIN_DIR"),
    Option(("--ladder",), "ladder", (LAUNCH, "plan"), "text", "STEPS",
           "degrade steps to try, in order (e.g. stateful,kv-q8,kv-q4,ctx)", env="SAFE_LLAMA_LADDER"),
    Option(("--min-ctx",), "min_ctx", (LAUNCH, "plan"), "number", "N", "never plan a context below N tokens",
           env="SAFE_LLAMA_MIN_CTX"),
    Option(("--share",), "share", (LAUNCH, "plan"), "fraction", "F",
           "take at most this share of the device's and the host's memory (e.g. 0.5; others plan beside it)",
           env="SAFE_LLAMA_SHARE"),
    Option(("--attempts",), "attempts", (LAUNCH,), "number", "N",
           "starts to try when one fails for memory (default 4)", env="SAFE_LLAMA_ATTEMPTS"),
    Option(("--profile",), "profile", DECLARE, "text", "NAME",
           "a device profile (configs/devices/NAME.toml or your own)", env="SAFE_LLAMA_PROFILE"),
    Option(("--max-alloc",), "max_alloc", DECLARE, "size", "SIZE",
           "declare the device's largest single allocation (e.g. 4G)", env="SAFE_LLAMA_MAX_ALLOC"),
    Option(("--device-memory",), "device_memory", DECLARE, "size", "SIZE", "declare the device's memory (e.g. 16G)",
           env="SAFE_LLAMA_DEVICE_MEMORY"),
    Option(("--host-memory",), "host_memory", DECLARE, "size", "SIZE", "declare the host memory budget (e.g. 8G)",
           env="SAFE_LLAMA_HOST_MEMORY"),
    Option(("--rpc-memory",), "rpc_memory", (LAUNCH, "plan"), "text", "H:P=SIZE,...",
           "declare what each RPC worker may hold (e.g. 10.0.0.2:50052=12G)", env="SAFE_LLAMA_RPC_MEMORY"),
    Option(("--llama-version",), "llama_version", (LAUNCH, "plan"), "text", "VER",
           "plan for this llama.cpp version (e.g. 0.4.1-dev)", env="SAFE_LLAMA_LLAMA_VERSION"),
    Option(("--no-predict",), "predict", (LAUNCH,), "flag", "", "launch as asked; plan only after a start fails",
           flag_value="0", env="SAFE_LLAMA_PREDICT"),
    Option(("--no-remember",), "remember", (LAUNCH,), "flag", "", "neither use nor store remembered plans",
           flag_value="0", env="SAFE_LLAMA_REMEMBER"),
    Option(("--no-hand-off",), "hand_off", (LAUNCH,), "flag", "",
           "keep the full supervisor once llama-server is ready (no small handed one)", flag_value="0",
           env="SAFE_LLAMA_HAND_OFF"),
    Option(("--integrated",), "integrated", DECLARE, "flag", "", "declare the GPU integrated (shares host memory)",
           flag_value="1", env="SAFE_LLAMA_INTEGRATED"),
    Option(("--discrete",), "discrete", DECLARE, "flag", "", "declare the GPU discrete (its own memory)",
           flag_value="1", env="SAFE_LLAMA_DISCRETE"),
    Option(("--kv-split",), "kv_split", ("plan",), "flag", "", "force the KV allocation model: split at max alloc",
           flag_value="1"),
    Option(("--kv-single",), "kv_split", ("plan",), "flag", "", "force the KV allocation model: one allocation",
           flag_value="0"),
    Option(("--device", "-dev"), "device", ("devices",), "text", "DEV", "as llama.cpp's --device"),
    Option(("--openvino-device",), "openvino_device", ("devices",), "text", "DEV",
           "GGML_OPENVINO_DEVICE: CPU, GPU, GPU.1, NPU"),
    Option(("--refresh",), "refresh", ("devices", "doctor"), "flag", "", "ignore cached probe results", flag_value="1"),
    Option(("--model", "-m"), "model", ("explain",), "text", "PATH", "the model, for an exact plan"),
    Option(("--tool",), "tool", ("explain", "models"), "text", "TOOL",
           "cli, server or completion: explain's if the log hides it; models' plan is server's by default"),
    Option(("--follow",), "follow", ("explain",), "flag", "",
           "keep reading a stream (journalctl -f): explain each failure once the log goes quiet", flag_value="1"),
    Option(("--dir",), "dir", ("install-shims",), "text", "DIR",
           "where to put the links (root: /usr/local/bin, else ~/.local/bin)"),
    Option(("--remove",), "remove", ("install-shims",), "flag", "", "remove the links this command made",
           flag_value="1"),
    Option(("--version",), "version", (ROOT,), "flag", "", "print the version and exit", flag_value="1"),
    Option(("--json",), "json", SHOWN, "flag", "", "print the result as JSON", flag_value="1"),
)  # fmt: skip

TOOL_ARGS = Argument("args", "the llama.cpp tool's own arguments", many=True)
TOOL_HINT = "(e.g. safe-llama plan server -m model.gguf)"  # where a command's tool goes, in its usage error
COMMANDS: dict[str, Command] = {command.name: command for command in (
    Command("plan", "safe_llama.commands.plan",
            "Show what llama.cpp will allocate for a command line, and the settings that fit.",
            (Argument("cli|server|completion", "cli, server or completion"), TOOL_ARGS), tool_first=True),
    Command("devices", "safe_llama.commands.devices",
            "Show the devices, the limits that apply to the target, and the host memory budget."),
    Command("install-shims", "safe_llama.commands.shims",
            "Put llama-cli, llama-server, llama-completion links to safe-llama's drop-ins on PATH "
            "(exit 1: one was left alone because a file safe-llama did not make is there)."),
    Command("forget", "safe_llama.commands.forget", "Forget every remembered plan and learned limit."),
    Command("explain", "safe_llama.commands.explain",
            "Explain a failed llama.cpp run from its log, and what would fit (exit 1: no failure recognised).",
            (Argument("file", "the llama.cpp log to read; - (the default) reads stdin"),
             Argument("args", "the failed run's llama.cpp arguments, when the log lacks them", many=True)),
            loose=True),
    Command("models", "safe_llama.commands.models",
            "Show every model on this machine and the largest context each gets on each device and the host.",
            (Argument("PATH", "folders or files to scan besides the usual stores"),
             Argument("args", "llama.cpp memory flags to plan every model with (-c, -ctk, -ngl, -np ...)", many=True)),
            loose=True),
    Command("doctor", "safe_llama.commands.doctor",
            "Check this machine's set-up for llama.cpp, one line each with a fix (exit 1: a check failed)."),
)}  # fmt: skip
HELP = "--help"  # every command's; it prints the help instead of running


def options_of(command: str) -> dict[str, Option]:
    """The options `command` (a command word or LAUNCH) takes, by each of their names."""
    return {name: option for option in OPTIONS if command in option.commands for name in option.names}


class Reading(NamedTuple):
    settings: dict[str, str]  # key -> value as given (a flag: its flag_value); the last one given wins
    words: list[str]  # the rest (the launcher, a tool_first command: the first word and everything after)
    help: bool  # --help was among the options


def read(command: str, args: list[str]) -> Reading:
    """Read `command`'s own options (a command word, or LAUNCH) from args. For the launcher and a tool_first
    command the first word ends them (it and all after go to words, untouched: a tool and its llama.cpp
    arguments); otherwise words may come between options, and an unknown option is a word too when the
    command is loose (explain's failed run), an error when not. Raises SafeLlamaError, one line naming the
    option, for an unknown option or a missing value."""
    known = options_of(command)
    row = COMMANDS.get(command)
    loose = row is not None and row.loose
    stop_at_word = command == LAUNCH or (row is not None and row.tool_first)
    where = "safe-llama" if command == LAUNCH else f"safe-llama {command}"
    settings: dict[str, str] = {}
    words: list[str] = []
    i = 0
    while i < len(args):
        arg = args[i]
        if arg == "--":
            return Reading(settings, words + args[i + 1 :], False)
        if arg == HELP:
            return Reading(settings, words, True)
        if arg[:1] != "-" or arg == "-":
            if stop_at_word:
                return Reading(settings, args[i:], False)
            words.append(arg)
            i += 1
            continue
        name, eq, value = arg.partition("=") if arg.startswith("--") else (arg, "", "")
        option = known.get(name)
        if option is None:
            if loose:
                words.append(arg)
                i += 1
                continue
            raise SafeLlamaError(f"safe-llama: {name}: no such option (see {where} --help)", ExitStatus.USAGE)
        if option.kind == "flag":
            if eq:
                raise SafeLlamaError(f"safe-llama: {name}: takes no value", ExitStatus.USAGE)
            value = option.flag_value
        elif not eq:
            if i + 1 >= len(args):
                raise SafeLlamaError(f"safe-llama: {name}: needs a value", ExitStatus.USAGE)
            i += 1
            value = args[i]
        settings[option.key] = value
        i += 1
    return Reading(settings, words, False)


FALSE = ("0", "false", "no", "off")  # a flag's setting that says no, in any case
TRUE = ("1", "true", "yes", "on")  # ...and yes: a SAFE_LLAMA_* flag set to anything else is refused (launch_args)


def flag(settings: Mapping[str, str], key: str) -> bool | None:
    """A flag's setting as a truth value, however it was given (its option's flag_value, a SAFE_LLAMA_*
    variable, config.toml's true/false): the one reader of true and false. None when not given."""
    value = settings.get(key)
    return None if value is None else value.strip().lower() not in FALSE


def integrated(settings: Mapping[str, str]) -> bool | None:
    """--integrated / --discrete (and their variables) as one answer: discrete wins, as in launch_options."""
    if flag(settings, "discrete"):
        return False
    return True if flag(settings, "integrated") else None
