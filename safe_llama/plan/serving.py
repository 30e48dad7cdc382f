"""What llama-server grows into while it serves, beyond what it allocates at start: its prompt cache
(--cache-ram, 8192 MiB by default) and each slot's context checkpoints (--ctx-checkpoints, 32 by default),
both in host memory. Under a cgroup limit or a declared host budget (--host-memory) they get what the plan
leaves free; a user's value is kept.

Owns the size of one checkpoint and the choice of the two values; must not choose the context (the planner
does) nor place anything (plan.memory counts them)."""

from __future__ import annotations

from dataclasses import dataclass

from safe_llama.model.facts import ModelFacts
from safe_llama.model.kv import KvPlan
from safe_llama.units import human

MIB = 1024 * 1024


def checkpoint_bytes(facts: ModelFacts, kv: KvPlan) -> int:
    """One context checkpoint of one slot, as llama-server makes it (tools/server/server-context.cpp
    create_checkpoint: llama_state_seq_get_size with LLAMA_STATE_SEQ_FLAGS_PARTIAL_ONLY): the memory that cannot
    be rolled back, i.e. the slot's cells of the sliding-window cache (at most the window and one ubatch) and
    its recurrent state. 0 for a model with full attention only: llama-server makes no checkpoints for it."""
    total = 0
    for cache in kv.caches:
        if cache.kind == "swa":
            per_cell = cache.total_bytes // max(cache.cells * cache.n_stream, 1)
            total += per_cell * min(cache.cells, facts.sliding_window + kv.context.n_ubatch)
        elif cache.kind == "recurrent":
            total += cache.total_bytes // max(cache.cells, 1)
    return total


@dataclass(frozen=True)
class Serving:
    """The two values a launch passes (None: the user's, left alone) and why."""

    cache_ram_mib: int | None
    ctx_checkpoints: int | None
    reason: str


def size_serving(
    leftover: int,
    n_slots: int,
    one_checkpoint: int,
    *,
    user_cache_ram_mib: int | None,
    user_ctx_checkpoints: int | None,
    default_cache_ram_mib: int,
    default_ctx_checkpoints: int,
    cache_charge: float = 1.0,
    budget: str = "the cgroup's limit",
) -> Serving:
    """The values that fit in `leftover` bytes (what the budget, less its margin, leaves once the plan's
    process, KV and compute are charged; `budget` names it): the checkpoints first (up to llama.cpp's default;
    they spare a sliding-window or recurrent model whole prompt re-evaluations), then the prompt cache in whole
    MiB (up to llama.cpp's default), each MiB of it charged `cache_charge` MiB. A value the user gave is kept
    (the planner counted it already)."""
    room = max(leftover, 0)
    words = []
    checkpoints = None
    if user_ctx_checkpoints is None and one_checkpoint > 0:
        per_step = one_checkpoint * max(n_slots, 1)
        checkpoints = min(default_ctx_checkpoints, room // per_step)
        room -= checkpoints * per_step
        words.append(
            f"--ctx-checkpoints {checkpoints} ({human(one_checkpoint)} each, {max(n_slots, 1)} slot(s))"
            + (f" instead of llama.cpp's {default_ctx_checkpoints}" if checkpoints < default_ctx_checkpoints else "")
        )
    cache = None
    if user_cache_ram_mib is None:
        cache = min(default_cache_ram_mib, int(room / max(cache_charge, 1.0)) // MIB)
        words.append(
            f"--cache-ram {cache}"
            + (" (the prompt cache off)" if cache == 0 else "")
            + (f" instead of llama.cpp's {default_cache_ram_mib} MiB" if cache < default_cache_ram_mib else "")
        )
    reason = ""
    if words:
        reason = (
            f"{' and '.join(words)}: what {budget} leaves ({human(max(leftover, 0))}) once the process, KV "
            "and compute of a full request are charged; both grow while the server runs"
        )
    return Serving(cache, checkpoints, reason)
