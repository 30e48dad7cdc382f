"""Tests for safe_llama/process/startup.py: the start-up watcher on output chunks (failure signatures, the last
line without a newline, a watcher with no table)."""

from __future__ import annotations

from safe_llama.diagnosis.signatures import load_table
from safe_llama.process.relay import Stream
from safe_llama.process.startup import StartupWatcher, Verdict


def test_signature_watcher_stops_at_an_allocation_failure() -> None:
    watcher = StartupWatcher(load_table())
    assert watcher.output(Stream.STDERR, b"0.00.1.000 I load: loading\nE ggml_aligned_") is Verdict.CONTINUE
    assert watcher.output(Stream.STDOUT, b"unrelated stdout\n") is Verdict.CONTINUE  # a separate line
    assert (
        watcher.output(Stream.STDERR, b"malloc: insufficient memory (attempted to allocate 1.00 MB)\n")
        is Verdict.STOP_FAILED
    )
    failure = watcher.conclude(1)
    assert failure is not None and failure.memory and failure.signature_id == "cpu-aligned-malloc"


def test_signature_watcher_reads_the_last_line_without_newline() -> None:
    watcher = StartupWatcher(load_table())
    assert watcher.output(Stream.STDERR, b"error: invalid argument: --x") is Verdict.CONTINUE
    failure = watcher.conclude(1)
    assert failure is not None and not failure.memory and failure.signature_id == "invalid-argument"


def test_a_watcher_without_a_table_scans_nothing_and_tells_ready() -> None:
    told: list[str] = []
    watcher = StartupWatcher(None, lambda: told.append("ready"))
    line = b"malloc: insufficient memory (attempted to allocate 1.00 MB)\n"
    assert watcher.output(Stream.STDERR, line) is Verdict.CONTINUE
    assert watcher.conclude(1) is None and watcher.matches == []
    watcher.ready()
    assert told == ["ready"]
