"""Tests for safe_llama/attempts/handoff.py: the end's words, written and read back, and every word that is not
one it writes refused (the handed process deletes and writes files by them). The end itself runs for real in
tests/process/test_handed.py and tests/attempts/test_cgroup_real.py (an OOM kill once ready, remembered)."""

from __future__ import annotations

import os

import pytest

from safe_llama.attempts.handoff import Ending, ending_words
from safe_llama.constants import cache_root


def test_the_words_read_back(tmp_path: os.PathLike[str]) -> None:
    env = {"XDG_CACHE_HOME": str(tmp_path)}
    record = os.path.join(cache_root(env), "launch", "ab12.marshal")
    ledger = f"/run/user/1000/safe-llama/ledger/{os.getpid()}.json"
    words = ending_words(env, ledger=ledger, kill=(1 << 30, None, 1 << 33), digest="ab12cd", record=record)
    assert words is not None
    ending = Ending(words, env)
    assert (ending.ledger, ending.kill, ending.digest, ending.record) == (
        ledger,
        (1 << 30, None, 1 << 33),
        "ab12cd",
        record,
    )
    assert ending_words(env) == []
    assert ending_words(env, record="/elsewhere/x.marshal") is None  # the handed process would refuse it: no hand-off


@pytest.mark.parametrize(
    "word",
    [
        pytest.param("ledger=/etc/passwd", id="ledger-not-this-pid"),
        pytest.param("record=/home/someone/.bashrc", id="record-outside-the-cache"),
        pytest.param("kill=1,2", id="kill-two-figures"),
        pytest.param("kill=x,-,3", id="kill-not-a-number"),
        pytest.param("kill=-,-,3", id="kill-no-kv"),
        pytest.param("digest=../../x", id="digest-a-path"),
        pytest.param("unlink=/tmp/x", id="unknown"),
    ],
)
def test_a_word_it_does_not_write_is_refused(word: str, tmp_path: os.PathLike[str]) -> None:
    with pytest.raises(ValueError, match="hand-off"):
        Ending([word], {"XDG_CACHE_HOME": str(tmp_path)})


def test_a_kill_for_memory_is_remembered_and_the_early_record_dropped(tmp_path: os.PathLike[str]) -> None:
    """The end's OOM-kill branch, as the launch's loop (remember_kill) and an early start (its record dropped)."""
    from safe_llama.attempts.handoff import _killed_for_memory
    from safe_llama.attempts.say import Say
    from safe_llama.remembered import remember

    env = {"XDG_CACHE_HOME": str(tmp_path), "SAFE_LLAMA_QUIET": "1"}
    record = os.path.join(cache_root(env), "launch", "ab12.marshal")
    os.makedirs(os.path.dirname(record))
    open(record, "wb").close()  # an empty file stands for the record
    words = ending_words(env, kill=(1 << 30, None, 1 << 33), digest="ab12cd", record=record)
    assert words is not None
    _killed_for_memory(Ending(words, env), "oom_kill rose from 0 to 1", env, Say(env))
    assert not os.path.exists(record)
    kept = remember.recall("ab12cd", env)
    assert kept is not None and kept.after_oom and kept.kv_bytes < 1 << 30 and kept.budget_bytes == 1 << 33
