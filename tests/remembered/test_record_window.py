"""Tests for safe_llama/remembered/record_window.py: what the window notes while it is open (variables read,
prefixes scanned, the whole environment iterated, files opened, stray lines on stderr) and nothing after it
closes. A whole launch under the window is tests/remembered/test_fast_record.py's."""

from __future__ import annotations

import sys
from pathlib import Path

from safe_llama.remembered.record_window import Recorder, pseudo


def test_the_window_notes_reads_while_open_only(tmp_path: Path) -> None:
    file = tmp_path / "read.txt"
    file.write_text("x")
    with Recorder({"A": "1", "SAFE_LLAMA_X": "2"}) as recorder:
        assert recorder.env["A"] == "1" and "B" not in recorder.env
        assert recorder.env.prefixed(("SAFE_LLAMA_",)) == {"SAFE_LLAMA_X": "2"}
        file.read_text()
        recorder.say(lambda message, level: None, "a reason", "info")
        sys.stderr.write("a stray line\n")
    assert recorder.names == {"A", "B"} and recorder.prefix_scans == {("SAFE_LLAMA_",)}
    assert ("open", str(file)) in recorder.opened and str(file) in recorder.at_close
    assert recorder.said == [("a reason", "info")] and recorder.stray == 1 and not recorder.everything
    recorder.env.get("C")
    list(recorder.env)
    assert "C" not in recorder.names and not recorder.everything


def test_iterating_the_environment_is_reading_all_of_it() -> None:
    with Recorder({"A": "1"}) as recorder:
        assert dict(recorder.env) == {"A": "1"}
    assert recorder.everything


def test_pseudo_files_are_no_inputs() -> None:
    assert pseudo("/proc/meminfo") and pseudo("/sys/fs/cgroup/memory.max") and not pseudo("/etc/hosts")
