"""safe-llama's own launch settings: the options before the tool name, SAFE_LLAMA_* variables and the
[launcher] table of ${XDG_CONFIG_HOME:-~/.config}/safe-llama/config.toml, in that order of precedence.

Owns the reading of a launch's words and the resolution of its settings; the options themselves (names,
variables, config keys and kinds) are rows of cmdline.own_options. No typer here: this runs before every
launch, and must stay fast. Pure but for reading the config file.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping, Sequence
from typing import Any, NamedTuple

from safe_llama.cmdline.own_options import FALSE, LAUNCH, OPTIONS, TRUE, read
from safe_llama.constants import TOOL_BINARY, TOOLS
from safe_llama.errors import ExitStatus, SafeLlamaError
from safe_llama.paths import cache_dir, config_dir

DROP_IN = {TOOL_BINARY[tool]: tool for tool in TOOLS}

# the launcher's options, rows of the one table, by their key (also their [launcher] key in config.toml)
LAUNCHER = {option.key: option for option in OPTIONS if LAUNCH in option.commands}


class LaunchRequest(NamedTuple):  # not a dataclass: this runs before every pass-through exec
    tool: str
    args: tuple[str, ...]
    settings: Mapping[str, str]


def split(argv: Sequence[str]) -> LaunchRequest | None:
    """`[options] TOOL [llama.cpp args]` -> the request; None when --help came before the tool (the caller
    shows the help). Raises SafeLlamaError (one line) for an unknown option, a missing value, a missing or
    unknown tool."""
    reading = read(LAUNCH, list(argv))
    if reading.help:
        return None
    tool = check_tool(reading.words[0] if reading.words else None, "after the launcher options")
    return LaunchRequest(tool, tuple(reading.words[1:]), reading.settings)


def check_tool(tool: str | None, hint: str) -> str:
    """The tool a command names, or a one-line usage error: none named (hint says where one goes), or not one
    of TOOLS."""
    if tool is None:
        raise SafeLlamaError(f"safe-llama: which tool? Expected one of {', '.join(TOOLS)} {hint}", ExitStatus.USAGE)
    if tool not in TOOLS:
        raise SafeLlamaError(f"safe-llama: unknown tool '{tool}': expected one of {', '.join(TOOLS)}", ExitStatus.USAGE)
    return tool


# The config file's tables, and what a [launcher] key of each kind of option may hold in TOML (a size may be a
# number of bytes or "4G"): the check, and the words of its error.
TABLES = ("launcher", "planner", "backends")


def _whole(value: object, least: int) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= least


TOML_KINDS: dict[str, tuple[Callable[[object], bool], str]] = {
    "number": (lambda value: _whole(value, 1), "a whole number of at least 1"),
    "flag": (lambda value: isinstance(value, bool), "true or false"),
    "fraction": (lambda value: isinstance(value, (int, float)) and not isinstance(value, bool), "a number (e.g. 0.5)"),
    "size": (lambda value: _whole(value, 1) or isinstance(value, str), 'a size in bytes or a string such as "4G"'),
    "text": (lambda value: isinstance(value, str), "a string"),
}


def _check_launcher(path: object, launcher: Mapping[str, Any]) -> None:
    for key, value in launcher.items():
        where = f"safe-llama: {path}: [launcher] {key}"
        if key not in LAUNCHER:
            raise SafeLlamaError(f"{where}: unknown key (known: {', '.join(sorted(LAUNCHER))})", ExitStatus.BAD_CONFIG)
        ok, want = TOML_KINDS[LAUNCHER[key].kind]
        if not ok(value):
            raise SafeLlamaError(f"{where}: {value!r} is not {want}", ExitStatus.BAD_CONFIG)


def _config_path(env: Mapping[str, str]) -> Any:
    return config_dir(env) / "config.toml"


def _config(env: Mapping[str, str]) -> dict[str, Any]:
    path = config_dir(env) / "config.toml"
    if not os.path.lexists(path):
        return {}
    from safe_llama import state  # only with a config file: the pass-through path stays light

    try:
        raw = state.load_toml(path, cache_dir(env))
    except FileNotFoundError:
        return {}
    except (OSError, ValueError) as err:  # unreadable, not UTF-8, not TOML
        raise SafeLlamaError(f"safe-llama: {path}: {err}", ExitStatus.BAD_CONFIG) from None
    for table, value in raw.items():
        if table not in TABLES:
            raise SafeLlamaError(
                f"safe-llama: {path}: unknown table or key '{table}' (known: [{'], ['.join(TABLES)}])",
                ExitStatus.BAD_CONFIG,
            )
        if not isinstance(value, dict):
            raise SafeLlamaError(f"safe-llama: {path}: [{table}] must be a table", ExitStatus.BAD_CONFIG)
    launcher: dict[str, Any] = raw.get("launcher", {})
    _check_launcher(path, launcher)
    return launcher


def resolve(given: Mapping[str, str], env: Mapping[str, str]) -> dict[str, str]:
    """Command line over SAFE_LLAMA_* over the config file."""
    return resolve_sourced(given, env)[0]


def resolve_sourced(given: Mapping[str, str], env: Mapping[str, str]) -> tuple[dict[str, str], dict[str, str]]:
    """resolve(), and where each setting not given as an option came from (SAFE_LLAMA_*, the config
    file), so a reason can name it truthfully."""
    config = _config(env)
    out = {k: str(v).lower() if isinstance(v, bool) else str(v) for k, v in config.items()}
    origins = {k: f"{_config_path(env)} [launcher] {k}" for k in config}
    for key, option in LAUNCHER.items():
        if env.get(option.env, "") != "":
            out[key] = env[option.env]
            origins[key] = option.env
            if option.kind == "flag" and out[key].strip().lower() not in TRUE + FALSE:
                raise SafeLlamaError(
                    f"safe-llama: {option.env}: {out[key][:40]!r} is not one of {', '.join(TRUE + FALSE)}",
                    ExitStatus.USAGE,
                )
    out.update(given)
    for key in given:
        origins.pop(key, None)
    return out, origins
