"""run.say: safe-llama's own lines on stderr, one line each: plain text, journald's <priority> prefix when
stderr is the journal's stream, JSON records when asked; SAFE_LLAMA_QUIET silences the info lines only."""

from __future__ import annotations

import io
import json
import os
import time
from pathlib import Path

import pytest

from safe_llama.attempts.say import Say


def _said(env: dict[str, str], *lines: tuple[str, str]) -> str:
    stream = io.StringIO()
    say = Say(env, stream)
    for message, level in lines:
        say(message, level)
    return stream.getvalue()


def test_text_lines_are_one_line_each() -> None:
    assert _said({}, ("planned -c 4096", "info"), ("two\nlines", "warning")) == (
        "safe-llama: planned -c 4096\nsafe-llama: two lines\n"
    )


@pytest.mark.parametrize(("quiet", "silenced"), [("", False), ("0", False), ("1", True), ("yes", True)])
def test_quiet_silences_info_only(quiet: str, silenced: bool) -> None:
    said = _said({"SAFE_LLAMA_QUIET": quiet}, ("info line", "info"), ("warned", "warning"), ("failed", "error"))
    expected = "safe-llama: warned\nsafe-llama: failed\n"
    assert said == (expected if silenced else "safe-llama: info line\n" + expected)


def test_json_records(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(time, "time", lambda: 1700000000.12345)
    stream = io.StringIO()
    Say({"SAFE_LLAMA_LOG_FORMAT": "JSON"}, stream)("a\nb", "warning", attempt=2, path=Path("/m"))
    (line,) = stream.getvalue().splitlines()
    assert json.loads(line) == {
        "ts": 1700000000.123,
        "level": "warning",
        "msg": "a b",
        "source": "safe-llama",
        "attempt": 2,
        "path": "/m",  # what JSON cannot hold, as text
    }


def test_the_journal_gets_priorities(tmp_path: Path) -> None:
    log = tmp_path / "stderr"
    with log.open("w") as stream:
        st = os.fstat(stream.fileno())
        journal = {"JOURNAL_STREAM": f"{st.st_dev}:{st.st_ino}"}
        say = Say(journal, stream)
        assert say.journal
        for level in ("error", "warning", "info"):
            say(level, level)
        Say({**journal, "SAFE_LLAMA_LOG_FORMAT": "json"}, stream)("as json")  # JSON wins over the journal
    lines = log.read_text().splitlines()
    assert lines[:3] == ["<3>safe-llama: error", "<4>safe-llama: warning", "<6>safe-llama: info"]
    assert json.loads(lines[3])["msg"] == "as json"


@pytest.mark.parametrize("value", ["", "nonsense", "1:2:3", "0:0"])
def test_another_stream_is_not_the_journal(tmp_path: Path, value: str) -> None:
    with (tmp_path / "stderr").open("w") as stream:
        assert not Say({"JOURNAL_STREAM": value}, stream).journal


def test_a_stream_without_a_descriptor_is_not_the_journal() -> None:
    assert not Say({"JOURNAL_STREAM": "1:2"}, io.StringIO()).journal  # fileno() raises: plain text
