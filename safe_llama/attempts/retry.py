"""After a failed start: how big the attempt was, what the failure teaches, and where the next attempt's search
stands.

Owns the retry's arithmetic: an attempt's footprint (each attempt must be smaller than the last failed one in
one of its figures), the number an error names (a device's largest allocation, a compute buffer's real size,
what the local GPU could not hold), the step below a failure that names nothing usable, and the halving after
that. Pure: values in, values out (plan.Lessons in and out); must not plan, launch or read anything.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

from safe_llama.diagnosis.signatures import Failure
from safe_llama.plan.lessons import Lessons
from safe_llama.units import human

if TYPE_CHECKING:
    from safe_llama.pipeline.prepare import Prepared

# The first step below a failed size that taught nothing else: when the next attempt starts, it is within
# this share of the largest that starts (that one lies between the two).
STEP = 0.03
# A compute buffer this much larger than the estimate (and what was learned) is news; below, it was right.
_NEWS = 1.01
# Lessons.margin_scale: the policy's margin kept, or the search from the top of the margin band.
KEEP_MARGIN = 1.0
MARGIN_BAND = -1.0

# A worker that stopped during a start held more than it can: its next share is at most this much of what
# the failed plan put there (its real limit is unknown: rpc-server reports its host's RAM, not its cgroup's).
WORKER_SHARE = 0.75

Footprint = tuple[int, int, int]  # (bytes planned on the local GPU, KV bytes on the device, KV bytes in all)


@dataclass(frozen=True)
class Attempt:
    """What the failed attempt asked for, as planned."""

    kv_bytes: int  # KV cache in all
    compute_estimate: int  # the planner's compute estimate at its context (0: not planned)
    device: str | None = None  # the local GPU's name (CUDA0, Vulkan0), when the plan put layers there
    device_weights: int | None = None  # the weights the plan put on that GPU (None: not planned)


@dataclass(frozen=True)
class Lesson:
    lessons: Lessons  # everything the failed starts so far have taught, as the planner takes it
    reason: str  # one sentence for the user: what the next attempt is sized by


def named_lesson(attempt: Attempt, failure: Failure, before: Lessons) -> Lesson | None:
    """What a failure that names a usable number teaches: the first of LEARNERS, in their order, whose field a
    line of the failure names (configs/signatures.toml `teaches`) and that finds its number usable; None: it
    names nothing usable (step_below then)."""
    for name, learn in LEARNERS.items():
        if name in failure.teaches:
            lesson = learn(attempt, failure, before)
            if lesson is not None:
                return lesson
    return None


def _max_alloc(attempt: Attempt, failure: Failure, before: Lessons) -> Lesson | None:
    """A device's largest single allocation, named by the device (a lower one than known is news)."""
    limit = failure.limit_bytes
    if limit is None or (before.learned_max_alloc is not None and limit >= before.learned_max_alloc):
        return None
    lessons = replace(before, learned_max_alloc=limit, margin_scale=KEEP_MARGIN)
    return Lesson(lessons, f"device max allocation {human(limit)} learned from the device's own error")


def _device_cap(attempt: Attempt, failure: Failure, before: Lessons) -> Lesson | None:
    """The local GPU held less than what it had been given when an allocation there failed: the weights it
    could not allocate (whatever the KV), or its weights and the KV buffer it could not allocate after them
    (the compute buffers come later: the next plan makes room for them below that)."""
    requested = failure.requested_bytes
    if requested is None or not _on_device(failure.buffer, attempt.device):
        return None
    if failure.stage == "weights":  # the first allocation of a start: less than this was free on the device
        held, reason = requested - 1, f"the model weights ({human(requested)}) did not fit on {attempt.device}: "
        reason += "fewer layers there, the KV kept as planned"
    elif failure.stage == "kv" and failure.limit_bytes is None and attempt.device_weights is not None:
        # a KV split in buffers names one of them: the cap is then lower than the device's room (the safe side)
        held = attempt.device_weights + requested - 1
        reason = (
            f"the KV cache ({human(requested)}) did not fit on {attempt.device} beside "
            f"{human(attempt.device_weights)} of weights: planning with what the device held then"
        )
    else:
        return None
    cap = held if before.device_cap is None else min(before.device_cap, held)
    return Lesson(replace(before, device_cap=cap, margin_scale=KEEP_MARGIN), reason)


def _compute_extra(attempt: Attempt, failure: Failure, before: Lessons) -> Lesson | None:
    """The compute buffers' real size, where it is larger than the estimate and what was learned before."""
    requested = failure.requested_bytes
    if (
        failure.stage != "compute"
        or requested is None
        or attempt.compute_estimate <= 0
        or requested <= (attempt.compute_estimate + before.compute_extra) * _NEWS
    ):
        return None
    return Lesson(
        replace(before, compute_extra=requested - attempt.compute_estimate, margin_scale=KEEP_MARGIN),
        f"the compute buffers took {human(requested)} where {human(attempt.compute_estimate)} was estimated:"
        " planning with the size named",
    )


# What a failure's numbers teach, by the Lessons field a signature row names (`teaches`), tried in this order.
# A new lesson from a new signature: its row names the field, and its rule is one function here.
LEARNERS: dict[str, Callable[[Attempt, Failure, Lessons], Lesson | None]] = {
    "learned_max_alloc": _max_alloc,
    "device_cap": _device_cap,
    "compute_extra": _compute_extra,
}


