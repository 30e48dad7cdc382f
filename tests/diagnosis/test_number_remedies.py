"""Tests for safe_llama/diagnosis/number_remedies.py: remedies from a log's numbers alone (no model)."""

from __future__ import annotations

import pytest

from safe_llama.diagnosis import number_remedies as numbers
from safe_llama.diagnosis.failed_run import failed_run
from safe_llama.diagnosis.log_reading import LogFacts
from safe_llama.diagnosis.signatures import Failure
from safe_llama.paths import packaged_configs
from safe_llama.plan.policy import load_policy

POLICY = load_policy(packaged_configs() / "planner.toml")


@pytest.mark.parametrize(
    ("budget", "requested", "cells", "expected"),
    [
        pytest.param(4294959104 - 4194304, 7516192768, 65536, 37376, id="seed"),
        pytest.param(114688 * 37632, 7516192768, 65536, 37632, id="exactly-on-the-grid"),
        pytest.param(114688 * 37632 - 1, 7516192768, 65536, 37376, id="one-byte-short"),
        pytest.param(100, 7516192768, 65536, 0, id="nothing-fits"),
    ],
)
def test_grid_context(budget: int, requested: int, cells: int, expected: int) -> None:
    assert numbers._grid(budget, requested, cells) == expected


@pytest.mark.parametrize(
    ("args", "unit"),
    [
        pytest.param(("-c", "65536"), 256, id="unified-slots"),
        pytest.param(("-np", "2", "-c", "65536"), 512, id="a-stream-per-slot"),
    ],
)
def test_a_smaller_context_is_one_llama_cpp_makes(args: tuple[str, ...], unit: int) -> None:
    """Without a limit in the log: the policy's share of the failed allocation, on the command's grid."""
    run = failed_run(LogFacts(), args=args, model=None, tool="server")
    failure = Failure("alloc", True, requested_bytes=65536 * 3072)
    remedies, _ = numbers.number_remedies(failure, "kv", LogFacts(backend="cpu"), run, POLICY)
    ctx = next(r for r in remedies if r.step == "ctx")
    share = POLICY.failed_alloc_share
    assert ctx.argv_changes == {"--ctx-size": str(int(65536 * share) // unit * unit)}
    assert f"largest multiple of {unit} " in ctx.detail
    assert f"{share.numerator}/{share.denominator} of the allocation that failed" in ctx.detail
