"""The H200's time to /health 200 (benchmarks/bench_gpu_ready.py, recorded in
tests/fixtures/nvidia-h200-cuda/gpu-ready/gpu-ready.json): safe-llama's start after a first one is within 5% of
bare llama-server given its final argv, on an empty GPU and with 80 GiB held, and it came from the launch
record (the early start). Skipped until the recording is there; the CPU run of the same script is the slow test
below."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import pytest

from benchmarks.bench_gpu_ready import summary
from tests import ROOT

FIXTURE = ROOT / "tests" / "fixtures" / "nvidia-h200-cuda" / "gpu-ready" / "gpu-ready.json"


def _recorded() -> dict[str, object]:
    if not FIXTURE.exists():
        pytest.skip(f"no H200 recording yet: {FIXTURE.relative_to(ROOT)} (benchmarks/bench_gpu_ready.py writes it)")
    data = json.loads(FIXTURE.read_text())
    assert isinstance(data, dict)
    return data


@pytest.mark.parametrize("name", ["empty", "held"])
def test_the_recorded_gpu_starts(name: str) -> None:
    """What the recording shows: at least five alternated runs each, llama-server's exec seen in each, the
    medians are the runs', every first start wrote a launch record; with 80 GiB held every start after it was an
    early start, and faster than planning again."""
    data = _recorded()
    conditions = data["conditions"]
    assert isinstance(conditions, dict)
    row = conditions[name]
    runs = row["runs"]
    assert len(runs["safe_llama"]) >= 5 and len(runs["bare"]) >= 5
    assert None not in runs["safe_llama"] and None not in runs["bare"]
    assert row["first_start_wrote_a_record"]
    execs = row["exec_s"]  # safe-llama's own part comes before llama-server's exec, bare's is the Popen's
    assert all(0 < e < t for e, t in zip(execs["safe_llama"], runs["safe_llama"], strict=True))
    assert max(execs["bare"]) < min(execs["safe_llama"])
    again = summary(runs)
    assert again["median_safe_llama"] == row["median_safe_llama"]  # the figures are the runs'
    if name == "held":
        assert all(row["early"])
        assert row["median_safe_llama"] < row["median_planned"]


@pytest.mark.parametrize(
    "name",
    [
        "empty",
        pytest.param(
            "held",
            marks=pytest.mark.xfail(
                strict=True,
                reason="issue 37's goal, not reached on the H200 with 80 GiB held: 1.078x of bare llama-server (9 of 9 "
                "early starts; 0.061 s from the command to llama-server's exec: the interpreter's start 14 ms, one "
                "NVML reading in a forked child ~30 ms, overlapped with the record's checks; recorded before a "
                "server's child started while that reading answers, which the H200 has not measured yet)",
            ),
        ),
    ],
)
def test_a_gpu_start_after_a_first_is_within_5_percent_of_bare(name: str) -> None:
    row = _recorded()["conditions"][name]  # type: ignore[index]
    assert all(row["early"]) and row["ratio_safe_llama"] <= 1.05


@pytest.mark.slow
def test_the_script_runs_on_the_cpu_build(tmp_path: Path, llama_bin: Path) -> None:
    """The script the H200 runs, on this machine's CPU build and the bundled model (one condition, few runs):
    the first start writes a record and the starts after it take it."""
    import subprocess

    from safe_llama.model.bundled import bundled_model_path

    out = tmp_path / "gpu-ready.json"
    cmd = [sys.executable, str(ROOT / "benchmarks" / "bench_gpu_ready.py"), "--bin-dir", str(llama_bin),
           "--model", str(bundled_model_path(os.environ)), "--args", "-c 4096", "--conditions", "empty",
           "--runs", "2", "--planned-runs", "1", "--out", str(out), "--logs", str(tmp_path / "logs")]  # fmt: skip
    subprocess.run(cmd, check=True, capture_output=True, timeout=300)
    row = json.loads(out.read_text())["conditions"]["empty"]
    assert row["first_start_wrote_a_record"] and row["early"] == [True, True]
    assert "4096" in row["final_argv"] and row["median_safe_llama"] is not None
    # the exec of llama-server is seen before /health answers, and safe-llama's comes after bare's own
    execs, ready = row["exec_s"], row["runs"]
    assert all(e is not None and 0 <= e < t for e, t in zip(execs["safe_llama"], ready["safe_llama"], strict=True))
    assert all(e is not None and e < s for e, s in zip(execs["bare"], execs["safe_llama"], strict=True))
