"""Where safe-llama keeps its cache, config, packaged policy files, and the shared install.

Owns path resolution from the environment, which every function takes as an argument (the shell passes
os.environ or a launch's recording mapping: nothing here reads the process's own); must not create or read
files (it may stat them to say which of two install places holds something, or that SAFE_LLAMA_CONFIGS
lacks one). The rules themselves (XDG,
the packaged configs) are constants.py's, shared with the early start.

Two places can hold the pinned llama.cpp build and the bundled model:
- the system-wide prefix (/opt/safe-llama, or SAFE_LLAMA_PREFIX), written when scripts/setup.sh runs as
  root, readable by every user and by the systemd service's dynamic user;
- the user's cache (${XDG_CACHE_HOME:-~/.cache}/safe-llama), written when a normal user runs the set-up.
A build or model in the user's cache wins; otherwise the system-wide one is used. A build in a place
someone else can write (trust.problem) is not chosen.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path

from safe_llama import constants, trust
from safe_llama.errors import ExitStatus, SafeLlamaError

LLAMA_CPP_PINNED = "11434.0.0"
SYSTEM_PREFIX = "/opt/safe-llama"


def cache_dir(env: Mapping[str, str]) -> Path:
    return Path(constants.cache_root(env))


def config_dir(env: Mapping[str, str]) -> Path:
    return Path(constants.config_root(env))


def system_prefix(env: Mapping[str, str]) -> Path:
    """The system-wide install (venv, pinned llama.cpp, bundled model) that root's set-up writes."""
    value = env.get("SAFE_LLAMA_PREFIX", "")
    return Path(value) if value and os.path.isabs(value) else Path(SYSTEM_PREFIX)


# The policy files read from configs_dir() (the rest stay the packaged ones): a SAFE_LLAMA_CONFIGS folder holds
# every one, so a missing one is named at once rather than by whichever command first reads it. devices/ may lack.
POLICY_FILES = ("planner.toml", "bundled-model.toml", "explain.toml", "own-lines.toml")


def configs_dir(env: Mapping[str, str]) -> Path:
    """The policy files in use: SAFE_LLAMA_CONFIGS, else the packaged ones. A SAFE_LLAMA_CONFIGS that is not a
    folder holding POLICY_FILES is one line (exit 66), whichever command reads it."""
    chosen = env.get("SAFE_LLAMA_CONFIGS")
    if chosen:
        where = f"safe-llama: SAFE_LLAMA_CONFIGS={chosen}"
        if not os.path.isdir(chosen):
            raise SafeLlamaError(
                f"{where}: not a folder (a copy of the packaged {packaged_configs()} to change)", ExitStatus.BAD_CONFIG
            )
        lacking = [name for name in POLICY_FILES if not os.path.isfile(os.path.join(chosen, name))]
        if lacking:
            raise SafeLlamaError(
                f"{where}: lacks {', '.join(lacking)} (it needs {', '.join(POLICY_FILES)}: copy them from "
                f"{packaged_configs()})",
                ExitStatus.BAD_CONFIG,
            )
    return Path(constants.configs_root(env))


def packaged_configs() -> Path:
    """The packaged policy files (what describes llama.cpp and safe-llama themselves: the option table, the
    secret options, the error signatures; and the defaults tests compare against)."""
    # importlib.resources.files("safe_llama") names this same directory for a package on disk (the only
    # kind the Path below can read), at the cost of importing zipfile and tempfile on every launch
    return Path(constants.packaged_configs())


def _pinned(root: Path, flavour: str) -> Path:
    return root / "llama.cpp" / LLAMA_CPP_PINNED / flavour / "bin"


def pinned_bin_dirs(flavour: str, env: Mapping[str, str]) -> list[tuple[str, Path]]:
    """Where scripts/build-llama.sh may have put the pinned build, in lookup order, each with why."""
    return [
        ("the user's cache", _pinned(cache_dir(env), flavour)),
        ("the system-wide install", _pinned(system_prefix(env), flavour)),
    ]


def pinned_bin_dir(flavour: str, env: Mapping[str, str]) -> Path:
    """The pinned build of a flavour (cpu, openvino): the first place that has a finished build, else the
    place a build by this user would go (root: system-wide; others: their cache)."""
    for _, path in pinned_bin_dirs(flavour, env):
        if (path.parent / ".complete").is_file() and trust.problem(path) is None:
            return path
    return pinned_home(flavour, env)


def pinned_home(flavour: str, env: Mapping[str, str]) -> Path:
    """Where this user's build of the pinned llama.cpp goes."""
    root = system_prefix(env) if os.geteuid() == 0 else cache_dir(env)
    return _pinned(root, flavour)


def bundled_model_dirs(env: Mapping[str, str]) -> list[Path]:
    """Where the assembled bundled model may be, in lookup order."""
    return [cache_dir(env) / "models", system_prefix(env) / "models"]
