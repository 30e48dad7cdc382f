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


def test_tab_completion_offers_every_command(clean_env: dict[str, str]) -> None:
    """`safe-llama <TAB>` as bash asks it (the script of --show-completion bash): the admin commands and every
    word that launches (issue 38: only the admin commands were offered)."""
    from safe_llama.cmdline.own_options import COMMANDS, TOOLS

    env = {**clean_env, "_SAFE_LLAMA_COMPLETE": "complete_bash", "COMP_WORDS": "safe-llama ", "COMP_CWORD": "1"}
    done = subprocess.run([str(console_script("safe-llama"))], capture_output=True, text=True, env=env, timeout=60)
    assert done.returncode == 0
    assert set(done.stdout.split()) == {*COMMANDS, *TOOLS, "rpc-server"}
