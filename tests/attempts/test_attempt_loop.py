"""The attempt loop's decisions, fed outcomes as values: no process runs here. The plans are the planner's own
(a 3B model's header, the pinned CPU build's listing, a declared 4 GiB host budget)."""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path

import pytest

from safe_llama.attempts.attempt_loop import AttemptLoop, Exit, Retry
from safe_llama.attempts.retry import STEP
from safe_llama.diagnosis.signatures import Failure
from safe_llama.errors import ExitStatus, SafeLlamaError
from safe_llama.pipeline.options import launch_options
from safe_llama.pipeline.prepare import Prepared, prepare, replan
from safe_llama.plan.lessons import Lessons
from safe_llama.process.startup import Outcome
from tests.tiny_gguf import LLAMA_3B, write_metadata_gguf

THREAD = Failure(kind="alloc", memory=True, signature_id="thread-create", line="libgomp: no stack", stage="thread")
Launch = tuple[Prepared, Callable[[Prepared, Lessons], Prepared], list[Lessons]]


def _ended(failure: Failure | None, code: int = 1) -> Outcome:
    return Outcome(code, code, False, failure, False, None, (), 1, False)


@pytest.fixture
def launch(tmp_path: Path, llama_bin: Path) -> Launch:
    model = write_metadata_gguf(tmp_path / "Llama-3.2-3B-Instruct-Q4_K_M.gguf", "llama", LLAMA_3B)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("LLAMA_ARG_", "SAFE_LLAMA_", "GGML_"))}
    env.update(XDG_CACHE_HOME=str(tmp_path / "cache"), XDG_CONFIG_HOME=str(tmp_path / "config"))
    env["SAFE_LLAMA_BIN_DIR"] = str(llama_bin)
    options = launch_options({"host_memory": "4G"}).plan
    asked: list[Lessons] = []

    def planned_with(prepared: Prepared, lessons: Lessons) -> Prepared:
        asked.append(lessons)
        return replan(prepared, options, lessons, env)

    return prepare("completion", ["-m", str(model), "-c", "65536"], env, options), planned_with, asked


def _loop(launch: Launch, attempts: int = 4) -> AttemptLoop:
    prepared, planned_with, _ = launch
    return AttemptLoop(prepared, Lessons(), planned_with, args=[], attempts=attempts, predict=True, search_band=True)


def test_unplanned_llama_cpp_runs_as_given_and_is_not_retried() -> None:
    loop = AttemptLoop(
        None, Lessons(), lambda again, _: again, args=["-m", "x"], attempts=4, predict=True, search_band=False
    )
    start = loop.next_start()
    assert (start.number, start.argv, start.planned, start.lines) == (1, ["-m", "x"], False, ())
    verdict = loop.observe(_ended(THREAD, 134))
    assert verdict == Exit(
        134, (("start failed for lack of memory (libgomp: no stack); no plan to retry with", "error"),)
    )


def test_an_exit_that_is_not_memory_ends_the_launch(launch: Launch) -> None:
    loop = _loop(launch)
    loop.next_start()
    assert loop.observe(_ended(Failure(kind="exit", memory=False), 2)) == Exit(2)


def test_a_start_whose_log_was_cut_short_runs_once_more_the_same(launch: Launch) -> None:
    """llama.cpp can lose its last log lines when it exits within ms (signatures.cut_short): the same start runs
    again, once a launch, said in one line and without the plan's lines again; a second cut log ends the launch
    with the child's code, as an exit that is not memory does."""
    prepared, _, asked = launch
    loop = _loop(launch)
    first = loop.next_start()
    cut = Failure(kind="log_cut", memory=False)
    verdict = loop.observe(_ended(cut))
    assert isinstance(verdict, Retry) and not verdict.read_free_again
    said = "attempt 1 exited 1 before llama.cpp's log said why (it loses its last lines when it exits within "
    assert verdict.lines == ((said + "milliseconds); starting the same again to read it", "warning"),)
    again = loop.next_start()
    assert (again.number, again.argv, again.extra_env, again.lines) == (2, first.argv, first.extra_env, ())
    assert asked == [] and loop.prepared is prepared  # not planned again
    assert loop.observe(_ended(cut)) == Exit(1)
    last = _loop(launch, attempts=1)
    last.next_start()
    assert last.observe(_ended(cut)) == Exit(1)  # no attempt left for it


def test_each_failure_is_planned_again_once_and_smaller(launch: Launch) -> None:
    prepared, _, asked = launch
    assert prepared.plan is not None
    loop = _loop(launch)
    first = loop.next_start()
    assert first.planned and first.lines == tuple(step.reason for step in prepared.plan.steps)
    verdict = loop.observe(_ended(THREAD))
    assert isinstance(verdict, Retry) and verdict.read_free_again
    assert verdict.lines[0][0].startswith("attempt 1 failed: libgomp: no stack; retrying: a thread's stack")
    assert asked == []  # nothing named, first failure: no plan is asked for to learn
    second = loop.next_start()
    assert len(asked) == 1 and asked[0].kv_cap == int(prepared.plan.kv.total_bytes * (1 - STEP))
    assert second.number == 2 and second.give_up is None and second.argv != first.argv
    assert loop.prepared is not None and loop.prepared.target.lessons == asked[0]


def test_the_last_attempt_gives_up_with_its_own_code(launch: Launch) -> None:
    loop = _loop(launch, attempts=1)
    loop.next_start()
    verdict = loop.observe(_ended(THREAD))
    assert verdict == Exit(
        int(ExitStatus.RETRIES_EXHAUSTED), (("attempt 1 failed: libgomp: no stack; no attempts left", "error"),)
    )


def test_a_plan_no_smaller_than_the_failure_gives_up(launch: Launch) -> None:
    loop = _loop(launch)
    loop.next_start()
    limit = Failure(kind="alloc", memory=True, line="max alloc", limit_bytes=1 << 40, teaches=("learned_max_alloc",))
    assert isinstance(loop.observe(_ended(limit)), Retry)
    again = loop.next_start()
    assert isinstance(again.give_up, SafeLlamaError) and "no plan smaller than the one that failed" in str(
        again.give_up.message
    )
