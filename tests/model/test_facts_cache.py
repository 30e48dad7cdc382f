"""model.facts_cache: model facts kept as JSON per file identity (real path, size, mtime, inode), read back
instead of the header, read afresh when the file changes or the entry is damaged. The header reading itself is
replaced by a counter here (model.facts has its own tests); the model files are a few bytes in tmp_path."""

from __future__ import annotations

import dataclasses
import json
import os
from pathlib import Path
from typing import Any

import pytest

from safe_llama import state
from safe_llama.errors import ExitStatus, SafeLlamaError
from safe_llama.model import header_facts
from safe_llama.model.facts import ModelFacts
from safe_llama.model.facts_cache import facts_for, facts_from_json, facts_to_json
from safe_llama.model.sparse import SparseMemory
from tests.model.test_header_facts import G3, SSM, facts_of, meta


def gemma_like() -> ModelFacts:
    return facts_of(meta("gemma3", 6, 1152, 4, attention__sliding_window=512, **G3))


class Reader:
    """load_model_facts as a counter: the facts of a small gemma3 header, with the path it was given."""

    def __init__(self) -> None:
        self.reads: list[str] = []

    def __call__(self, path: Path) -> ModelFacts:
        self.reads.append(str(path))
        return dataclasses.replace(gemma_like(), path=str(path), file_size=path.stat().st_size)


@pytest.fixture
def reader(monkeypatch: pytest.MonkeyPatch) -> Reader:
    counter = Reader()
    monkeypatch.setattr(header_facts, "load_model_facts", counter)  # facts_for imports it on a miss
    return counter


@pytest.fixture
def env(tmp_path: Path) -> dict[str, str]:
    return {"HOME": str(tmp_path), "XDG_CACHE_HOME": str(tmp_path / "cache")}


@pytest.fixture
def model(tmp_path: Path) -> Path:
    path = tmp_path / "models" / "m.gguf"
    path.parent.mkdir()
    path.write_bytes(b"GGUF" + bytes(60))
    return path


def entries(env: dict[str, str]) -> list[Path]:
    return sorted((Path(env["XDG_CACHE_HOME"]) / "safe-llama" / "facts").glob("*.json"))


def test_the_second_read_comes_from_the_cache(reader: Reader, env: dict[str, str], model: Path) -> None:
    first = facts_for(model, env)
    assert reader.reads == [str(model)] and len(entries(env)) == 1
    assert facts_for(str(model), env) == first
    assert reader.reads == [str(model)]


def test_a_changed_file_is_read_again(reader: Reader, env: dict[str, str], model: Path) -> None:
    facts_for(model, env)
    model.write_bytes(b"GGUF" + bytes(100))
    assert facts_for(model, env).file_size == 104
    assert len(reader.reads) == 2 and len(entries(env)) == 2
    st = model.stat()
    os.utime(model, ns=(st.st_atime_ns, st.st_mtime_ns + 1_000_000_000))  # same size, touched
    facts_for(model, env)
    assert len(reader.reads) == 3


def test_the_entry_holds_its_key_and_facts_to_json(reader: Reader, env: dict[str, str], model: Path) -> None:
    facts = facts_for(model, env)
    (entry,) = entries(env)
    kept = {"key": state.file_key(model), "facts": facts_to_json(facts)}
    assert json.loads(entry.read_text()) == json.loads(json.dumps(kept))


def test_an_entry_of_another_key_under_the_same_name_is_not_used(
    reader: Reader, env: dict[str, str], model: Path
) -> None:
    """Entries are named by a checksum of their key (state.cache_name): one of another key is a miss."""
    facts_for(model, env)
    (entry,) = entries(env)
    kept = json.loads(entry.read_text())
    entry.write_text(json.dumps({**kept, "key": kept["key"] + "0"}))  # another size, say
    assert facts_for(model, env).path == str(model) and len(reader.reads) == 2
    assert json.loads(entry.read_text()) == kept


