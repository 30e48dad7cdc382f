"""The retry's arithmetic: the number an error names first, then steps below the failure (pure values; the
failures come from real logs in tests/fixtures/logs/), and an attempt's size on a real prepared launch (a 3B
model's header, the pinned CPU build, a declared 4 GiB host budget, which holds less KV than -c 65536)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from safe_llama.attempts import retry
from safe_llama.attempts.retry import KEEP_MARGIN, MARGIN_BAND, STEP, Attempt, Lesson, named_lesson, step_below
from safe_llama.diagnosis.signatures import LESSON_FIELDS, Failure, classify, load_table, scan_text
from safe_llama.pipeline.options import launch_options
from safe_llama.pipeline.prepare import Prepared, prepare
from safe_llama.plan.lessons import Lessons
from tests import FIXTURES
from tests.tiny_gguf import LLAMA_3B, write_metadata_gguf

LOGS = FIXTURES / "logs"
GIB = 1 << 30


def learn(
    attempt: Attempt, failure: Failure, before: Lessons, *, stepped: bool = False, lower_kv: int | None,
    search_band: bool,
) -> Lesson:  # fmt: skip
    """As the attempt loop asks: the number named first, else a step below."""
    named = named_lesson(attempt, failure, before)
    if named is not None:
        return named
    return step_below(attempt, failure, before, stepped=stepped, lower_kv=lower_kv, search_band=search_band)


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
        Lessons(),
        lower_kv=None,
        search_band=False,
    )
    assert lesson.lessons.compute_extra == 34837395584 - estimate
    assert lesson.lessons.kv_cap is None and lesson.lessons.margin_scale == KEEP_MARGIN  # the number, not a shrink
    assert "32.44 GiB" in lesson.reason


def test_a_kv_buffer_refused_by_the_gpu_teaches_the_room_it_had() -> None:
    """The H200 recording (llama-server -c 2000000 -ngl 99 --fit off): the 262,160,777,216-byte CUDA0 KV buffer
    was refused after the weights: the device held less than both, and the compute buffers still come after."""
    weights = 3 * GIB
    attempt = Attempt(kv_bytes=262_160_777_216, compute_estimate=GIB, device="CUDA0", device_weights=weights)
    lesson = learn(attempt, _failure("cuda-oom-fitoff.log"), Lessons(), lower_kv=None, search_band=False)
    assert lesson.lessons.device_cap == weights + 262_160_777_216 - 1
    assert lesson.lessons.kv_cap is None and lesson.lessons.margin_scale == KEEP_MARGIN
    assert lesson.reason.startswith("the KV cache (244.16 GiB) did not fit on CUDA0 beside 3.00 GiB of weights")
    # not planned (weights unknown), or on another device: a step below, as before
    unplanned = learn(Attempt(262_160_777_216, GIB, "CUDA0"), _failure("cuda-oom-fitoff.log"), Lessons(),
                      lower_kv=None, search_band=False)  # fmt: skip
    assert unplanned.lessons.device_cap is None and unplanned.lessons.kv_cap is not None


def test_compute_buffer_within_the_estimate_is_no_news() -> None:
    failure = _failure("server-compute-oom-lv4.log")  # 175,403,040 bytes
    lesson = learn(
        Attempt(kv_bytes=500_000_000, compute_estimate=180_000_000), failure, Lessons(), lower_kv=None, search_band=True
    )
    assert lesson.lessons.compute_extra == 0
    assert lesson.lessons.kv_cap == int(500_000_000 * (1 - STEP)) and lesson.lessons.margin_scale == MARGIN_BAND


def test_device_max_allocation_is_learned_without_a_cap() -> None:
    lesson = learn(
        Attempt(kv_bytes=7516192768, compute_estimate=1),
        _failure("openvino-seed.log"),
        Lessons(),
        lower_kv=None,
        search_band=False,
    )
    assert lesson.lessons.learned_max_alloc == 4294959104 and lesson.lessons.kv_cap is None
    again = learn(
        Attempt(kv_bytes=7516192768, compute_estimate=1),
        _failure("openvino-seed.log"),
        lesson.lessons,
        lower_kv=None,
        search_band=False,
    )
    assert again.lessons.kv_cap == int(7516192768 * (1 - STEP))  # the same limit again is no news


@pytest.mark.parametrize(
    ("attempt", "stepped", "lower", "cap"),
    [
        pytest.param(Attempt(6_144_393_216, 0), False, None, int(6_144_393_216 * (1 - STEP)), id="first-step-3pc"),
        pytest.param(Attempt(1000, 0), True, 600, 800, id="step-failed-halve-to-plan"),
        pytest.param(Attempt(1000, 0), True, 990, int(1000 * (1 - STEP)), id="halving-never-above-3pc"),
        pytest.param(Attempt(1000, 0), True, None, 500, id="step-failed-no-plan-halve"),
        pytest.param(Attempt(1000, 0), True, 1200, 500, id="plan-above-failure-halve"),
    ],
)
def test_steps_below_a_failure_that_names_nothing(attempt: Attempt, stepped: bool, lower: int | None, cap: int) -> None:
    failure = _failure("server-thread-oom.log")
    lesson = learn(attempt, failure, Lessons(), stepped=stepped, lower_kv=lower, search_band=False)
    assert lesson.lessons.kv_cap == cap and lesson.lessons.margin_scale == KEEP_MARGIN
    assert lesson.reason.startswith("a thread's stack did not fit")


def test_every_lesson_a_signature_teaches_has_its_rule() -> None:
    """A row's `teaches` names a Lessons field; each one named in the packaged table is a learner's."""
    taught = {sig.teaches for sig in load_table().signatures if sig.teaches is not None}
    assert taught == set(retry.LEARNERS) and set(retry.LEARNERS) <= set(LESSON_FIELDS)


def test_a_cap_never_grows_back() -> None:
    lesson = learn(
        Attempt(1000, 0), _failure("server-kv-oom.log"), Lessons(kv_cap=100), lower_kv=None, search_band=False
    )
    assert lesson.lessons.kv_cap == 100


def test_a_worker_that_stopped_gets_a_smaller_share() -> None:
    from safe_llama.attempts.retry import WORKER_SHARE, with_worker_cap, worker_cap

    assert worker_cap(400, None) == int(400 * WORKER_SHARE) < 400
    assert worker_cap(400, 100) == 100  # never above an earlier cap
    lessons, cap = with_worker_cap(Lessons(worker_caps=(("10.0.0.2:50052", 100),)), "10.0.0.1:50052", 400)
    assert cap == int(400 * WORKER_SHARE)
    assert lessons.worker_caps == (("10.0.0.1:50052", cap), ("10.0.0.2:50052", 100))


def test_a_vulkan_kv_tensor_over_the_range_steps_the_kv_down() -> None:
    """lavapipe's abort names the tensor (cache_k_l5), not a size: the next attempt's KV is a step below."""
    failure = _failure("vulkan-kv-tensor-abort.log")
    lesson = learn(
        Attempt(kv_bytes=800 << 20, compute_estimate=1), failure, Lessons(), lower_kv=None, search_band=False
    )
    assert lesson.lessons.kv_cap == int((800 << 20) * (1 - STEP))
    assert lesson.reason.startswith("the KV cache did not fit")


@pytest.fixture(scope="module")
def prepared(tmp_path_factory: pytest.TempPathFactory, llama_bin: Path) -> Prepared:
    tmp = tmp_path_factory.mktemp("footprint")
    model = write_metadata_gguf(tmp / "Llama-3.2-3B-Instruct-Q4_K_M.gguf", "llama", LLAMA_3B)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("LLAMA_ARG_", "SAFE_LLAMA_", "GGML_"))}
    env.update(XDG_CACHE_HOME=str(tmp / "cache"), XDG_CONFIG_HOME=str(tmp / "config"))
    env["SAFE_LLAMA_BIN_DIR"] = str(llama_bin)
    found = prepare("completion", ["-m", str(model), "-c", "65536"], env, launch_options({"host_memory": "4G"}).plan)
    assert found.plan is not None and not found.target.on_gpu
    return found


def test_footprints_on_the_cpu(prepared: Prepared) -> None:
    assert prepared.plan is not None
    planned = retry.planned_footprint(prepared)
    unplanned = retry.unplanned_footprint(prepared)
    assert planned == (0, 0, prepared.plan.kv.total_bytes)  # nothing on a device: the KV in all is the size
    assert unplanned[:2] == (0, 0) and unplanned[2] > planned[2]  # -c 65536 as asked is more than the plan


def test_the_failed_attempt_as_the_retry_sees_it(prepared: Prepared) -> None:
    assert prepared.plan is not None
    planned = retry.attempted(prepared, None, planned=True)
    assert (planned.kv_bytes, planned.device) == (prepared.plan.kv.total_bytes, None)
    as_asked = retry.attempted(prepared, retry.unplanned_footprint(prepared), planned=False)
    assert as_asked.kv_bytes == retry.unplanned_footprint(prepared)[2]
    assert as_asked.compute_estimate > planned.compute_estimate  # the compute estimate at the larger KV
