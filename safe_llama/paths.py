"""Where safe-llama keeps its cache, config and packaged policy files.

Owns path resolution from the environment; must not create or read files.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path

LLAMA_CPP_PINNED = "11434.0.0"


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


def configs_dir(env: Mapping[str, str] = os.environ) -> Path:
    """The packaged policy tables (configs/ at the top of the source tree)."""
    override = env.get("SAFE_LLAMA_CONFIGS")
    if override:
        return Path(override)
    return Path(__file__).resolve().parent.parent / "configs"


def pinned_bin_dir(flavour: str = "cpu", env: Mapping[str, str] = os.environ) -> Path:
    """Where scripts/build-llama.sh puts the pinned llama.cpp build of a flavour (cpu, openvino)."""
    return cache_dir(env) / "llama.cpp" / LLAMA_CPP_PINNED / flavour / "bin"
