"""Invocations that load no model reach the real llama.cpp binary untouched: same bytes, same exit code."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests import ROOT

ENTRY = "import sys; from safe_llama.entry import {fn}; sys.argv[0] = {name!r}; sys.exit({fn}())"


def test_the_guard_is_procs() -> None:
    from safe_llama.device import proc
    from safe_llama.run import passthrough

    assert passthrough.GUARD_ENV == proc.GUARD_ENV


def test_the_entry_module_does_not_import_typer() -> None:
    code = "import sys, safe_llama.entry; print('typer' in sys.modules, 'safe_llama.plan.planner' in sys.modules)"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True)
    assert done.stdout.split() == ["False", "False"]


CASES = [
    pytest.param("server", ["--help"], id="server-help"),
    pytest.param("server", ["-m", "/nonexistent", "--help"], id="issue-12-nonexistent-model-help"),
    pytest.param("cli", ["-h"], id="cli-h"),
    pytest.param("server", ["--version"], id="server-version"),
    pytest.param("completion", ["--list-devices"], id="completion-list-devices"),
    pytest.param("server", ["--completion-bash"], id="server-completion-bash"),
    pytest.param("server", ["-c", "abc"], id="usage-error-stoi"),
    pytest.param("server", ["--no-mmap"], id="usage-error-removed-option"),
    pytest.param("server", ["--jinja", "-fa", "-hf", "bartowski/Qwen2.5-7B-Instruct-GGUF:Q4_K_M"], id="usage-error-fa"),
]


def _env(llama_bin: Path, clean_env: dict[str, str]) -> dict[str, str]:
    return {**clean_env, "SAFE_LLAMA_BIN_DIR": str(llama_bin), "PYTHONPATH": str(ROOT)}


@pytest.mark.slow
@pytest.mark.parametrize(("tool", "args"), CASES)
def test_byte_identical_to_the_real_binary(
    tool: str, args: list[str], llama_bin: Path, clean_env: dict[str, str], tmp_path: Path
) -> None:
    env = _env(llama_bin, clean_env)
    binary = str(llama_bin / f"llama-{tool}")
    real = subprocess.run([binary, *args], capture_output=True, timeout=60, check=False, env=env, cwd=tmp_path)
    entry = ENTRY.format(fn=f"main_{tool}", name=f"safe-llama-{tool}")
    drop_in = subprocess.run([sys.executable, "-c", entry, *args], capture_output=True, timeout=60, check=False,
                             env=env, cwd=tmp_path)  # fmt: skip
    launcher = subprocess.run([sys.executable, "-m", "safe_llama", tool, *args], capture_output=True, timeout=60,
                              check=False, env=env, cwd=tmp_path)  # fmt: skip
    assert real.stdout or real.stderr
    for wrapped in (drop_in, launcher):
        assert (wrapped.returncode, wrapped.stdout, wrapped.stderr) == (real.returncode, real.stdout, real.stderr)
    assert not os.listdir(tmp_path)  # nothing planned, nothing written
