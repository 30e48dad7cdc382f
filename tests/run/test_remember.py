"""Tests for safe_llama/run/remember.py: a plan lowered after an OOM kill of a ready server holds for the next
start under systemd's Restart= (the budget then differs a little), and a later ready start keeps it."""

from __future__ import annotations

from pathlib import Path

import pytest

from safe_llama.run import remember

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