def test_a_damaged_entry_is_read_again_and_replaced(reader: Reader, env: dict[str, str], model: Path) -> None:
    facts_for(model, env)
    (entry,) = entries(env)
    for damage in ('{"schema": 0}', "[1, 2]"):
        entry.write_text(damage)
        assert facts_for(model, env).path == str(model)
        assert json.loads(entry.read_text())["facts"]["path"] == str(model)
    assert len(reader.reads) == 3


def test_an_entry_for_another_path_to_the_same_file_is_not_used(
    reader: Reader, env: dict[str, str], model: Path, tmp_path: Path
) -> None:
    link = tmp_path / "link.gguf"
    link.symlink_to(model)
    facts_for(link, env)
    assert facts_for(model, env).path == str(model)  # same real file, but the facts name the path given
    assert reader.reads == [str(link), str(model)]


def test_a_missing_model_is_a_bad_model(reader: Reader, env: dict[str, str], tmp_path: Path) -> None:
    with pytest.raises(SafeLlamaError) as err:
        facts_for(tmp_path / "nothing.gguf", env)
    assert err.value.status == ExitStatus.BAD_MODEL
    assert err.value.message == f"safe-llama: {tmp_path / 'nothing.gguf'}: model file not found"
    assert reader.reads == []


def test_an_unusable_cache_only_costs_speed(reader: Reader, model: Path, tmp_path: Path) -> None:
    (tmp_path / "file").write_text("")
    env = {"HOME": str(tmp_path), "XDG_CACHE_HOME": str(tmp_path / "file")}  # a file where a folder should be
    assert facts_for(model, env).path == str(model)
    assert facts_for(model, env).path == str(model)
    assert len(reader.reads) == 2


def test_json_round_trip() -> None:
    facts = facts_of(meta("jamba", 4, 4096, 32, attention__head_count_kv=(0, 0, 8, 0), **SSM))
    assert facts_from_json(json.loads(json.dumps(facts_to_json(facts)))) == facts


def test_json_round_trip_of_a_sparse_memory() -> None:
    sparse = SparseMemory("dsv4", (0, 128), (), 0, (4, 128), 512, 64, 2, ())
    facts = dataclasses.replace(gemma_like(), sparse=sparse)
    data = json.loads(json.dumps(facts_to_json(facts)))
    assert data["sparse"]["compress"] == [4, 128]
    assert facts_from_json(data) == facts


def facts_to_json_sparse() -> dict[str, Any]:
    sparse = SparseMemory("dsv4", (0, 128), compress=(4, 128))
    data: dict[str, Any] = facts_to_json(dataclasses.replace(gemma_like(), sparse=sparse))["sparse"]
    return data


@pytest.mark.parametrize(
    "damage",
    [
        pytest.param(lambda d: d.update(schema=0), id="old-schema"),
        pytest.param(lambda d: d.pop("block_count"), id="missing-field"),
        pytest.param(lambda d: d.update(block_count="18"), id="wrong-type"),
        pytest.param(lambda d: d.update(block_count=True), id="bool-for-int"),
        pytest.param(lambda d: d["layers"][0].pop("swa"), id="bad-layer"),
        pytest.param(lambda d: d["layers"][0].update(swa=1), id="int-for-bool"),
        pytest.param(lambda d: d.update(swa_type="sideways"), id="bad-swa-type"),
        pytest.param(lambda d: d.update(head_count=[1, True]), id="bool-in-ints"),
        pytest.param(lambda d: d.update(tensors=[["a", 1, 2]]), id="bad-tensor"),
        pytest.param(lambda d: d.update(notes=[1]), id="bad-note"),
        pytest.param(lambda d: d.update(sparse={"kind": "dsv4"}), id="bad-sparse"),
        pytest.param(lambda d: d.update(sparse={**facts_to_json_sparse(), "kind": "hybrid_qsa"}), id="sparse-kind"),
    ],
)
def test_json_damage_is_a_value_error(damage: Any) -> None:
    data = facts_to_json(gemma_like())
    damage(data)
    with pytest.raises(ValueError, match="cached model facts"):
        facts_from_json(data)
