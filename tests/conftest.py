"""Shared fixtures: the real parts (pinned llama.cpp builds, the bundled model, pocl, lavapipe).

A real part that is missing is an error, not a skip: scripts/setup.sh installs all of them, and a test
that silently skips proves nothing.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from safe_llama.model.bundled import bundled_model_path
from safe_llama.paths import pinned_bin_dir


def _bin_dir(flavour: str) -> Path:
    path = pinned_bin_dir(flavour, os.environ)
    if not (path / "llama-server").is_file():
        pytest.fail(f"pinned llama.cpp ({flavour}) not built: run scripts/build-llama.sh {flavour}")
    return path


@pytest.fixture(scope="session")
def llama_bin() -> Path:
    """bin/ of the pinned CPU build: llama-cli, llama-server, llama-completion."""
    return _bin_dir("cpu")


@pytest.fixture(scope="session")
def openvino_bin() -> Path:
    """bin/ of the pinned OpenVINO-enabled build."""
    return _bin_dir("openvino")


@pytest.fixture(scope="session")
def vulkan_bin() -> Path:
    """bin/ of the pinned Vulkan build (tests run it on Mesa's lavapipe)."""
    return _bin_dir("vulkan")


@pytest.fixture(scope="session")
def bundled_model() -> Path:
    return bundled_model_path(os.environ)


@pytest.fixture
def clean_env() -> dict[str, str]:
    """The environment without LLAMA_ARG_* and SAFE_LLAMA_* settings that would change a test's meaning."""
    return {k: v for k, v in os.environ.items() if not k.startswith(("LLAMA_ARG_", "SAFE_LLAMA_"))}


def console_script(name: str) -> Path:
    """An installed console script of this package, from the running interpreter's scripts directory
    (not PATH: `python3 -m pip install` does not refresh version managers' shims)."""
    import sysconfig

    path = Path(sysconfig.get_path("scripts")) / name
    if not path.is_file():
        pytest.fail(f"{name} is not installed in {path.parent}: pip install -e .")
    return path
