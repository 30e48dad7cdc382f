"""Tests for safe_llama/remembered/remember.py: a plan lowered after an OOM kill of a ready server holds for the next
start under systemd's Restart= (the budget then differs a little), and a later ready start keeps it; the key, what
breaks a record, and forget."""

from __future__ import annotations

from pathlib import Path

import pytest

from safe_llama.remembered import remember

GIB = 1 << 30


@pytest.mark.parametrize(
    ("after_oom", "budget_now", "usable"),
    [
        pytest.param(False, GIB, True, id="same budget"),
        pytest.param(False, GIB + 4096, False, id="a looser budget plans afresh"),
        pytest.param(True, GIB + 4096, True, id="after a kill: a page more is the same group"),
        pytest.param(True, GIB + GIB // 32, True, id="after a kill: up to 1/32 more"),
        pytest.param(True, GIB + GIB // 16, False, id="after a kill: a raised limit plans afresh"),
        pytest.param(True, GIB // 2, True, id="a tighter budget keeps it"),
    ],
)
def test_usable(after_oom: bool, budget_now: int, usable: bool) -> None:
    record = remember.Remembered(kv_bytes=1 << 20, learned_max_alloc=None, budget_bytes=GIB, after_oom=after_oom)
    assert remember.usable(record, budget_now) is usable


def test_after_kill_is_below_the_killed_plan_and_survives_a_ready_start(tmp_path: Path) -> None:
    env = {"XDG_CACHE_HOME": str(tmp_path)}
    killed = remember.after_kill(800 << 20, 0.875, None, GIB)
    assert (killed.kv_bytes, killed.after_oom) == (700 << 20, True)
    remember.store("a" * 40, killed, env)
    assert remember.recall("a" * 40, env) == killed
    # the restart planned at (or under) the lowered size and became ready: the flag and budget stay
    ready = remember.after_ready(remember.recall("a" * 40, env), 700 << 20, None, GIB + 8192)
    assert ready == remember.Remembered(700 << 20, None, GIB, after_oom=True)
    # a ready start above it (a looser budget planned afresh) is an ordinary record
    assert remember.after_ready(killed, 900 << 20, None, 2 * GIB) == remember.Remembered(900 << 20, None, 2 * GIB)


def test_records_written_before_the_flag_are_read(tmp_path: Path) -> None:
    env = {"XDG_CACHE_HOME": str(tmp_path)}
    folder = tmp_path / "safe-llama" / "plans"
    remember.store("b" * 40, remember.Remembered(1, None, 2), env)
    text = (folder / ("b" * 40 + ".json")).read_text()
    assert ',"after_oom":false' in text
    (folder / ("b" * 40 + ".json")).write_text(text.replace(',"after_oom":false', ""))
    assert remember.recall("b" * 40, env) == remember.Remembered(1, None, 2)


def _identity(**changes: object) -> remember.Identity:
    fields: dict[str, object] = {
        "model": "m:1:2",
        "binary": "b:3:4",
        "binary_version": "0.6.0",
        "device": "cpu:",
        "device_memory": None,
        "device_max_alloc": None,
        "budget_source": "RAM",
        "request": {"n_ctx": 4096, "type_k": "f16"},
    }
    fields.update(changes)
    return remember.Identity(**fields)  # type: ignore[arg-type]


def test_the_key_is_stable_and_changes_with_what_decides_a_fit() -> None:
    base = remember.key(_identity())
    assert base == remember.key(_identity()) and len(base) == 40
    others = [
        _identity(model="m:1:3"),
        _identity(binary_version="0.7.0"),
        _identity(device="vulkan:Vulkan0"),
        _identity(device_memory=8 * GIB),
        _identity(budget_source="cgroup"),
        _identity(request={"n_ctx": 8192, "type_k": "f16"}),
    ]
    assert len({base, *map(remember.key, others)}) == 1 + len(others)


@pytest.mark.parametrize(
    ("detail", "source", "expected"),
    [
        pytest.param("8 GiB (declared)", "declared", "declared", id="declared"),
        pytest.param("RLIMIT_AS 4 GiB", "probed", "RLIMIT_AS", id="ulimit"),
        pytest.param("cgroup memory.max", "probed", "cgroup", id="cgroup"),
        pytest.param("MemAvailable", "probed", "RAM", id="ram"),
    ],
)
def test_budget_source(detail: str, source: str, expected: str) -> None:
    assert remember.budget_source(detail, source) == expected


@pytest.mark.parametrize(
    "text",
    [
        pytest.param("not json", id="not json"),
        pytest.param('{"format": 1, "kv_bytes": 1, "learned_max_alloc": null, "budget_bytes": 2}', id="old format"),
        pytest.param('{"format": 2, "kv_bytes": 1}', id="a field missing"),
        pytest.param('{"format": 2, "kv_bytes": "x", "learned_max_alloc": null, "budget_bytes": 2}', id="not a number"),
        pytest.param("[2]", id="not an object"),
    ],
)
def test_a_record_that_cannot_be_read_is_no_record(tmp_path: Path, text: str) -> None:
    env = {"XDG_CACHE_HOME": str(tmp_path)}
    remember.store("c" * 40, remember.Remembered(1, None, 2), env)
    (tmp_path / "safe-llama" / "plans" / ("c" * 40 + ".json")).write_text(text)
    assert remember.recall("c" * 40, env) is None
    assert remember.recall("d" * 40, env) is None  # never stored
