"""constants.py: the XDG rule for the cache and config folders, the packaged configs, and the masking of
secret options' values that both the printed argv (llama_args.redact_argv) and a launch record's name
(run/early.key) use."""

from __future__ import annotations

import os

import pytest

from safe_llama import constants


@pytest.mark.parametrize(
    ("env", "expected"),
    [
        pytest.param({"XDG_CACHE_HOME": "/x/cache", "HOME": "/h"}, "/x/cache/safe-llama", id="xdg"),
        pytest.param({"XDG_CACHE_HOME": "relative", "HOME": "/h"}, "/h/.cache/safe-llama", id="relative-xdg-ignored"),
        pytest.param({"HOME": "/h"}, "/h/.cache/safe-llama", id="home"),
        pytest.param({"XDG_CACHE_HOME": "", "HOME": ""}, os.path.expanduser("~/.cache/safe-llama"), id="empty"),
    ],
)
def test_the_cache_folder(env: dict[str, str], expected: str) -> None:
    assert constants.cache_root(env) == expected


def test_the_config_folder() -> None:
    assert constants.config_root({"XDG_CONFIG_HOME": "/c", "HOME": "/h"}) == "/c/safe-llama"
    assert constants.config_root({"XDG_CONFIG_HOME": "c", "HOME": "/h"}) == "/h/.config/safe-llama"


def test_the_configs_folder() -> None:
    assert os.path.isfile(os.path.join(constants.packaged_configs(), "planner.toml"))
    assert constants.configs_root({}) == constants.packaged_configs()
    assert constants.configs_root({"SAFE_LLAMA_CONFIGS": "/mine"}) == "/mine"


@pytest.mark.parametrize(
    ("words", "expected"),
    [
        pytest.param(["--api-key", "k", "-c", "1"], ["--api-key", "*", "-c", "1"], id="separate value"),
        pytest.param(["--api-key=k", "-c", "1"], ["--api-key=*", "-c", "1"], id="joined value"),
        pytest.param(["--api_key", "k"], ["--api_key", "*"], id="underscores read as dashes"),
        pytest.param(["--api_key=k"], ["--api_key=*"], id="underscores, joined"),
        pytest.param(["-hft", "t", "-m", "x"], ["-hft", "*", "-m", "x"], id="short option"),
        pytest.param(["-m", "x", "--api-key"], ["-m", "x", "--api-key"], id="no value to mask"),
        pytest.param(["--api-key", "--api-key", "k"], ["--api-key", "*", "k"], id="the value is a word, not an option"),
        pytest.param(["--port", "1", "-hft=t"], ["--port", "1", "-hft=*"], id="short option, joined"),
        pytest.param(["-c", "4096"], ["-c", "4096"], id="nothing secret"),
    ],
)
def test_secret_values_are_masked(words: list[str], expected: list[str]) -> None:
    assert constants.mask_values(words, {"--api-key", "-hft"}, "*") == expected
