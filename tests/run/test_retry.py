"""The retry's arithmetic: the number an error names first, then steps below the failure. Pure values;
the failures come from real logs in tests/fixtures/logs/."""

from __future__ import annotations

import pytest

from safe_llama.diagnosis.signatures import Failure, classify, load_table, scan_text
from safe_llama.run.retry import STEP, Attempt, Learned, learn
from tests import FIXTURES

LOGS = FIXTURES / "logs"
GIB = 1 << 30


def _failure(name: str) -> Failure:
    data = (LOGS / name).read_bytes().split(b"\n", 1)[1]
    failure = classify(scan_text(load_table(), data), 1)
    assert failure is not None and failure.memory
    return failure


def test_compute_buffer_named_by_cuda_is_planned_with_exactly() -> None:
    """The H200 recording: 2,000,128 cells of q8_0 KV fit, the 34,837,395,584-byte compute buffer did not."""
    estimate = 2 * GIB  # what the planner had counted for the compute buffers at that size
    lesson = learn(
        Attempt(kv_bytes=139 * GIB, compute_estimate=estimate),
        _failure("cuda-compute-oom-q8.log"),
        Learned(),
        lower_kv=None,
        search_band=False,
    )
    assert lesson.learned.compute_extra == 34837395584 - estimate
    assert lesson.learned.kv_cap is None and lesson.learned.margin == "keep"  # the number, not a shrink
    assert "32.44 GiB" in lesson.reason


def test_compute_buffer_within_the_estimate_is_no_news() -> None:
    failure = _failure("server-compute-oom-lv4.log")  # 175,403,040 bytes
    lesson = learn(
        Attempt(kv_bytes=500_000_000, compute_estimate=180_000_000), failure, Learned(), lower_kv=None, search_band=True
    )
    assert lesson.learned.compute_extra == 0
    assert lesson.learned.kv_cap == int(500_000_000 * (1 - STEP)) and lesson.learned.margin == "band"


def test_device_max_allocation_is_learned_without_a_cap() -> None:
    lesson = learn(
        Attempt(kv_bytes=7516192768, compute_estimate=1),
        _failure("openvino-seed.log"),
        Learned(),
        lower_kv=None,
        search_band=False,
    )
    assert lesson.learned.max_alloc == 4294959104 and lesson.learned.kv_cap is None
    again = learn(
        Attempt(kv_bytes=7516192768, compute_estimate=1),
        _failure("openvino-seed.log"),
        lesson.learned,
        lower_kv=None,
        search_band=False,
    )
    assert again.learned.kv_cap == int(7516192768 * (1 - STEP))  # the same limit again is no news


@pytest.mark.parametrize(
    ("attempt", "lower", "cap"),
    [
        pytest.param(Attempt(6_144_393_216, 0), None, int(6_144_393_216 * (1 - STEP)), id="first-step-3pc"),
        pytest.param(Attempt(1000, 0, stepped=True), 600, 800, id="step-failed-halve-to-plan"),
        pytest.param(Attempt(1000, 0, stepped=True), 990, int(1000 * (1 - STEP)), id="halving-never-above-3pc"),
        pytest.param(Attempt(1000, 0, stepped=True), None, 500, id="step-failed-no-plan-halve"),
        pytest.param(Attempt(1000, 0, stepped=True), 1200, 500, id="plan-above-failure-halve"),
    ],
)
def test_steps_below_a_failure_that_names_nothing(attempt: Attempt, lower: int | None, cap: int) -> None:
    lesson = learn(attempt, _failure("server-thread-oom.log"), Learned(), lower_kv=lower, search_band=False)
    assert lesson.learned.kv_cap == cap and lesson.learned.margin == "keep"
    assert lesson.reason.startswith("a thread's stack did not fit")


def test_a_cap_never_grows_back() -> None:
    lesson = learn(
        Attempt(1000, 0), _failure("server-kv-oom.log"), Learned(kv_cap=100), lower_kv=None, search_band=False
    )
    assert lesson.learned.kv_cap == 100


def test_a_worker_that_stopped_gets_a_smaller_share() -> None:
    from safe_llama.run.retry import WORKER_SHARE, worker_cap

    assert worker_cap(400, None) == int(400 * WORKER_SHARE) < 400
    assert worker_cap(400, 100) == 100  # never above an earlier cap


def test_a_vulkan_kv_tensor_over_the_range_steps_the_kv_down() -> None:
    """lavapipe's abort names the tensor (cache_k_l5), not a size: the next attempt's KV is a step below."""
    failure = _failure("vulkan-kv-tensor-abort.log")
    lesson = learn(
        Attempt(kv_bytes=800 << 20, compute_estimate=1), failure, Learned(), lower_kv=None, search_band=False
    )
    assert lesson.learned.kv_cap == int((800 << 20) * (1 - STEP))
    assert lesson.reason.startswith("the KV cache did not fit")
