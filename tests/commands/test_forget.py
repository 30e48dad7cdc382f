"""forget: every remembered plan dropped, and how many said in one line."""

from __future__ import annotations

from pathlib import Path

import pytest

from safe_llama.commands.forget import main
from safe_llama.remembered import remember


def test_forgets_every_remembered_plan_and_says_how_many(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    env = {"XDG_CACHE_HOME": str(tmp_path)}
    remember.store("a" * 40, remember.Remembered(1, None, 2), env)
    remember.store("b" * 40, remember.Remembered(3, 4, 5), env)
    assert main({}, []) == 0
    assert capsys.readouterr().out == "safe-llama: forgot 2 remembered plan(s)\n"
    assert remember.recall("a" * 40, env) is None
    assert main({}, []) == 0
    assert capsys.readouterr().out == "safe-llama: forgot 0 remembered plan(s)\n"
