"""paths.py: the cache, config and policy folders from a given environment, the system-wide prefix, and where
the pinned llama.cpp build and the bundled model are looked for (the user's cache first, then the prefix)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from safe_llama.paths import (
    LLAMA_CPP_PINNED,
    POLICY_FILES,
    bundled_model_dirs,
    cache_dir,
    config_dir,
    configs_dir,
    packaged_configs,
    pinned_bin_dir,
    pinned_bin_dirs,
    pinned_home,
    system_prefix,
)


def test_relative_xdg_cache_home_is_ignored(tmp_path: Path) -> None:
    assert cache_dir({"XDG_CACHE_HOME": "relative/dir", "HOME": str(tmp_path)}) == tmp_path / ".cache" / "safe-llama"
    assert cache_dir({"XDG_CACHE_HOME": str(tmp_path), "HOME": "/nowhere"}) == tmp_path / "safe-llama"
    assert os.path.isabs(cache_dir({}))


def test_config_dir_follows_xdg_config_home() -> None:
    assert config_dir({"XDG_CONFIG_HOME": "/c", "HOME": "/h"}) == Path("/c/safe-llama")
    assert config_dir({"HOME": "/h"}) == Path("/h/.config/safe-llama")


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        pytest.param("/srv/sl", "/srv/sl", id="absolute"),
        pytest.param("srv/sl", "/opt/safe-llama", id="relative-ignored"),
        pytest.param("", "/opt/safe-llama", id="empty"),
    ],
)
def test_system_prefix(value: str, expected: str) -> None:
    assert system_prefix({"SAFE_LLAMA_PREFIX": value}) == Path(expected)


def test_configs_dir_is_the_override_or_the_packaged_one(tmp_path: Path) -> None:
    for name in POLICY_FILES:
        (tmp_path / name).write_text("")
    assert configs_dir({"SAFE_LLAMA_CONFIGS": str(tmp_path)}) == tmp_path
    assert configs_dir({}) == packaged_configs()
    assert (packaged_configs() / "planner.toml").is_file()


def _env(tmp_path: Path) -> dict[str, str]:
    return {"XDG_CACHE_HOME": str(tmp_path / "cache"), "SAFE_LLAMA_PREFIX": str(tmp_path / "prefix")}


def test_pinned_build_is_looked_for_in_the_cache_then_the_prefix(tmp_path: Path) -> None:
    env = _env(tmp_path)
    places = pinned_bin_dirs("cpu", env)
    assert [why for why, _ in places] == ["the user's cache", "the system-wide install"]
    assert [p for _, p in places] == [
        tmp_path / "cache" / "safe-llama" / "llama.cpp" / LLAMA_CPP_PINNED / "cpu" / "bin",
        tmp_path / "prefix" / "llama.cpp" / LLAMA_CPP_PINNED / "cpu" / "bin",
    ]


def test_pinned_bin_dir_takes_the_first_finished_build(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    env = _env(tmp_path)
    (cache_bin, prefix_bin) = (p for _, p in pinned_bin_dirs("vulkan", env))
    monkeypatch.setattr(os, "geteuid", lambda: 1000)
    assert pinned_bin_dir("vulkan", env) == cache_bin  # nothing finished: where this user's build goes
    prefix_bin.mkdir(parents=True)
    (prefix_bin.parent / ".complete").touch()
    assert pinned_bin_dir("vulkan", env) == prefix_bin
    cache_bin.mkdir(parents=True)
    assert pinned_bin_dir("vulkan", env) == prefix_bin  # an unfinished build in the cache is passed over
    (cache_bin.parent / ".complete").touch()
    assert pinned_bin_dir("vulkan", env) == cache_bin


def test_pinned_home_is_system_wide_for_root_only(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    env = _env(tmp_path)
    monkeypatch.setattr(os, "geteuid", lambda: 0)
    assert pinned_home("cpu", env) == tmp_path / "prefix" / "llama.cpp" / LLAMA_CPP_PINNED / "cpu" / "bin"
    monkeypatch.setattr(os, "geteuid", lambda: 1000)
    assert pinned_home("cpu", env).is_relative_to(tmp_path / "cache" / "safe-llama")


def test_bundled_model_dirs_cache_first(tmp_path: Path) -> None:
    assert bundled_model_dirs(_env(tmp_path)) == [
        tmp_path / "cache" / "safe-llama" / "models",
        tmp_path / "prefix" / "models",
    ]
