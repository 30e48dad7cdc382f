"""#33 row 1: a cache folder someone else owns or can write (a 0777 folder, another user's, a symlink to
another user's) chose the binary safe-llama ran, as the victim; now such a folder is neither read nor
written, and one line names it and what is wrong (OpenSSH's StrictModes)."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from safe_llama import state, trust
from tests.security.conftest import NOBODY, OTHER, owned, plant_binary, run_as_nobody


def _layout(base: Path, how: str) -> tuple[Path, Path]:
    """The victim's XDG_CACHE_HOME and the safe-llama folder in it the attacker controls, laid out `how`."""
    if how == "0777 folder":
        xdg = owned(base / "shared", 0, 0o777)
        return xdg, xdg / "safe-llama"
    if how == "another user's folder":
        xdg = owned(base / "theirs", OTHER, 0o755)
        return xdg, xdg / "safe-llama"
    xdg = owned(base / "victim", NOBODY, 0o700)  # a symlink in the victim's own folder to the attacker's
    target = owned(base / "attacker", OTHER, 0o755) / "cache"
    (xdg / "safe-llama").symlink_to(target)
    return xdg, target


LAYOUTS = ["0777 folder", "another user's folder", "symlink to another user's folder"]


@pytest.mark.parametrize("how", LAYOUTS)
def test_a_planted_pinned_build_is_not_run(base: Path, how: str) -> None:
    xdg, planted = _layout(base, how)
    marker = owned(base / "out", 0, 0o777) / "ran"
    plant_binary(planted, marker)
    env = {"XDG_CACHE_HOME": str(xdg), "XDG_CONFIG_HOME": str(base / "none"), "SAFE_LLAMA_PREFIX": str(base / "none")}
    done = run_as_nobody(["completion", "--version"], env)
    assert not marker.exists(), "the planted binary ran as the victim"
    assert done.returncode == 127  # not found: the pinned build in the cache is not a trusted place
    said = [line for line in done.stderr.splitlines() if "not running" in line]
    assert len(said) == 1 and "llama-completion" in said[0], done.stderr
    assert str(base) in said[0] and ("writable by" in said[0] or f"uid {OTHER}" in said[0])


@pytest.mark.parametrize("how", LAYOUTS)
def test_a_planted_parsed_config_is_not_read(base: Path, how: str) -> None:
    """The victim's config.toml is kept parsed in the cache (toml/<key>.json): one planted there named a
    bin_dir of the attacker's."""
    xdg, planted = _layout(base, how)
    marker = owned(base / "out", 0, 0o777) / "ran"
    fake = plant_binary(base / "elsewhere", marker)
    config = owned(base / "config", NOBODY, 0o700) / "safe-llama" / "config.toml"
    owned(config.parent, NOBODY, 0o700)
    config.write_text("[launcher]\n")
    os.chown(config, NOBODY, NOBODY)
    st = os.stat(config)
    identity = f"{config}|{st.st_size}|{st.st_mtime_ns}|{st.st_ino}"
    data = {"launcher": {"bin_dir": str(fake.parent)}}
    entry = {"format": state.TOML_FORMAT, "key": identity, "sum": state._toml_sum(data), "data": data}
    toml = planted / "toml"
    toml.mkdir(parents=True, exist_ok=True)
    (toml / f"{state.cache_name(identity)}.json").write_text(json.dumps(entry))
    for path in [planted, *planted.rglob("*")]:
        os.lchown(path, OTHER, OTHER)
    env = {"XDG_CACHE_HOME": str(xdg), "XDG_CONFIG_HOME": str(base / "config"), "SAFE_LLAMA_PREFIX": str(base)}
    done = run_as_nobody(["completion", "--version"], env)
    assert not marker.exists(), "the planted config entry chose the binary"
    assert done.returncode == 127, done.stderr
    assert "not using" in done.stderr and str(base) in done.stderr


def test_an_unusable_cache_is_not_read_either(base: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """check_cache's "not usable" turned writes off but reads went on: now the reads stop too."""
    monkeypatch.setattr(state, "_writes_off", [])  # this process's switch, not the next test's
    xdg, planted = _layout(base, "0777 folder")
    (planted / "plans").mkdir(parents=True)
    (planted / "plans" / "x.json").write_text('{"a": 1}')
    reason = state.check_cache(planted)
    assert reason is not None and "writable by group and others" in reason and str(xdg) in reason
    assert state.read_json(planted / "plans" / "x.json") is None


@pytest.mark.parametrize(
    ("mode", "owner", "wrong"),
    [
        pytest.param(0o700, "me", None, id="private"),
        pytest.param(0o755, "me", None, id="readable"),
        pytest.param(0o775, "me", "writable by group", id="group-writable"),
        pytest.param(0o777, "root", "writable by group and others", id="world-writable"),
        pytest.param(0o1777, "root-above", None, id="sticky-above"),
        pytest.param(0o755, "other", f"owned by uid {OTHER}", id="another-user"),
    ],
)
def test_the_rule(base: Path, mode: int, owner: str, wrong: str | None) -> None:
    uid = {"me": os.geteuid(), "root": 0, "other": OTHER, "root-above": 0}[owner]
    folder = owned(base / "f", uid, mode)
    if owner == "root-above":  # /tmp: a root-owned sticky folder above is fine, my folder in it is mine
        folder = owned(folder / "mine", os.geteuid(), 0o700)
    found = trust.problem(folder / "safe-llama")
    assert (found is None) if wrong is None else (wrong in (found or "") and str(base / "f") in (found or ""))
