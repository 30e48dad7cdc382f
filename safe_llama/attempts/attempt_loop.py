"""The attempt loop's decisions, with no process in it: what to start next, what a failure teaches, when to
give up, and what to say about each (h11's way: next_start() says what to run, observe() takes how it ended).

Owns the loop's state (the attempt's number, the lessons so far, the last failed footprint) and every
decision of a retry; the arithmetic is retry.py's, the planning the replan function it is given. Must not
start, signal, wait, probe or read a file or the clock: attempts/launch.py is the shell that does, and feeds
the outcomes in.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

from safe_llama.attempts import retry
from safe_llama.errors import ExitStatus, SafeLlamaError
from safe_llama.messages import (
    AFTER_FAILED_STARTS,
    LOG_CUT,
    NO_ATTEMPTS_LEFT,
    NO_SMALLER_PLAN,
    RETRY,
    RETRY_WORKER,
)
from safe_llama.plan.lessons import Lessons
from safe_llama.plan.target import RemoteDevice
from safe_llama.units import human

if TYPE_CHECKING:
    from safe_llama.diagnosis.signatures import Failure
    from safe_llama.pipeline.prepare import Prepared
    from safe_llama.process.startup import Outcome

Replan = Callable[["Prepared", Lessons], "Prepared"]  # the plan again with these lessons (pipeline.replan)
Line = tuple[str, str]  # (message, level) to say


@dataclass(frozen=True)
class Start:
    """What the next attempt starts: llama.cpp's arguments (the binary not included) and environment changes."""

    number: int
    argv: list[str]
    extra_env: dict[str, str]
    planned: bool  # it starts the plan (not llama.cpp's own sizes): the plan to remember once ready
    lines: tuple[str, ...]  # the plan's steps, said before it starts
    # not smaller than the last failure in any of its figures: said (lines first), it ends the launch
    give_up: SafeLlamaError | None = None


@dataclass(frozen=True)
class Exit:
    """Leave with this code, after saying lines."""

    code: int
    lines: tuple[Line, ...] = ()


@dataclass(frozen=True)
class Retry:
    """Start again (next_start), after saying lines."""

    lines: tuple[Line, ...]
    read_free_again: bool = False  # read the GPU's free memory again first (free_memory_read)
    wait_for: RemoteDevice | None = None  # an RPC worker seen stopping: it must answer again first


@dataclass(frozen=True)
class FindWorker:
    """An RPC worker stopped and the failure does not say which: the shell finds it (worker_found)."""

    remote: tuple[RemoteDevice, ...]
    shares: Mapping[str, float]  # by device name: the share of its memory the failed plan put there

    def fullness(self, worker: RemoteDevice) -> float:
        return self.shares[worker.name]


