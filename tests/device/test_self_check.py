"""device.self_check: telling safe-llama's own entry points (and scripts that run it) from llama.cpp."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

from safe_llama.device.self_check import SCRIPTS, is_self, own_paths


def write(path: Path, data: bytes) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data)
    return path


def test_own_paths_are_argv0_and_the_scripts_beside_it(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    real = tmp_path / "venv" / "bin"
    write(real / "safe-llama", b"#!/usr/bin/python3\n")
    write(real / "safe-llama-server", b"#!/usr/bin/python3\n")
    (tmp_path / "link").symlink_to(real)
    monkeypatch.setattr(sys, "argv", [str(tmp_path / "link" / "safe-llama")])
    assert own_paths() == [str(real / "safe-llama"), str(real / "safe-llama"), str(real / "safe-llama-server")]
    assert "safe-llama-cli" in SCRIPTS  # a script not there is not listed above


def test_a_path_among_our_own_is_us(tmp_path: Path) -> None:
    binary = write(tmp_path / "bin" / "llama-server", b"\x7fELF")
    link = tmp_path / "llama-server"
    link.symlink_to(binary)
    assert is_self(str(binary), [str(binary)])
    assert is_self(str(link), [str(binary)])  # by its real path
    assert not is_self(str(binary), [str(tmp_path / "other")])


@pytest.mark.parametrize(
    ("head", "ours"),
    [
        (b"#!/usr/bin/python3\nfrom safe_llama.entry import main_server\n", True),
        (b'#!/bin/sh\nexec python3 -m safe_llama "$@"\n', True),
        (b'#!/bin/sh\nexec /opt/llama.cpp/llama-server "$@"\n', False),
        (b"\x7fELF\x02\x01safe_llama", False),  # not a script, whatever its bytes say
        (b"#!/bin/sh\n" + b"#" * 600 + b"\nsafe_llama\n", False),  # only the head is read
    ],
)
def test_a_script_that_runs_safe_llama_is_us(head: bytes, ours: bool, tmp_path: Path) -> None:
    assert is_self(str(write(tmp_path / "llama-server", head)), []) is ours


def test_a_file_that_cannot_be_read_is_not_us(tmp_path: Path) -> None:
    assert not is_self(str(tmp_path / "missing"), [])
    assert not is_self(str(tmp_path), [])  # a folder
    if os.geteuid() != 0:
        hidden = write(tmp_path / "hidden", b"#!/bin/sh\nsafe_llama\n")
        hidden.chmod(0)
        assert not is_self(str(hidden), [])
