"""safe-llama's own launch settings: the options before the tool name, SAFE_LLAMA_* variables and the
[launcher] table of ${XDG_CONFIG_HOME:-~/.config}/safe-llama/config.toml, in that order of precedence.

Owns their names and parsing (no typer here: this runs before every launch, and must stay fast).
Pure but for reading the config file.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from typing import Any, NamedTuple

from safe_llama.constants import TOOL_BINARY, TOOLS
from safe_llama.errors import ExitStatus, SafeLlamaError
from safe_llama.paths import cache_dir, config_dir

DROP_IN = {TOOL_BINARY[tool]: tool for tool in TOOLS}

# option -> (setting name, takes a value)
OPTIONS: dict[str, tuple[str, bool]] = {
    "--llama-bin": ("bin_dir", True),
    "--ladder": ("ladder", True),
    "--min-ctx": ("min_ctx", True),
    "--attempts": ("attempts", True),
    "--profile": ("profile", True),
    "--max-alloc": ("max_alloc", True),
    "--device-memory": ("device_memory", True),
    "--host-memory": ("host_memory", True),
    "--rpc-memory": ("rpc_memory", True),
    "--llama-version": ("llama_version", True),
    "--no-predict": ("predict", False),
    "--no-remember": ("remember", False),
    "--integrated": ("integrated", False),
    "--discrete": ("discrete", False),
}
# option -> (its value's name in help, what it does)
HELP: dict[str, tuple[str, str]] = {
    "--llama-bin": ("PATH", "the llama.cpp binary to run, or its bin/ directory"),
    "--ladder": ("STEPS", "degrade steps to try, in order (e.g. stateful,kv-q8,kv-q4,ctx)"),
    "--min-ctx": ("N", "never plan a context below N tokens"),
    "--attempts": ("N", "starts to try when one fails for memory (default 4)"),
    "--profile": ("NAME", "a device profile (configs/devices/NAME.toml or your own)"),
    "--max-alloc": ("SIZE", "declare the device's largest single allocation (e.g. 4G)"),
    "--device-memory": ("SIZE", "declare the device's memory (e.g. 16G)"),
    "--host-memory": ("SIZE", "declare the host memory budget (e.g. 8G)"),
    "--rpc-memory": ("H:P=SIZE,...", "declare what each RPC worker may hold (e.g. 10.0.0.2:50052=12G)"),
    "--llama-version": ("VER", "plan for this llama.cpp version (e.g. 0.4.1-dev)"),
    "--no-predict": ("", "launch as asked; plan only after a start fails"),
    "--no-remember": ("", "neither use nor store remembered plans"),
    "--integrated": ("", "declare the GPU integrated (shares host memory)"),
    "--discrete": ("", "declare the GPU discrete (its own memory)"),
}
ENV = {name: f"SAFE_LLAMA_{name.upper()}" for name, _ in OPTIONS.values()}
ENV["bin_dir"] = "SAFE_LLAMA_BIN_DIR"


class LaunchRequest(NamedTuple):  # not a dataclass: this runs before every pass-through exec
    tool: str
    args: tuple[str, ...]
    settings: Mapping[str, str]


def split(argv: Sequence[str]) -> LaunchRequest | None:
    """`[options] TOOL [llama.cpp args]` -> the request; None when argv is not a launch."""
    settings: dict[str, str] = {}
    i = 0
    while i < len(argv):
        arg = argv[i]
        if arg in TOOLS:
            return LaunchRequest(arg, tuple(argv[i + 1 :]), settings)
        name, value = arg, None
        if arg.startswith("--") and "=" in arg:
            name, value = arg.split("=", 1)
        spec = OPTIONS.get(name)
        if spec is None:
            return None
        key, takes_value = spec
        if takes_value:
            if value is None:
                if i + 1 >= len(argv):
                    raise SafeLlamaError(f"safe-llama: {name}: needs a value", ExitStatus.USAGE)
                value = argv[i + 1]
                i += 1
            settings[key] = value
        else:
            settings[key] = "0" if key in ("predict", "remember") else "1"
        i += 1
    return None


# The config file's tables and the [launcher] keys' TOML types (a size may be a number of bytes or "4G").
TABLES = ("launcher", "planner", "backends")
NUMBERS = ("min_ctx", "attempts")
FLAGS = ("predict", "remember", "integrated", "discrete")
SIZES = ("max_alloc", "device_memory", "host_memory")


def _check_launcher(path: object, launcher: Mapping[str, Any]) -> None:
    known = {key for key, _ in OPTIONS.values()}
    for key, value in launcher.items():
        where = f"safe-llama: {path}: [launcher] {key}"
        if key not in known:
            raise SafeLlamaError(f"{where}: unknown key (known: {', '.join(sorted(known))})", ExitStatus.BAD_CONFIG)
        if key in NUMBERS:
            ok = isinstance(value, int) and not isinstance(value, bool) and value >= 1
            want = "a whole number of at least 1"
        elif key in FLAGS:
            ok, want = isinstance(value, bool), "true or false"
        elif key in SIZES:
            ok = (isinstance(value, int) and not isinstance(value, bool) and value > 0) or isinstance(value, str)
            want = 'a size in bytes or a string such as "4G"'
        else:
            ok, want = isinstance(value, str), "a string"
        if not ok:
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
    for key, var in ENV.items():
        if var in env and env[var] != "":
            out[key] = env[var]
            origins[key] = var
    out.update(given)
    for key in given:
        origins.pop(key, None)
    return out, origins
