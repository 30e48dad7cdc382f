"""After a failed start: what the failure teaches, and where the next attempt's search stands.

Owns the retry's arithmetic: the number an error names (a device's largest allocation, a compute buffer's
real size), the step below a failure that names nothing usable, and the halving after that. Pure: values
in, values out; must not plan, launch or read anything.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Literal

from safe_llama.diagnosis.signatures import Failure
from safe_llama.units import human

# The first step below a failed size that taught nothing else: when the next attempt starts, it is within
# this share of the largest that starts (that one lies between the two).
STEP = 0.03
# A compute buffer this much larger than the estimate (and what was learned) is news; below, it was right.
_NEWS = 1.01

Margin = Literal["keep", "band"]

# A worker that stopped during a start held more than it can: its next share is at most this much of what
# the failed plan put there (its real limit is unknown: rpc-server reports its host's RAM, not its cgroup's).
WORKER_SHARE = 0.75


@dataclass(frozen=True)
class Attempt:
    """What the failed attempt asked for, as planned."""

    kv_bytes: int  # KV cache in all
    compute_estimate: int  # the planner's compute estimate at its context (0: not planned)
    stepped: bool = False  # it was sized by a step below an earlier failure (the KV cap bound it)
    device: str | None = None  # the local GPU's name (CUDA0, Vulkan0), when the plan put layers there


@dataclass(frozen=True)
class Learned:
    """Everything the failed starts so far have taught, as the planner takes it."""

    max_alloc: int | None = None  # the device's largest single allocation, named by the device
    # bytes the compute estimate missed at the failed size: added at every size, since one failure cannot
    # tell a missed fixed part from a missed per-cell part and the search only goes down (safe either way)
    compute_extra: int = 0
    kv_cap: int | None = None  # the next KV stays at or under this
    # how the host or device limit is planned: with the policy's margin, or from the top of the margin
    # band (the limit plus the margin: where the search below an exact limit starts)
    margin: Margin = "keep"
    device_cap: int | None = None  # the local GPU held less than this (its weights could not be allocated)


@dataclass(frozen=True)
class Lesson:
    learned: Learned
    reason: str  # one sentence for the user: what the next attempt is sized by


def learn(attempt: Attempt, failure: Failure, before: Learned, *, lower_kv: int | None, search_band: bool) -> Lesson:
    """What the next attempt is planned with after `failure`.

    lower_kv: the KV of the plan with the policy's margin (what the planner believes starts), if known.
    search_band: the limit is known to the byte (RLIMIT_AS), so only the planner's own model is uncertain,
    and a start that does not fit fails before readiness: the search may start from the top of the
    plan's margin band and step down. Otherwise the next plan keeps the margin.
    """
    limit = failure.limit_bytes
    if limit is not None and (before.max_alloc is None or limit < before.max_alloc):
        learned = replace(before, max_alloc=limit, margin="keep")
        return Lesson(learned, f"device max allocation {human(limit)} learned from the device's own error")
    requested = failure.requested_bytes
    if failure.stage == "weights" and requested is not None and _on_device(failure.buffer, attempt.device):
        # the first allocation of a start: less than this was free on the device, whatever the KV
        cap = requested - 1 if before.device_cap is None else min(before.device_cap, requested - 1)
        learned = replace(before, device_cap=cap, margin="keep")
        return Lesson(
            learned,
            f"the model weights ({human(requested)}) did not fit on {attempt.device}: fewer layers there, "
            "the KV kept as planned",
        )
    if (
        failure.stage == "compute"
        and requested is not None
        and attempt.compute_estimate > 0
        and requested > (attempt.compute_estimate + before.compute_extra) * _NEWS
    ):
        learned = replace(before, compute_extra=requested - attempt.compute_estimate, margin="keep")
        return Lesson(
            learned,
            f"the compute buffers took {human(requested)} where {human(attempt.compute_estimate)} was estimated:"
            " planning with the size named",
        )
    if attempt.stepped and lower_kv is not None and lower_kv < attempt.kv_bytes:
        # a step below a failure failed too: the largest that starts is further down, halve the gap
        cap = min(int(attempt.kv_bytes * (1 - STEP)), (attempt.kv_bytes + lower_kv) // 2)
        how = "halfway to the planned size"
    elif attempt.stepped:
        cap = attempt.kv_bytes // 2
        how = "half of it"
    else:
        cap = int(attempt.kv_bytes * (1 - STEP))
        how = f"at most {STEP:.0%} below it"
    if before.kv_cap is not None:
        cap = min(cap, before.kv_cap)
    what = _what_failed(failure, attempt)
    margin: Margin = "band" if search_band else "keep"
    where = "from the top of the plan's margin" if search_band else "with the plan's margin"
    return Lesson(replace(before, kv_cap=cap, margin=margin), f"{what}: next KV {how}, planned {where}")


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
