"""cli.py: the admin commands' usage errors, as a user meets them (the installed console script)."""

from __future__ import annotations

import subprocess

import pytest

from tests.conftest import console_script


@pytest.mark.parametrize("argv", [["plan"], ["plan", "--json"]], ids=["bare", "json"])
def test_plan_without_a_tool_names_the_three(argv: list[str], clean_env: dict[str, str]) -> None:
    done = subprocess.run(
        [str(console_script("safe-llama")), *argv], capture_output=True, text=True, env=clean_env, timeout=60
    )
    assert done.returncode == 2
    assert "cli, server, completion" in done.stderr
    assert "Missing argument" not in done.stderr