def step_below(
    attempt: Attempt, failure: Failure, before: Lessons, *, stepped: bool, lower_kv: int | None, search_band: bool
) -> Lesson:
    """The next KV below a failure that named nothing usable.

    stepped: the failed attempt was sized by a step below an earlier failure (the KV cap bound it).
    lower_kv: the KV of the plan with the policy's margin (what the planner believes starts), when stepped.
    search_band: the limit is known to the byte (RLIMIT_AS), so only the planner's own model is uncertain,
    and a start that does not fit fails before readiness: the search may start from the top of the
    plan's margin band and step down. Otherwise the next plan keeps the margin.
    """
    if stepped and lower_kv is not None and lower_kv < attempt.kv_bytes:
        # a step below a failure failed too: the largest that starts is further down, halve the gap
        cap = min(int(attempt.kv_bytes * (1 - STEP)), (attempt.kv_bytes + lower_kv) // 2)
        how = "halfway to the planned size"
    elif stepped:
        cap = attempt.kv_bytes // 2
        how = "half of it"
    else:
        cap = int(attempt.kv_bytes * (1 - STEP))
        how = f"at most {STEP:.0%} below it"
    if before.kv_cap is not None:
        cap = min(cap, before.kv_cap)
    what = _what_failed(failure, attempt)
    where = "from the top of the plan's margin" if search_band else "with the plan's margin"
    margin = MARGIN_BAND if search_band else KEEP_MARGIN
    return Lesson(replace(before, kv_cap=cap, margin_scale=margin), f"{what}: next KV {how}, planned {where}")


def _on_device(buffer: str | None, device: str | None) -> bool:
    """A buffer named by the failure is the local GPU's (CUDA0, Vulkan0; not CPU, CUDA_Host or a worker)."""
    return device is not None and buffer is not None and buffer == device


def _what_failed(failure: Failure, attempt: Attempt) -> str:
    named = {"kv": "the KV cache", "compute": "the compute buffers", "thread": "a thread's stack"}
    thing = named.get(failure.stage or "", "the start")
    where = f" on {attempt.device}" if _on_device(failure.buffer, attempt.device) else ""
    return f"{thing} did not fit{where} with {human(attempt.kv_bytes)} of KV"


def worker_cap(planned_bytes: int, cap_before: int | None) -> int:
    """What a worker that stopped may hold next: WORKER_SHARE of what the failed plan put there, and never
    more than an earlier cap."""
    cap = int(planned_bytes * WORKER_SHARE)
    return cap if cap_before is None else min(cap, cap_before)


def with_worker_cap(before: Lessons, endpoint: str, planned_bytes: int) -> tuple[Lessons, int]:
    """The lessons with a worker's next share capped (worker_cap), and that cap."""
    caps = dict(before.worker_caps)
    cap = caps[endpoint] = worker_cap(planned_bytes, caps.get(endpoint))
    return replace(before, worker_caps=tuple(sorted(caps.items()))), cap


# ---------------------------------------------------------------------------------------------------
# An attempt's size, computed with the planner's arithmetic
# ---------------------------------------------------------------------------------------------------


def attempted(prepared: Prepared, kv_now: Footprint | None, *, planned: bool) -> Attempt:
    """The failed attempt as the retry's arithmetic sees it: its KV, and the compute estimate at its size."""
    from safe_llama.model.kv import plan_kv
    from safe_llama.plan.compute import compute_estimate

    kv = prepared.plan.kv if planned and prepared.plan is not None else plan_kv(prepared.facts, prepared.request.kv)
    kv_bytes = kv_now[2] if kv_now is not None else kv.total_bytes
    req = prepared.plan.settings.kv if prepared.plan is not None else prepared.request.kv
    target = prepared.target
    estimate = compute_estimate(prepared.facts, kv, req, kv_f16_copies=target.kv_f16_copies, costs=target.compute_costs)
    device = target.device if target.on_gpu and not target.integrated else None
    weights = None
    if planned and prepared.plan is not None and device is not None:
        from safe_llama.plan.memory import memory_by_place

        weights = memory_by_place(prepared.facts, prepared.plan.settings, target).get(device, {}).get("weights", 0)
    return Attempt(kv_bytes=kv_bytes, compute_estimate=estimate, device=device, device_weights=weights)


def planned_footprint(prepared: Prepared) -> Footprint:
    """(bytes planned on the local GPU, KV bytes on the device, KV bytes in all): each attempt must be smaller
    than the last in one of them."""
    from safe_llama.plan.memory import memory_by_place

    assert prepared.plan is not None
    total = prepared.plan.kv.total_bytes
    on_device = prepared.target.on_gpu and not prepared.plan.settings.stateful
    places = memory_by_place(prepared.facts, prepared.plan.settings, prepared.target)
    device = sum(places.get(prepared.target.device or "", {}).values())
    return (device, total if on_device else 0, total)


def unplanned_footprint(prepared: Prepared) -> Footprint:
    from safe_llama.model.kv import plan_kv

    total = plan_kv(prepared.facts, prepared.request.kv).total_bytes
    on_device = total if prepared.target.on_gpu else 0
    return (on_device, on_device, total)
