"""What worked before: the KV size that started and a device limit learned from a failure, keyed to what
decides whether a plan fits, so the next launch starts the first time.

Owns the key, the record's shape and the rule for using one (only under the same or a tighter host
budget from the same source); the file discipline (0700, 0600, atomic, no symlinks) is state.py's.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from safe_llama import state
from safe_llama.paths import cache_dir

FORMAT = 2


@dataclass(frozen=True)
class Remembered:
    kv_bytes: int  # the KV of the plan that reached readiness
    learned_max_alloc: int | None  # the largest single allocation the device named in a failed start
    budget_bytes: int  # the host budget it started under: a looser budget plans afresh
    # kv_bytes is below a plan that was killed for lack of memory after it was ready (a request filled it)
    after_oom: bool = False


@dataclass(frozen=True)
class Identity:
    """Everything a remembered plan depends on but the host budget's size (which the record holds)."""

    model: str  # state.file_key of the model file
    binary: str  # state.file_key of the llama.cpp binary
    binary_version: str | None
    device: str  # backend:device name
    device_memory: int | None
    device_max_alloc: int | None  # as probed or declared, not learned
    budget_source: str  # RLIMIT_AS | cgroup | RAM | declared
    request: Mapping[str, Any]  # the planner's KV request fields (never secrets)


def budget_source(detail: str, source: str) -> str:
    """Where a host budget came from, in one word (the detail and source of device/host_budget.py's Sourced figure)."""
    if source == "declared":
        return "declared"
    if "RLIMIT_AS" in detail:
        return "RLIMIT_AS"
    if "cgroup" in detail:
        return "cgroup"
    return "RAM"


def key(identity: Identity) -> str:
    parts = {"format": FORMAT, **asdict(identity), "request": dict(identity.request)}
    return state.digest(json.dumps(parts, sort_keys=True, default=str), 40)


def _path(digest: str, env: Mapping[str, str]) -> Path:
    return cache_dir(env) / "plans" / f"{digest}.json"


# after an OOM kill the next start's budget differs by what the group holds then (the supervisor, page
# cache): a record made after a kill holds while the budget is at most this share above the one it was made under
AFTER_OOM_BUDGET_SLACK = 1 / 32


def usable(record: Remembered, budget_now: int) -> bool:
    """A KV size learned under a budget holds under the same or a tighter one; a looser one plans afresh.
    (learned_max_alloc is the device's own limit and holds whatever the host budget.) A size lowered after an
    OOM kill holds up to AFTER_OOM_BUDGET_SLACK above: under systemd's Restart= the next start must not plan
    the size that was killed again."""
    if record.after_oom:
        return budget_now <= record.budget_bytes + int(record.budget_bytes * AFTER_OOM_BUDGET_SLACK)
    return budget_now <= record.budget_bytes


def after_ready(known: Remembered | None, kv_bytes: int, learned_max_alloc: int | None, budget: int) -> Remembered:
    """The record to store when a plan of kv_bytes became ready: one lowered after an OOM kill keeps its
    flag and budget while the plan stays at or under it (else the next start would plan the killed size)."""
    if known is not None and known.after_oom and kv_bytes <= known.kv_bytes:
        return Remembered(kv_bytes, learned_max_alloc, known.budget_bytes, after_oom=True)
    return Remembered(kv_bytes, learned_max_alloc, budget)


def after_kill(kv_bytes: int, share: float, learned_max_alloc: int | None, budget: int) -> Remembered:
    """The record to store when a ready plan of kv_bytes was killed for lack of memory: a KV share below it."""
    return Remembered(int(kv_bytes * share), learned_max_alloc, budget, after_oom=True)


def recall(digest: str, env: Mapping[str, str] = os.environ) -> Remembered | None:
    raw = state.read_json(_path(digest, env))
    if not isinstance(raw, dict) or raw.get("format") != FORMAT:
        return None
    try:
        return Remembered(
            kv_bytes=int(raw["kv_bytes"]),
            learned_max_alloc=None if raw["learned_max_alloc"] is None else int(raw["learned_max_alloc"]),
            budget_bytes=int(raw["budget_bytes"]),
            after_oom=raw.get("after_oom") is True,
        )
    except (KeyError, TypeError, ValueError):
        return None


def store(digest: str, record: Remembered, env: Mapping[str, str] = os.environ, suffix: str = "") -> Path:
    """The record kept under the key (suffix: beside its file, for the handed supervisor to put in place once the
    server is ready: attempts/at_spawn.py); the path it is kept under, without the suffix."""
    path = _path(digest, env)
    state.write_json(path.with_name(path.name + suffix), {"format": FORMAT, **asdict(record)})
    return path
