"""#33 row 6: a cache entry of the wrong shape (`args/*.marshal` = `{}`, `toml/*.json` with a bad field)
failed every later launch (KeyError 'env', or an error blaming the packaged planner.toml), `forget` did not
clear it and `doctor` said the cache was usable. Now an entry is checked by its shape before use, a bad one
is removed with a warning naming it, forget clears it and doctor names it."""

from __future__ import annotations

import json
import marshal
import os
import subprocess
import sys
from pathlib import Path

import pytest

from safe_llama import state, trust
from safe_llama.paths import cache_dir, packaged_configs
from safe_llama.plan.policy import load_policy


def _env(tmp_path: Path) -> dict[str, str]:
    return {"XDG_CACHE_HOME": str(tmp_path / "cache"), "XDG_CONFIG_HOME": str(tmp_path / "config")}


@pytest.mark.parametrize(
    "damage",
    [
        pytest.param(lambda e: {**e, "data": {**e["data"], "ladder": 5}}, id="a bad field"),
        pytest.param(lambda e: e["data"] | {"ctx_floor": "many"}, id="the old raw form, a bad field"),
        pytest.param(lambda e: [], id="not a table"),
    ],
)
def test_a_bad_parsed_config_is_removed_and_the_file_read_again(
    tmp_path: Path, damage: object, capsys: pytest.CaptureFixture[str]
) -> None:
    keep_in = cache_dir(_env(tmp_path))
    planner = packaged_configs() / "planner.toml"
    good = load_policy(planner, keep_in=keep_in)
    (entry,) = (keep_in / "toml").glob("*.json")
    entry.write_text(json.dumps(damage(json.loads(entry.read_text()))))  # type: ignore[operator]
    assert load_policy(planner, keep_in=keep_in) == good  # before: "planner.toml: ladder: invalid value"
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and f"removed {entry}" in err and str(planner) in err
    assert isinstance(state.read_json(entry), dict)  # written again, good


@pytest.mark.parametrize(
    ("kind", "entry", "why"),
    [
        pytest.param("args", {}, "no 'names'", id="args-empty"),
        pytest.param("args", {"names": {}, "env": "X"}, "'env' is str", id="args-env-a-string"),
        pytest.param("launch", {"format": 1}, "no 'tool'", id="launch-record-short"),
        pytest.param("launch", [1, 2], "not a table", id="launch-record-a-list"),
    ],
)
def test_a_marshal_entry_of_a_bad_shape_is_removed_with_a_warning(
    tmp_path: Path, kind: str, entry: dict[str, object] | list[int], why: str, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / kind / "x.marshal"
    state.write_bytes(path, marshal.dumps(entry))
    assert trust.load_entry(str(path), trust.SHAPES[kind]) is None
    err = capsys.readouterr().err
    assert err.startswith(f"safe-llama: warning: removed {path}: the entry's shape is wrong ({why}")
    assert err.count("\n") == 1
    assert not path.exists()


def test_a_good_marshal_entry_is_read(tmp_path: Path) -> None:
    path = tmp_path / "args" / "x.marshal"
    table = {"names": {"-h": (0, True, False)}, "env": ["LLAMA_ARG_X"]}
    state.write_bytes(path, marshal.dumps(table))
    assert trust.load_entry(str(path), trust.SHAPES["args"]) == table


def _launch(args: list[str], env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "safe_llama", *args],
        env={"PATH": "/usr/bin:/bin", "HOME": "/nonexistent", "SAFE_LLAMA_PREFIX": "/nonexistent", **env},
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def _plant_empty_args_table(env: dict[str, str]) -> Path:
    from safe_llama.remembered import passthrough

    where = passthrough._table_path("completion", env)
    assert where is not None
    state.write_bytes(Path(where), marshal.dumps({}))
    return Path(where)


def test_an_empty_no_model_table_no_longer_fails_every_launch(tmp_path: Path) -> None:
    env = _env(tmp_path)
    planted = _plant_empty_args_table(env)
    done = _launch(["completion", "--version"], env)
    assert "KeyError" not in done.stderr and done.returncode == 127, done.stderr  # not found, said plainly
    assert f"removed {planted}" in done.stderr


def test_forget_clears_every_kind_of_entry_and_doctor_names_a_bad_one(tmp_path: Path) -> None:
    env = _env(tmp_path)
    root = cache_dir(env)
    planted = _plant_empty_args_table(env)
    state.write_json(root / "toml" / "x.json", {"ctx_floor": "many"})  # the old raw form
    from safe_llama.commands.doctor import check_directories, probe_machine

    doctor = check_directories(probe_machine(env={**os.environ, **env}))
    assert doctor.status == "fail" and str(planted) in doctor.summary, doctor
    assert any(str(root / "toml" / "x.json") in line for line in doctor.details)
    kept = root / "llama.cpp" / "11434.0.0" / "cpu" / ".complete"
    kept.parent.mkdir(parents=True)
    kept.write_text("")
    removed = state.clear_entries(root)
    assert removed["args"] == 1 and removed["toml"] >= 1  # doctor's own reads kept the configs parsed too
    assert sorted(p.name for p in root.iterdir()) == ["llama.cpp"]  # the pinned build stays
    assert state.check_entries(root) == []
