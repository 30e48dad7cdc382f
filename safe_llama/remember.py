"""What worked before: the plan that started, and limits learned from failures, per model, binary,
device and request, so the next launch starts the first time.

Owns the key and the record's shape; the file discipline (0600, atomic, no symlinks) is state.py's.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from safe_llama import state
from safe_llama.paths import cache_dir

FORMAT = 1


@dataclass(frozen=True)
class Remembered:
    argv_changes: Mapping[str, str | bool]
    env_changes: Mapping[str, str]
    kv_bytes: int
    learned_max_alloc: int | None
    attempts: int


def key(*, model: Path, binary: Path, device: str, request: Mapping[str, Any]) -> str:
    """A digest of what decides whether a plan fits: the model's and binary's identity, the device and
    the memory-relevant request (never secrets: only the planner's KV request fields go in)."""
    parts = {
        "format": FORMAT,
        "model": state.file_key(model),
        "binary": state.file_key(binary),
        "device": device,
        "request": dict(request),
    }
    return hashlib.sha256(json.dumps(parts, sort_keys=True, default=str).encode()).hexdigest()[:40]


def _path(digest: str, env: Mapping[str, str]) -> Path:
    return cache_dir(env) / "plans" / f"{digest}.json"


def recall(digest: str, env: Mapping[str, str] = os.environ) -> Remembered | None:
    raw = state.read_json(_path(digest, env))
    if not isinstance(raw, dict) or raw.get("format") != FORMAT:
        return None
    try:
        return Remembered(
            argv_changes=dict(raw["argv_changes"]),
            env_changes={str(k): str(v) for k, v in raw["env_changes"].items()},
            kv_bytes=int(raw["kv_bytes"]),
            learned_max_alloc=None if raw["learned_max_alloc"] is None else int(raw["learned_max_alloc"]),
            attempts=int(raw["attempts"]),
        )
    except (KeyError, TypeError, ValueError, AttributeError):
        return None


def store(digest: str, record: Remembered, env: Mapping[str, str] = os.environ) -> None:
    state.write_json(_path(digest, env), {"format": FORMAT, **asdict(record)})


def forget(env: Mapping[str, str] = os.environ) -> int:
    """Remove every remembered plan; the number removed."""
    folder = cache_dir(env) / "plans"
    if not folder.is_dir() or folder.is_symlink():
        return 0
    count = sum(1 for _ in folder.glob("*.json"))
    shutil.rmtree(folder)
    return count
