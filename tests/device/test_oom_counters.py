"""Reading OOM counters from located files (probe_host finds them; test_probe_host covers both together)."""

from __future__ import annotations

from pathlib import Path

from safe_llama.device.oom_counters import read_counters


def test_fields_single_numbers_and_unreadable_files(tmp_path: Path) -> None:
    (tmp_path / "vmstat").write_text("pgfault 10\noom_kill 3\n")
    (tmp_path / "failcnt").write_text("7\n")
    (tmp_path / "events").write_text("oom 1\noom_kill x\n")
    sources = [
        (str(tmp_path / "vmstat"), "oom_kill"),
        (str(tmp_path / "failcnt"), None),
        (str(tmp_path / "events"), "oom_kill"),
        (str(tmp_path / "missing"), "oom_kill"),
    ]
    assert read_counters(sources) == {f"{tmp_path / 'vmstat'} oom_kill": 3, str(tmp_path / "failcnt"): 7}
