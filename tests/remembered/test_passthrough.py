"""Invocations that load no model reach the real llama.cpp binary untouched: same bytes, same exit code."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests import ROOT

ENTRY = "import sys; from safe_llama.entry import {fn}; sys.argv[0] = {name!r}; sys.exit({fn}())"


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


# ---------------------------------------------------------------------------------------------------
# The quick decision: the same answer as llama_args.parse wherever it answers at all
# ---------------------------------------------------------------------------------------------------

TRICKY = [
    pytest.param([], {}, id="nothing"),
    pytest.param(["--version"], {}, id="version"),
    pytest.param(["-p", "--help"], {}, id="help-as-a-prompt"),
    pytest.param(["--api-key", "--version"], {}, id="version-as-a-key"),
    pytest.param(["-p"], {}, id="prompt-short-of-its-value"),
    pytest.param(["--ctx-size=4096"], {}, id="an-=-form-is-unknown"),
    pytest.param(["--ctx_size", "4096"], {}, id="underscores"),
    pytest.param(["-c", "4096", "--help"], {}, id="checked-value-then-help"),
    pytest.param(["-c", "abc"], {}, id="bad-int"),
    pytest.param(["-m", "x.gguf", "-c", "4096"], {}, id="a-launch"),
    pytest.param(["-m", "x.gguf", "--no-such-option"], {}, id="unknown-option"),
    pytest.param(["-m", "x.gguf"], {"LLAMA_ARG_CTX_SIZE": "abc"}, id="bad-env-int"),
    pytest.param(["-m", "x.gguf"], {"LLAMA_ARG_CTX_SIZE": "4096"}, id="good-env-int"),
    pytest.param(["-m", "x.gguf"], {"LLAMA_ARG_MMAP": "maybe"}, id="bad-env-bool"),
    pytest.param(["-m", "x.gguf"], {"LLAMA_ARG_MODEL": "y.gguf"}, id="unchecked-env"),
    pytest.param(["--override-kv", "a=int:1", "--version"], {}, id="value-then-version"),
    pytest.param(["-ot", "a", "--lora-scaled"], {}, id="two-values-missing"),
    pytest.param(["--lora-scaled", "a"], {}, id="two-values-one-given"),
    pytest.param(["--lora-scaled", "a", "1", "--completion-bash"], {}, id="two-values-then-no-model"),
    pytest.param(["-cl"], {}, id="cache-list"),
    pytest.param(["--list-devices", "-m", "x.gguf"], {}, id="list-devices-first"),
]


def _words(tool: str) -> list[str]:
    from safe_llama.cmdline.llama_args import arg_table

    names = sorted(arg_table(tool).by_name)
    return [*names, "x.gguf", "4096", "abc", "-1", "none", "q8_0", "auto", "1", "on", "a=b", "--bogus", "-p", "--help"]


def _cases(tool: str, count: int) -> list[list[str]]:
    import random

    rng = random.Random(f"passthrough-{tool}")
    words = _words(tool)
    return [[rng.choice(words) for _ in range(rng.randint(0, 6))] for _ in range(count)]


@pytest.mark.parametrize("tool", ["cli", "server", "completion"])
def test_the_quick_decision_is_parse_s(tool: str) -> None:
    from safe_llama.cmdline.llama_args import parse
    from safe_llama.remembered.passthrough import no_model_table, quick_no_model

    table = no_model_table(tool)
    env_cases: list[dict[str, str]] = [{}, {"LLAMA_ARG_CTX_SIZE": "x"}, {"LLAMA_ARG_THREADS": "2"}, {"HOME": "/"}]
    answered = {True: 0, False: 0}
    cases: list[tuple[list[str], dict[str, str]]] = [(list(p.values[0]), dict(p.values[1])) for p in TRICKY]  # type: ignore[call-overload]
    cases += [(a, {}) for a in _cases(tool, 3000)]
    cases += [(a, e) for a in _cases(tool, 300) for e in env_cases]
    for args, env in cases:
        quick = quick_no_model(table, args, env)
        if quick is not None:
            answered[quick] += 1
            assert quick == parse(tool, args, env).loads_no_model, (args, env)
    assert answered[True] > 500 and answered[False] > 20  # it answers often, both ways


@pytest.mark.parametrize(("args", "env"), TRICKY)
def test_tricky_words_decided_as_parse_decides(args: list[str], env: dict[str, str]) -> None:
    from safe_llama.remembered.passthrough import _no_model, loads_no_model

    assert _no_model("server", args, env) == loads_no_model("server", args, env)


def test_the_common_answers_need_no_option_table(tmp_path: Path) -> None:
    """--version is answered without llama_args (nor errors' enum, paths' pathlib) once the compact table is kept
    (the interpreter's own start-up, an editable install's finder, may import enum and json anyway)."""
    code = (
        "import sys, os; from safe_llama.remembered import passthrough; "
        "print(passthrough._no_model('server', sys.argv[1:], os.environ), "
        "'safe_llama.cmdline.llama_args' in sys.modules, 'safe_llama.errors' in sys.modules, "
        "'safe_llama.paths' in sys.modules)"
    )
    env = {**os.environ, "XDG_CACHE_HOME": str(tmp_path), "PYTHONPATH": str(ROOT)}
    first = subprocess.run([sys.executable, "-c", code, "--version"], capture_output=True, text=True, env=env)
    again = subprocess.run([sys.executable, "-c", code, "--version"], capture_output=True, text=True, env=env)
    assert first.stdout.split()[:2] == ["True", "True"]  # derived and kept the first time
    assert again.stdout.split() == ["True", "False", "False", "False"], again.stderr


@pytest.mark.parametrize(
    "layout",
    ["bin-dir", "binary-file", "missing", "not-executable", "a-directory-named-so", "safe-llama-script", "config"],
)
def test_the_quick_binary_is_find_binary_s(layout: str, tmp_path: Path, llama_bin: Path) -> None:
    """Where the quick lookup answers, find_binary gives the same binary; elsewhere it leaves it to find_binary."""
    from safe_llama.cmdline.launch_args import resolve
    from safe_llama.device.binaries import find_binary
    from safe_llama.errors import SafeLlamaError
    from safe_llama.remembered.passthrough import _quick_binary

    folder = tmp_path / "bin"
    folder.mkdir()
    binary = folder / "llama-server"
    env = {"HOME": str(tmp_path), "PATH": "", "SAFE_LLAMA_BIN_DIR": str(folder)}
    if layout in ("bin-dir", "binary-file", "not-executable", "config"):
        binary.symlink_to(llama_bin / "llama-server")
    if layout == "binary-file":
        env["SAFE_LLAMA_BIN_DIR"] = str(binary)
    if layout == "not-executable":
        binary.unlink()
        binary.write_text("#!/bin/sh\n")
    if layout == "a-directory-named-so":
        binary.mkdir()
    if layout == "safe-llama-script":
        binary.write_text("#!/usr/bin/python3\nfrom safe_llama.entry import main_server\n")
        binary.chmod(0o755)
    if layout == "config":
        (tmp_path / ".config" / "safe-llama").mkdir(parents=True)
        (tmp_path / ".config" / "safe-llama" / "config.toml").write_text("[launcher]\n")
    quick = _quick_binary("server", env, {})
    try:
        full: str | None = str(find_binary("server", env=env, explicit=resolve({}, env).get("bin_dir")))
    except SafeLlamaError:
        full = None
    assert quick is None or quick == full
    assert (quick is not None) == (layout in ("bin-dir", "binary-file"))