class AttemptLoop:
    """The decisions of one launch's attempts. prepared: the facts and the first plan (None: llama.cpp runs
    as given); lessons: what it was planned with (a remembered limit or size); said: the first attempt's plan
    was said already (an early start); search_band: the tool is ready only after every allocation."""

    def __init__(
        self,
        prepared: Prepared | None,
        lessons: Lessons,
        replan: Replan,
        *,
        args: Sequence[str],
        attempts: int,
        predict: bool,
        search_band: bool,
        said: bool = False,
    ) -> None:
        self.prepared = prepared
        self.lessons = lessons
        self._replan = replan
        self._args = list(args)
        self._attempts = attempts
        self._predict = predict
        self._search_band = search_band
        self._said = said
        self.number = 0
        self._due = False  # the lessons changed since the last plan
        self._after_lesson = False  # the plan followed a lesson of the KV (a cap may have sized it)
        self._kv_now: retry.Footprint | None = None
        self._last_kv: retry.Footprint | None = None  # the last failed attempt's: the next is smaller
        self._held: dict[str, int] = {}  # by RPC device name, after a worker failed: what the plan put there
        self._failure: Failure | None = None
        self._reran = False  # a start whose log was cut short ran again (at most once a launch)
        self._again = False  # the next start is the last one again: its plan is not said twice

    def planned(self) -> bool:
        """The attempt starts the plan (not llama.cpp's own sizes): with prediction on, or after a failure."""
        return self._predict or self.number > 1

    def next_start(self) -> Start:
        """The next attempt; raises SafeLlamaError where nothing fits (Start.give_up: nothing smaller than the
        last failure)."""
        from safe_llama.pipeline.prepare import final_argv

        self.number += 1
        number, prepared = self.number, self.prepared
        if prepared is not None and self._due:
            prepared = self.prepared = self._replan(prepared, self.lessons)
            self._due = False
        lines: tuple[str, ...] = ()
        extra: dict[str, str] = {}
        if prepared is None:
            argv, kv_now = list(self._args), None
        elif not self.planned():
            argv = final_argv(replace(prepared, plan=None))
            kv_now = retry.unplanned_footprint(prepared)
        elif prepared.plan is None:
            assert prepared.error is not None
            if number == 1:
                raise prepared.error
            raise SafeLlamaError(
                AFTER_FAILED_STARTS.text(error=prepared.error.message, failed=number - 1), ExitStatus.RETRIES_EXHAUSTED
            )
        else:
            if not (self._said and number == 1) and not self._again:
                lines = (*(step.reason for step in prepared.plan.steps), *prepared.plan.said)
            argv, extra = final_argv(prepared), dict(prepared.plan.env_changes)
            kv_now = retry.planned_footprint(prepared)
        self._again = False
        last, give_up = self._last_kv, None
        if last is not None and kv_now is not None and all(n >= b for n, b in zip(kv_now, last, strict=True)):
            kv = f"{human(last[2])} of KV, {human(last[1])} of it on the device, {human(last[0])} on the device in all"
            give_up = NO_SMALLER_PLAN.error(ExitStatus.RETRIES_EXHAUSTED, kv=kv, attempts=number - 1)
        self._kv_now = kv_now
        return Start(number, argv, extra, prepared is not None and self.planned(), lines, give_up)

    def observe(self, outcome: Outcome) -> Exit | Retry | FindWorker:
        """How the attempt ended: leave, retry (the lesson learned), or find the RPC worker that stopped."""
        from safe_llama.process.workers import endpoint_of

        cut = outcome.failure is not None and outcome.failure.kind == "log_cut"
        if cut and outcome.user_stop_signal is None and not self._reran and self.number < self._attempts:
            self._reran = self._again = True  # the same start again: its log says why this time
            return Retry(((LOG_CUT.text(attempt=self.number, code=outcome.exit_code), "warning"),))
        if not outcome.retry:  # ready, stopped, or not memory: the child's own message is on the terminal
            return Exit(outcome.exit_code)
        failure = outcome.failure
        assert failure is not None
        what = failure.line or failure.kind
        prepared = self.prepared
        if prepared is None:
            return Exit(
                outcome.exit_code, ((f"start failed for lack of memory ({what}); no plan to retry with", "error"),)
            )
        if self.number >= self._attempts:
            return Exit(
                int(ExitStatus.RETRIES_EXHAUSTED),
                ((NO_ATTEMPTS_LEFT.text(attempt=self.number, failure=what), "error"),),
            )
        named = endpoint_of(failure.buffer)
        if (failure.stage == "worker" or named is not None) and prepared.plan is not None and prepared.target.remote:
            from safe_llama.plan.memory import memory_by_place

            places = memory_by_place(prepared.facts, prepared.plan.settings, prepared.target)
            remote = prepared.target.remote
            self._held = {r.name: sum(places.get(r.name, {}).values()) for r in remote}
            self._failure = failure
            refused = next((r for r in remote if r.endpoint == named), None)
            if refused is not None:  # it is alive and said which allocation it could not make
                return self._worker_capped(refused, f"could not allocate {human(failure.requested_bytes or 0)}", False)
            return FindWorker(remote, {r.name: self._held[r.name] / max(r.memory.value, 1) for r in remote})
        return self._learn(prepared, failure, what)

    def worker_found(self, worker: RemoteDevice, seen: bool) -> Retry:
        """The RPC worker that stopped (seen: it did not answer; else the fullest, all answering again)."""
        how = "stopped during the start" if seen else "most likely stopped (all answer again; it was the fullest)"
        return self._worker_capped(worker, how, seen)

    def free_memory_read(self, prepared: Prepared) -> None:
        """The GPU's free memory read again (Retry.read_free_again): the next plan is made with it."""
        self.prepared = prepared

    def _worker_capped(self, worker: RemoteDevice, how: str, seen: bool) -> Retry:
        failure = self._failure
        assert failure is not None
        held = self._held[worker.name]
        self.lessons, cap = retry.with_worker_cap(self.lessons, worker.endpoint, held)
        self._due, self._after_lesson, self._last_kv = True, False, None
        line = RETRY_WORKER.text(
            attempt=self.number,
            worker=worker.label,
            how=how,
            held=human(held),
            failure=failure.line or failure.kind,
            cap=human(cap),
        )
        return Retry(((line, "warning"),), wait_for=worker if seen else None)

    def _learn(self, prepared: Prepared, failure: Failure, what: str) -> Retry:
        planned = self.planned()
        attempt = retry.attempted(prepared, self._kv_now, planned=planned)
        lesson = retry.named_lesson(attempt, failure, self.lessons)
        if lesson is None:
            stepped, lower = self._stepped(prepared)
            lesson = retry.step_below(
                attempt,
                failure,
                self.lessons,
                stepped=stepped,
                lower_kv=lower,
                # the band only below a planned start that failed: after an unplanned one (--no-predict) the
                # next plan keeps the margin, as a predicted launch does
                search_band=prepared.target.address_space_budget and self._search_band and planned,
            )
        self.lessons = lesson.lessons
        self._due, self._after_lesson, self._last_kv = True, True, self._kv_now
        line = RETRY.text(attempt=self.number, failure=what, reason=lesson.reason)
        return Retry(((line, "warning"),), read_free_again=True)

    def _stepped(self, prepared: Prepared) -> tuple[bool, int | None]:
        """Whether the KV cap, not a limit, sized the failed plan (it was a step below an earlier failure), and
        then the KV of the plan without the cap and with the policy's margin (where the halving aims)."""
        if not self._after_lesson or prepared.plan is None or self.lessons.kv_cap is None:
            return False, None
        uncapped = replace(self.lessons, kv_cap=None)
        free = self._replan(prepared, uncapped).plan
        if free is not None and free.kv.total_bytes <= prepared.plan.kv.total_bytes:
            return False, None
        if self.lessons.margin_scale != retry.KEEP_MARGIN:
            free = self._replan(prepared, replace(uncapped, margin_scale=retry.KEEP_MARGIN)).plan
        return True, free.kv.total_bytes if free is not None else None
