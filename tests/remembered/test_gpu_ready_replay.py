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
def test_a_gpu_start_after_a_first_is_within_5_percent_of_bare(name: str) -> None:
    data = _recorded()
    conditions = data["conditions"]
    assert isinstance(conditions, dict)
    row = conditions[name]
    runs = row["runs"]
    assert len(runs["safe_llama"]) >= 5 and len(runs["bare"]) >= 5
    assert None not in runs["safe_llama"] and None not in runs["bare"]
    assert row["first_start_wrote_a_record"] and all(row["early"])
    again = summary(runs)
    assert again["median_safe_llama"] == row["median_safe_llama"]  # the figures are the runs'
    assert row["ratio_safe_llama"] <= 1.05


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
