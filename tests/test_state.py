"""State files: 0700 directories, 0600 files, atomic replace, no symlink following, corrupt files ignored,
concurrent writers leave a valid file (wrapper-behaviour.md 27)."""

from __future__ import annotations

import json
import multiprocessing
import os
import stat
from pathlib import Path

import pytest

from safe_llama import state
from safe_llama.paths import cache_dir


def test_modes(tmp_path: Path) -> None:
    target = tmp_path / "new" / "deeper" / "x.json"
    state.write_json(target, {"a": 1})
    assert (target.stat().st_mode & 0o777) == 0o600
    assert ((tmp_path / "new").stat().st_mode & 0o777) == 0o700
    assert state.read_json(target) == {"a": 1}
    assert [p.name for p in target.parent.iterdir()] == ["x.json"]  # no temp file left behind


def test_symlink_is_not_followed(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    secret = tmp_path / "secret.json"
    secret.write_text('{"secret": true}')
    link = tmp_path / "link.json"
    link.symlink_to(secret)
    assert state.read_json(link) is None
    assert "ignoring" in capsys.readouterr().err
    state.write_json(link, {"b": 2})  # replaces the link itself, never writes through it
    assert json.loads(secret.read_text()) == {"secret": True}
    assert not link.is_symlink()


def test_corrupt_file_is_ignored_with_a_warning(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    bad = tmp_path / "bad.json"
    bad.write_text('{"truncated": ')
    assert state.read_json(bad) is None
    err = capsys.readouterr().err
    assert err.startswith("safe-llama: warning: ignoring corrupt") and err.count("\n") == 1


def _writer(path: str, n: int) -> None:
    for i in range(200):
        state.write_json(Path(path), {"writer": n, "i": i, "pad": "x" * 4096})


def test_concurrent_writers_leave_a_valid_file(tmp_path: Path) -> None:
    target = tmp_path / "shared.json"
    procs = [multiprocessing.Process(target=_writer, args=(str(target), n)) for n in range(4)]
    for p in procs:
        p.start()
    seen = 0
    while any(p.is_alive() for p in procs):
        value = state.read_json(target, warn=False)
        if value is not None:
            assert value["pad"] == "x" * 4096
            seen += 1
    for p in procs:
        p.join()
    assert state.read_json(target)["i"] == 199  # type: ignore[index]


def test_check_cache_makes_a_private_root(tmp_path: Path) -> None:
    root = tmp_path / "deep" / "safe-llama"
    assert state.check_cache(root) is None
    assert stat.S_IMODE(root.stat().st_mode) == 0o700
    loose = tmp_path / "loose"
    loose.mkdir(mode=0o755)
    os.chmod(loose, 0o755)  # noqa: S103 (what another tool's mkdir -p leaves)
    assert state.check_cache(loose) is None
    assert stat.S_IMODE(loose.stat().st_mode) == 0o700  # "0700 as promised", even when made by another tool


def test_a_file_blocking_the_cache_turns_writes_off(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(state, "_writes_off", [])
    blocker = tmp_path / "cache"
    blocker.write_text("not a directory")
    reason = state.check_cache(blocker / "safe-llama")
    assert reason is not None and str(blocker / "safe-llama") in reason and "\n" not in reason
    state.write_json(blocker / "safe-llama" / "plans" / "x.json", {"a": 1})  # skipped, not raised
    assert blocker.read_text() == "not a directory"


def test_toml_is_read_once_then_from_the_cache(tmp_path: Path) -> None:
    """A config file's tables come from the cache it is kept in until the file changes; a file read without
    one is not cached."""
    from safe_llama.state import load_toml

    keep_in = cache_dir({"XDG_CACHE_HOME": str(tmp_path / "cache")})
    config = tmp_path / "config" / "safe-llama" / "config.toml"
    config.parent.mkdir(parents=True)
    config.write_text("[planner]\nctx_floor = 8192\n")
    assert load_toml(config, keep_in) == {"planner": {"ctx_floor": 8192}}
    cached = list((tmp_path / "cache" / "safe-llama" / "toml").glob("*.json"))
    assert len(cached) == 1
    entry = json.loads(cached[0].read_text())
    entry["data"] = {"planner": {"ctx_floor": 1}}  # proof that the next read is the cache's
    entry["sum"] = state._toml_sum(entry["data"])
    cached[0].write_text(json.dumps(entry))
    assert load_toml(config, keep_in) == {"planner": {"ctx_floor": 1}}
    assert load_toml(config) == {"planner": {"ctx_floor": 8192}}  # no cache: the file itself
    config.write_text("[planner]\nctx_floor = 16384\n")  # a change (size, mtime) is a new key
    assert load_toml(config, keep_in) == {"planner": {"ctx_floor": 16384}}
    config.write_text("[planner\n")
    with pytest.raises(ValueError):
        load_toml(config, keep_in)
    elsewhere = tmp_path / "other.toml"
    elsewhere.write_text("a = 1\n")
    assert load_toml(elsewhere) == {"a": 1}
    assert len(list((tmp_path / "cache" / "safe-llama" / "toml").glob("*.json"))) == 2


def test_a_kept_parse_of_another_key_under_the_same_name_is_a_miss(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Kept parses are named by a checksum of their key (state.cache_name): one of another file or version under
    this one's name is not used, and not warned about (it is not damaged); the file is parsed and kept again."""
    from safe_llama.state import load_toml

    keep_in = tmp_path / "cache"
    config = tmp_path / "c.toml"
    config.write_text("a = 1\n")
    assert load_toml(config, keep_in) == {"a": 1}
    (cached,) = (keep_in / "toml").glob("*.json")
    entry = json.loads(cached.read_text())
    other = {**entry, "key": entry["key"] + "0", "data": {"a": 2}}
    cached.write_text(json.dumps({**other, "sum": state._toml_sum(other["data"])}))
    assert load_toml(config, keep_in) == {"a": 1} and not capsys.readouterr().err
    assert json.loads(cached.read_text()) == entry


def test_clearing_follows_no_symlink(tmp_path: Path) -> None:
    """`forget` clears the cache's own folders, never what a link in it points at."""
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (elsewhere / "keep.json").write_text("{}")
    root = tmp_path / "cache" / "safe-llama"
    root.mkdir(parents=True, mode=0o700)
    (root / "plans").symlink_to(elsewhere)
    assert state.clear_entries(root)["plans"] == 0
    assert (elsewhere / "keep.json").is_file()
