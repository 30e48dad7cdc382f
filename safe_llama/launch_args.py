"""safe-llama's own launch settings: the options before the tool name, SAFE_LLAMA_* variables and the
[launcher] table of ${XDG_CONFIG_HOME:-~/.config}/safe-llama/config.toml, in that order of precedence.

Owns their names and parsing (no typer here: this runs before every launch, and must stay fast).
Pure but for reading the config file.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, NamedTuple

from safe_llama.errors import ExitStatus, SafeLlamaError
from safe_llama.paths import config_dir

TOOLS = ("cli", "server", "completion")
DROP_IN = {"llama-cli": "cli", "llama-server": "server", "llama-completion": "completion"}

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
    "--llama-version": ("llama_version", True),
    "--no-predict": ("predict", False),
    "--no-remember": ("remember", False),
    "--integrated": ("integrated", False),
    "--discrete": ("discrete", False),
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


def _config_path(env: Mapping[str, str]) -> Any:
    return config_dir(env) / "config.toml"


def _config(env: Mapping[str, str]) -> dict[str, Any]:
    path = config_dir(env) / "config.toml"
    try:
        text = path.read_text()
    except FileNotFoundError:
        return {}
    except OSError as err:
        raise SafeLlamaError(f"safe-llama: {path}: {err}", ExitStatus.BAD_CONFIG) from None
    import tomllib  # only with a config file: the pass-through path stays light

    try:
        raw = tomllib.loads(text)
    except (OSError, tomllib.TOMLDecodeError) as err:
        raise SafeLlamaError(f"safe-llama: {path}: {err}", ExitStatus.BAD_CONFIG) from None
    launcher = raw.get("launcher", {})
    if not isinstance(launcher, dict):
        raise SafeLlamaError(f"safe-llama: {path}: [launcher] must be a table", ExitStatus.BAD_CONFIG)
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


def _truthy(value: str | None, default: bool) -> bool:
    if value is None:
        return default
    return value.lower() not in ("0", "false", "no", "off")


def launch_options(settings: Mapping[str, str], origins: Mapping[str, str] | None = None) -> Any:
    from safe_llama.cli import plan_options
    from safe_llama.launch import DEFAULT_ATTEMPTS, LaunchOptions

    def number(key: str) -> int | None:
        if key not in settings:
            return None
        try:
            return int(settings[key])
        except ValueError:
            where = (origins or {}).get(key, "--" + key.replace("_", "-"))
            raise SafeLlamaError(
                f"safe-llama: {where}: '{settings[key]}' is not a whole number", ExitStatus.USAGE
            ) from None

    integrated = True if _truthy(settings.get("integrated"), False) else None
    if _truthy(settings.get("discrete"), False):
        integrated = False
    plan = plan_options(
        ladder=settings.get("ladder"),
        min_ctx=number("min_ctx"),
        profile=settings.get("profile"),
        max_alloc=settings.get("max_alloc"),
        device_memory=settings.get("device_memory"),
        integrated=integrated,
        host_memory=settings.get("host_memory"),
        llama_bin=settings.get("bin_dir"),
        llama_version=settings.get("llama_version"),
        kv_split=None,
        origins=origins,
    )
    attempts = number("attempts") or DEFAULT_ATTEMPTS
    if attempts < 1:
        raise SafeLlamaError("safe-llama: --attempts: must be at least 1", ExitStatus.USAGE)
    return LaunchOptions(
        plan=plan,
        predict=_truthy(settings.get("predict"), True),
        attempts=attempts,
        remember=_truthy(settings.get("remember"), True),
    )
