"""install-shims: llama-cli/-server/-completion links to the drop-ins; nothing it did not make is replaced."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from safe_llama.commands.shims import SHIMS, install_shims, main
from tests.conftest import console_script


@pytest.fixture
def scripts(tmp_path: Path) -> Path:
    folder = tmp_path / "venv-bin"
    folder.mkdir()
    for script in SHIMS.values():
        (folder / script).write_text("#!/bin/sh\n")
        (folder / script).chmod(0o755)
    return folder


def test_links_each_tool_and_removes_only_its_own(tmp_path: Path, scripts: Path) -> None:
    shims = tmp_path / "bin"
    lines, ok = install_shims(shims, scripts=scripts, path=str(shims))
    assert ok
    assert sorted(p.name for p in shims.iterdir()) == sorted(SHIMS)
    assert os.readlink(shims / "llama-server") == str(scripts / "safe-llama-server")
    assert not any("not on PATH" in line for line in lines)
    again, ok = install_shims(shims, scripts=scripts, path=str(shims))  # idempotent
    assert ok and len(again) == 3
    (shims / "other").symlink_to("/bin/true")
    removed, _ = install_shims(shims, scripts=scripts, remove=True)
    assert len(removed) == 3
    assert [p.name for p in shims.iterdir()] == ["other"]


def test_a_real_binary_is_left_alone(tmp_path: Path, scripts: Path) -> None:
    shims = tmp_path / "bin"
    shims.mkdir()
    real = shims / "llama-server"
    real.write_bytes(b"\x7fELF real llama-server")
    lines, ok = install_shims(shims, scripts=scripts, path="/usr/bin")
    assert not ok
    assert real.read_bytes() == b"\x7fELF real llama-server"
    assert f"left {real} alone: it is a file safe-llama did not make" in lines
    assert (shims / "llama-cli").is_symlink()
    assert any("not on PATH" in line for line in lines)


def test_the_command_says_each_line_and_exits_1_when_one_was_left_alone(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    shims = tmp_path / "bin"
    shims.mkdir()
    (shims / "llama-server").write_bytes(b"real")
    assert main({"dir": str(shims)}, []) == 1
    said = capsys.readouterr().out.splitlines()
    assert f"safe-llama: left {shims / 'llama-server'} alone: it is a file safe-llama did not make" in said
    assert main({"dir": str(shims), "remove": "1"}, []) == 0
    assert capsys.readouterr().out.splitlines() == [
        f"safe-llama: removed {shims / name}" for name in SHIMS if name != "llama-server"
    ]
    assert sorted(p.name for p in shims.iterdir()) == ["llama-server"]


@pytest.mark.slow
def test_a_shim_on_path_runs_safe_llama_and_the_real_binary(tmp_path: Path, llama_bin: Path) -> None:
    """The shim named llama-completion starts safe-llama, which finds the real pinned binary (not itself)."""
    shims = tmp_path / "bin"
    _, ok = install_shims(shims, scripts=console_script("safe-llama-server").parent, path="")
    assert ok
    env = {
        "PATH": f"{shims}:/usr/bin:/bin",
        "HOME": str(tmp_path),
        "XDG_CACHE_HOME": str(tmp_path / "cache"),
        "SAFE_LLAMA_BIN_DIR": str(llama_bin),
    }
    done = subprocess.run(
        ["llama-completion", "-p", "The capital of France is", "-n", "4", "-no-cnv", "-c", "4096"],
        env=env, capture_output=True, text=True, check=False, timeout=120, stdin=subprocess.DEVNULL,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stderr.startswith("safe-llama: "), done.stderr[:300]  # safe-llama's plan line comes first
    assert "llama_context" in done.stderr or "system_info" in done.stderr  # then the real llama.cpp's log
