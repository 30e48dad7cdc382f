"""The planning policy (configs/planner.toml, overridable by the user's config.toml). Loading only.

Owns reading and validating the policy; what the values mean is the planner's business.
"""

from __future__ import annotations

import tomllib
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from safe_llama.errors import ExitStatus, SafeLlamaError

STEPS = ("stateful", "kv-q8", "kv-q4", "ctx", "ngl")


@dataclass(frozen=True)
class Policy:
    ctx_floor: int
    skip_llama_fit: bool
    max_alloc_margin: Mapping[str, int]
    memory_margin_fraction: Mapping[str, float]
    process_overhead: Mapping[str, int]
    address_space_overhead: Mapping[str, int]
    kv_split: Mapping[str, Any]
    ladder: Mapping[str, tuple[str, ...]]
    malloc_arena_max: int
    openvino_q8: bool

    def per_backend(self, table: Mapping[str, Any], backend: str) -> Any:
        return table.get(backend, table.get("default"))

    def ladder_for(self, backend: str, tool: str) -> tuple[str, ...]:
        for key in (f"{backend}.{tool}", backend, "default"):
            if key in self.ladder:
                return self.ladder[key]
        return ()


def _merge(base: dict[str, Any], over: Mapping[str, Any]) -> dict[str, Any]:
    out = dict(base)
    for key, value in over.items():
        out[key] = _merge(out[key], value) if isinstance(value, dict) and isinstance(out.get(key), dict) else value
    return out


def _read_toml(path: Path) -> dict[str, Any]:
    try:
        return tomllib.loads(path.read_text())
    except (OSError, tomllib.TOMLDecodeError) as err:
        raise SafeLlamaError(f"safe-llama: {path}: {err}", ExitStatus.BAD_CONFIG) from None


def load_policy(path: Path, user_config: Path | None = None) -> Policy:
    raw: dict[str, Any] = _read_toml(path)
    if user_config is not None and user_config.is_file():
        mine = _read_toml(user_config).get("planner", {})
        unknown = sorted(set(mine) - set(raw)) if isinstance(mine, dict) else []
        if unknown:
            raise SafeLlamaError(
                f"safe-llama: {user_config}: [planner] {unknown[0]}: unknown key (known: {', '.join(sorted(raw))})",
                ExitStatus.BAD_CONFIG,
            )
        raw = _merge(raw, mine)
    try:
        ladder = {}
        for key, value in raw["ladder"].items():
            if isinstance(value, dict):  # "openvino.server" written as a TOML sub-table
                for sub, steps in value.items():
                    ladder[f"{key}.{sub}"] = tuple(steps)
            else:
                ladder[key] = tuple(value)
        for key, steps in ladder.items():
            bad = [s for s in steps if s not in STEPS]
            if bad:
                raise SafeLlamaError(
                    f"safe-llama: {path}: ladder.{key}: unknown step {bad[0]!r} (one of {', '.join(STEPS)})",
                    ExitStatus.BAD_CONFIG,
                )
        return Policy(
            ctx_floor=int(raw["ctx_floor"]),
            skip_llama_fit=bool(raw["skip_llama_fit"]),
            max_alloc_margin={k: int(v) for k, v in raw["max_alloc_margin_bytes"].items()},
            memory_margin_fraction={k: float(v) for k, v in raw["memory_margin_fraction"].items()},
            process_overhead={k: int(v) for k, v in raw["process_overhead_bytes"].items()},
            address_space_overhead={k: int(v) for k, v in raw["address_space_overhead_bytes"].items()},
            kv_split=dict(raw["kv_split"]),
            ladder=ladder,
            malloc_arena_max=int(raw.get("malloc_arena_max", 0)),
            openvino_q8=bool(raw.get("quantized_kv", {}).get("openvino_q8", False)),
        )
    except (KeyError, TypeError, ValueError) as err:
        raise SafeLlamaError(f"safe-llama: {path}: missing or invalid setting {err}", ExitStatus.BAD_CONFIG) from None
