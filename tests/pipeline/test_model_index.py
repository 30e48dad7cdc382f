"""The header index: a header is read once and then taken from the index while the file's size and mtime stay;
a changed file, a damaged entry or another format is read again; a file that is no GGUF is one problem line,
kept too; the index keeps at most MAX_ENTRIES files, the least recently read dropped first."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from safe_llama.model.facts import ModelFacts
from safe_llama.model.header_facts import load_model_facts
from safe_llama.pipeline import model_index
from safe_llama.pipeline.model_index import index_path, read_all
from tests.tiny_gguf import write_tiny_gguf


def _counting(calls: list[str]):  # type: ignore[no-untyped-def]
    def reader(path: str) -> ModelFacts:
        calls.append(path)
        return load_model_facts(path)

    return reader


def test_a_header_is_read_once_then_kept_by_size_and_mtime(tmp_path: Path) -> None:
    env = {"XDG_CACHE_HOME": str(tmp_path / "cache")}
    model = str(write_tiny_gguf(tmp_path / "m.gguf", n_ctx_train=4096))
    calls: list[str] = []
    first = read_all([model], env, reader=_counting(calls))
    again = read_all([model], env, reader=_counting(calls))
    assert calls == [model]
    assert not first[0].cached and again[0].cached
    assert again[0].facts == first[0].facts and again[0].facts is not None
    assert again[0].facts.context_length == 4096
    st = os.stat(model)
    os.utime(model, ns=(st.st_atime_ns, st.st_mtime_ns + 1_000_000))
    read_all([model], env, reader=_counting(calls))
    assert calls == [model, model]
    assert oct(index_path(env).stat().st_mode & 0o777) == "0o600"


def test_a_damaged_entry_is_read_again(tmp_path: Path) -> None:
    env = {"XDG_CACHE_HOME": str(tmp_path / "cache")}
    model = str(write_tiny_gguf(tmp_path / "m.gguf"))
    read_all([model], env)
    data = json.loads(index_path(env).read_text())
    data["entries"][model]["facts"]["block_count"] = "two"
    index_path(env).write_text(json.dumps(data))
    calls: list[str] = []
    out = read_all([model], env, reader=_counting(calls))
    assert calls == [model] and out[0].facts is not None and out[0].facts.block_count == 2


def test_not_gguf_is_one_problem_kept_too(tmp_path: Path) -> None:
    env = {"XDG_CACHE_HOME": str(tmp_path / "cache")}
    bad = tmp_path / "x.gguf"
    bad.write_bytes(b"PK\x03\x04" + b"\0" * 64)
    calls: list[str] = []
    out = read_all([str(bad), str(tmp_path / "gone.gguf")], env, reader=_counting(calls))
    assert out[0].facts is None and out[0].problem == "not a GGUF file (magic b'PK\\x03\\x04')"
    assert out[1].problem == "No such file or directory"
    again = read_all([str(bad)], env, reader=_counting(calls))
    assert again[0].cached and again[0].problem == out[0].problem and len(calls) == 1


def test_the_index_is_bounded(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(model_index, "MAX_ENTRIES", 2)
    env = {"XDG_CACHE_HOME": str(tmp_path / "cache")}
    paths = [str(write_tiny_gguf(tmp_path / f"m{i}.gguf", seed=i)) for i in range(3)]
    read_all(paths, env)
    assert list(json.loads(index_path(env).read_text())["entries"]) == paths[1:]


def test_an_index_of_another_format_is_ignored(tmp_path: Path) -> None:
    env = {"XDG_CACHE_HOME": str(tmp_path / "cache")}
    model = str(write_tiny_gguf(tmp_path / "m.gguf"))
    read_all([model], env)
    data = json.loads(index_path(env).read_text())
    index_path(env).write_text(json.dumps({**data, "format": 99}))
    calls: list[str] = []
    read_all([model], env, reader=_counting(calls))
    assert calls == [model]
