"""What failed starts taught (Lessons): the one record of it, its own module so that what reads a failure
(diagnosis/signatures.py, in the supervisor) names its fields without importing the planner's target and the
device layer under it.

Owns the Lessons value; must import nothing of safe-llama's (plan/target.py puts it into a Target).
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Lessons:
    """What failed starts taught: the one record of it, kept by the attempt loop (attempts/retry.py), remembered in
    part (remembered/remember.py) and planned with here; the next plan stays under these."""

    learned_max_alloc: int | None = None  # the device's largest single allocation, named by the device
    kv_cap: int | None = None  # the next plan's KV must stay at or under this
    # bytes the compute estimate missed at a failed size (a failed start named the compute buffers' size):
    # added at every size, since one failure cannot tell a missed fixed part from a missed per-cell part
    compute_extra: int = 0
    # the policy's margin on host and device limits times this: 1 keeps it, 0 plans against the whole limit,
    # -1 the top of the margin band (a retry's search under an exact limit starts there and steps down)
    margin_scale: float = 1.0
    device_cap: int | None = None  # the local GPU held less than this (its weights could not be allocated)
    worker_caps: tuple[tuple[str, int], ...] = ()  # RPC workers that stopped during a start: (host:port, bytes)
