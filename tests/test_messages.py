"""safe_llama/messages.py: the templates of safe-llama's own lines, the patterns built from them, and the lines
the real writers say (a missing binary, a model file that is missing, unreadable or not GGUF) named by the
patterns. That explain names every line rendered from its template is tests/diagnosis/test_own_lines.py's."""

from __future__ import annotations

from pathlib import Path

import pytest

from safe_llama.device.binaries import locate_binary
from safe_llama.errors import ExitStatus, SafeLlamaError
from safe_llama.messages import LINES, PREFIX, Line, Message
from safe_llama.model.facts_cache import facts_for
from safe_llama.model.gguf_header import read_header


def named(text: str) -> tuple[str | None, dict[str, str]]:
    """The first line of LINES whose pattern reads the whole text, and its fields."""
    for line in LINES:
        found = line.pattern.match(text)
        if found is not None:
            return line.id, found.groupdict()
    return None, {}


def test_a_template_is_said_and_read_back() -> None:
    message = Message("at -c {ctx} (a.b) with {type} KV")
    assert message.text(ctx=512, type="f16") == "at -c 512 (a.b) with f16 KV"
    assert message.fields() == ("ctx", "type")
    found = message.pattern({"ctx": r"\d+"}).match("at -c 512 (a.b) with f16 KV")
    assert found is not None and found.groupdict() == {"ctx": "512", "type": "f16"}
    assert message.pattern({"ctx": r"\d+"}).match("at -c x (a.b) with f16 KV") is None
    assert message.pattern({}).match("at -c 512 (aXb) with f16 KV") is None  # the words are words, not a regex


def test_a_message_wrapped_around_another() -> None:
    outer = Message("{error} (after {failed} start(s))").inside("error", Message("nothing fits at {ctx}"))
    assert outer == Message("nothing fits at {ctx} (after {failed} start(s))")


def test_an_error_is_one_prefixed_line() -> None:
    err = Message("{what} is gone").error(ExitStatus.NOT_FOUND, what="x")
    assert isinstance(err, SafeLlamaError) and err.status == ExitStatus.NOT_FOUND
    assert err.message == f"{PREFIX}x is gone"


def test_every_line_reads_every_field_of_its_template() -> None:
    for line in LINES:
        assert isinstance(line, Line) and line.pattern.groupindex.keys() == set(line.message.fields()), line.id
        assert set(line.fields) <= set(line.message.fields()), line.id


def _said(call: object) -> str:
    assert callable(call)
    with pytest.raises(SafeLlamaError) as caught:
        call()
    message = caught.value.message
    assert message.startswith(PREFIX)
    return message.removeprefix(PREFIX)


def test_real_lines_are_named(tmp_path: Path) -> None:
    """The lines whose fields are told apart by their words, as their writers say them."""
    missing = tmp_path / "none.gguf"
    html = tmp_path / "page.gguf"
    html.write_bytes(b"<html><body>not a model</body></html>")
    short = tmp_path / "short.gguf"
    short.write_bytes(b"GGUF\x03\x00")
    env = {"PATH": str(tmp_path), "XDG_CACHE_HOME": str(tmp_path / "cache"), "SAFE_LLAMA_BIN_DIR": ""}
    said = {
        "explicit binary": _said(lambda: locate_binary("server", env=env, explicit=str(missing))),
        "binary dir": _said(lambda: locate_binary("server", env={**env, "SAFE_LLAMA_BIN_DIR": str(missing)})),
        "config binary dir": _said(lambda: locate_binary("server", env=env, config_bin_dir=str(missing))),
        "header missing": _said(lambda: read_header(missing)),
        "facts missing": _said(lambda: facts_for(missing, env)),
        "a directory": _said(lambda: read_header(tmp_path)),
        "not gguf": _said(lambda: read_header(html)),
        "truncated": _said(lambda: read_header(short)),
    }
    assert {case: named(text)[0] for case, text in said.items()} == {
        "explicit binary": "binary-missing",
        "binary dir": "binary-missing",
        "config binary dir": "binary-missing",
        "header missing": "model-not-found",
        "facts missing": "model-not-found",
        "a directory": "model-unreadable",
        "not gguf": "model-not-usable",
        "truncated": "model-not-usable",
    }
