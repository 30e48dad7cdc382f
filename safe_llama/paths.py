"""Where safe-llama keeps its cache, config, packaged policy files, and the shared install.

Owns path resolution from the environment; must not create or read files (it may stat them to say
which of two install places holds something).

Two places can hold the pinned llama.cpp build and the bundled model:
- the system-wide prefix (/opt/safe-llama, or SAFE_LLAMA_PREFIX), written when scripts/setup.sh runs as
  root, readable by every user and by the systemd service's dynamic user;
- the user's cache (${XDG_CACHE_HOME:-~/.cache}/safe-llama), written when a normal user runs the set-up.
A build or model in the user's cache wins; otherwise the system-wide one is used.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path

LLAMA_CPP_PINNED = "11434.0.0"
SYSTEM_PREFIX = "/opt/safe-llama"


def _xdg(env: Mapping[str, str], name: str, fallback: str) -> Path:
    value = env.get(name, "")
    # The XDG spec says relative values are invalid and must be ignored.
    if value and os.path.isabs(value):
        return Path(value)
    return Path(env.get("HOME", str(Path.home()))) / fallback


def cache_dir(env: Mapping[str, str] = os.environ) -> Path:
    return _xdg(env, "XDG_CACHE_HOME", ".cache") / "safe-llama"


def config_dir(env: Mapping[str, str] = os.environ) -> Path:
    return _xdg(env, "XDG_CONFIG_HOME", ".config") / "safe-llama"


def system_prefix(env: Mapping[str, str] = os.environ) -> Path:
    """The system-wide install (venv, pinned llama.cpp, bundled model) that root's set-up writes."""
    value = env.get("SAFE_LLAMA_PREFIX", "")
    return Path(value) if value and os.path.isabs(value) else Path(SYSTEM_PREFIX)


def configs_dir(env: Mapping[str, str] = os.environ) -> Path:
    """The packaged policy tables: package data in an installed wheel (safe_llama/configs), configs/ at
    the top of the source tree in a checkout or an editable install."""
    override = env.get("SAFE_LLAMA_CONFIGS")
    if override:
        return Path(override)
    # importlib.resources.files("safe_llama") names this same directory for a package on disk (the only
    # kind the Path below can read), at the cost of importing zipfile and tempfile on every launch
    package = Path(__file__).parent
    packaged = package / "configs"
    return packaged if packaged.is_dir() else package.parent / "configs"


def _pinned(root: Path, flavour: str) -> Path:
    return root / "llama.cpp" / LLAMA_CPP_PINNED / flavour / "bin"


def pinned_bin_dirs(flavour: str = "cpu", env: Mapping[str, str] = os.environ) -> list[tuple[str, Path]]:
    """Where scripts/build-llama.sh may have put the pinned build, in lookup order, each with why."""
    return [
        ("the user's cache", _pinned(cache_dir(env), flavour)),
        ("the system-wide install", _pinned(system_prefix(env), flavour)),
    ]


def pinned_bin_dir(flavour: str = "cpu", env: Mapping[str, str] = os.environ) -> Path:
    """The pinned build of a flavour (cpu, openvino): the first place that has a finished build, else the
    place a build by this user would go (root: system-wide; others: their cache)."""
    for _, path in pinned_bin_dirs(flavour, env):
        if (path.parent / ".complete").is_file():
            return path
    return pinned_home(flavour, env)


def pinned_home(flavour: str = "cpu", env: Mapping[str, str] = os.environ) -> Path:
    """Where this user's build of the pinned llama.cpp goes."""
    root = system_prefix(env) if os.geteuid() == 0 else cache_dir(env)
    return _pinned(root, flavour)


def bundled_model_dirs(env: Mapping[str, str] = os.environ) -> list[Path]:
    """Where the assembled bundled model may be, in lookup order."""
    return [cache_dir(env) / "models", system_prefix(env) / "models"]
