"""How big an attempt of a launch is, as the retry compares them: its footprint (each attempt must be smaller
than the last failed one in one of its figures), the failed attempt as retry.learn sees it, and whether the
KV cap, not a limit, sized a plan.

Owns those figures of a prepared launch, computed with the planner's arithmetic; reads no device and starts
nothing. Must not decide the retry (retry.py does) nor start anything (launch.py, attempt.py).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from safe_llama.pipeline.prepare import PlanOptions, Prepared
    from safe_llama.run.retry import Attempt

Footprint = tuple[int, int, int]  # (bytes planned on the local GPU, KV bytes on the device, KV bytes in all)


def attempted(prepared: Prepared, kv_now: Footprint | None, *, planned: bool, stepped: bool) -> Attempt:
    """The failed attempt as the retry's arithmetic sees it: its KV, and the compute estimate at its size."""
    from safe_llama.model.kv import plan_kv
    from safe_llama.plan.compute import compute_estimate
    from safe_llama.run.retry import Attempt

    kv = prepared.plan.kv if planned and prepared.plan is not None else plan_kv(prepared.facts, prepared.request.kv)
    kv_bytes = kv_now[2] if kv_now is not None else kv.total_bytes
    req = prepared.plan.settings.kv if prepared.plan is not None else prepared.request.kv
    target = prepared.target
    estimate = compute_estimate(prepared.facts, kv, req, kv_f16_copies=target.kv_f16_copies, costs=target.compute_costs)
    device = target.device if target.on_gpu and not target.integrated else None
    return Attempt(kv_bytes=kv_bytes, compute_estimate=estimate, stepped=stepped, device=device)


def cap_binds(prepared: Prepared, options: PlanOptions, env: Mapping[str, str]) -> bool:
    """Whether the KV cap, not a limit, sized the plan: the attempt is then a step below a failure."""
    from safe_llama.pipeline.prepare import replan

    if prepared.plan is None or options.kv_cap is None:
        return False
    free = replan(prepared, replace(options, kv_cap=None), env).plan
    return free is None or free.kv.total_bytes > prepared.plan.kv.total_bytes


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
