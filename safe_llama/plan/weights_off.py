"""Weights that leave a GPU that cannot hold them: MoE experts to host memory first (-ncmoe, the fewest layers'
experts that make it fit), then whole layers (-ngl, the most that stay), as the planner's `weights` step; and -ngl
in llama.cpp's own count (the output layer first).

Owns that search over placements; must not choose when it runs (the planner's ladder does). Pure."""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import replace

from safe_llama.cmdline.memory_flags import EXPERT_REGEX, LlamaSettings
from safe_llama.model.facts import ModelFacts
from safe_llama.plan.memory import allocations
from safe_llama.plan.policy import Policy
from safe_llama.plan.split import WeightsCache
from safe_llama.plan.tally import offloaded_slots
from safe_llama.plan.target import Target


def _fits(
    facts: ModelFacts, settings: LlamaSettings, target: Target, policy: Policy, cache: WeightsCache | None = None
) -> bool:
    return all(a.fits for a in allocations(facts, settings, target, policy, cache))


def layers_words(ngl: int, n_layer: int) -> str:
    """What -ngl N offloads, as llama.cpp counts it: the output layer first, then the last repeating layers."""
    if ngl <= 0:
        return "no layer"
    if ngl > n_layer:
        return f"all {n_layer} layers and the output layer"
    return f"{ngl - 1} of {n_layer} layers and the output layer"


def _expert_layers(facts: ModelFacts) -> int:
    """How many of the first layers hold MoE experts (llama.cpp's -ncmoe counts from layer 0)."""
    found = [
        int(name.split(".")[1])
        for name, _ in facts.tensors
        if name.startswith("blk.") and re.search(r"^blk\.\d+" + EXPERT_REGEX, name)
    ]
    return max(found) + 1 if found else 0


def _with_ncmoe(settings: LlamaSettings, user: int, n: int) -> LlamaSettings:
    # the experts of the first n layers, and never fewer than the user's own -ncmoe sends to host memory
    return replace(settings, layout=replace(settings.layout, n_cpu_moe=max(user, n)))


def _smallest(lo: int, hi: int, ok: Callable[[int], bool]) -> int | None:
    """The smallest n in [lo, hi] with ok(n), for ok false below some n and true from there on."""
    if not ok(hi):
        return None
    while lo < hi:
        mid = (lo + hi) // 2
        if ok(mid):
            hi = mid
        else:
            lo = mid + 1
    return lo


def weights_off(
    facts: ModelFacts,
    settings: LlamaSettings,
    target: Target,
    policy: Policy,
    weights_cache: WeightsCache | None = None,
) -> tuple[LlamaSettings, tuple[str, ...], str]:
    """Move weights off the GPU until they fit with `settings`' KV: the experts of the first layers (the fewest
    that do), then whole layers (the most that stay). The settings, the fields it decided and what moved, in
    words."""
    n_layer = max(facts.block_count, 1)
    user = settings.layout.n_cpu_moe
    decided: list[str] = []
    moved: list[str] = []
    experts = _expert_layers(facts)
    if experts:
        n = _smallest(0, experts, lambda k: _fits(facts, _with_ncmoe(settings, user, k), target, policy, weights_cache))
        n = experts if n is None else n
        if n:
            settings = replace(settings, layout=replace(settings.layout, n_cpu_moe=n))
            decided.append("n_cpu_moe")
            moved.append(f"-ncmoe {n}: the experts of {n} of {experts} layers in host memory")
    if not _fits(facts, settings, target, policy, weights_cache):
        current = offloaded_slots(settings.n_gpu_layers, n_layer)
        fewest_off = _smallest(
            0,
            current,
            lambda off: _fits(facts, replace(settings, n_gpu_layers=current - off), target, policy, weights_cache),
        )
        ngl = 0 if fewest_off is None else current - fewest_off
        settings = replace(settings, n_gpu_layers=ngl)
        decided.append("n_gpu_layers")
        moved.append(f"-ngl {ngl}, {layers_words(ngl, n_layer)} on the GPU")
    elif settings.n_gpu_layers is None:
        settings = replace(settings, n_gpu_layers=n_layer + 1)  # every layer, said explicitly: -fit off
        decided.append("n_gpu_layers")
    return settings, tuple(decided), " and ".join(moved)
