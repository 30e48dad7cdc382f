"""How each ggml backend meets a device's limits: configs/backends.toml (policy as data, from the pinned ggml
source), with the user's config.toml [backends] entries over it.

Owns reading and checking those tables; must not probe a device (device_map applies the rules)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal

from safe_llama import state
from safe_llama.errors import ExitStatus, SafeLlamaError
from safe_llama.paths import cache_dir, config_dir, configs_dir, packaged_configs


@dataclass(frozen=True)
class BackendRule:
    """How a backend meets a device's limits (from the pinned ggml source, ggml_backend_*_get_max_size)."""

    vendor_ids: tuple[int, ...]  # PCI vendors its devices come from (empty: any)
    alloc_limit: Literal["opencl", "vulkan", "none", "unprobed"]
    why: str


ALLOC_LIMITS = ("opencl", "vulkan", "none", "unprobed")


def parse_backend_rules(data: Mapping[str, Any], where: str) -> dict[str, BackendRule]:
    """configs/backends.toml's tables (keyed by backend, or "openvino:<device kind>") as rules; a bad entry is
    reported against `where` and its key."""
    rules: dict[str, BackendRule] = {}
    for key, entry in data.items():
        try:
            vendors = tuple(int(v) for v in entry.get("vendor_ids", []))
            limit = entry["alloc_limit"]
            why = str(entry["why"])
        except (AttributeError, KeyError, TypeError, ValueError) as err:
            raise SafeLlamaError(
                f"safe-llama: {where}: [{key}]: needs vendor_ids (numbers), alloc_limit and why ({err!r})",
                ExitStatus.BAD_CONFIG,
            ) from None
        if limit not in ALLOC_LIMITS:
            raise SafeLlamaError(
                f"safe-llama: {where}: [{key}] alloc_limit: {limit!r} is not one of {', '.join(ALLOC_LIMITS)}",
                ExitStatus.BAD_CONFIG,
            )
        rules[key] = BackendRule(vendors, limit, why)
    return rules


def packaged_backend_rules() -> dict[str, BackendRule]:
    """The packaged configs/backends.toml alone (for a device chosen without a user's settings: tests, tools)."""
    path = packaged_configs() / "backends.toml"
    return parse_backend_rules(state.load_toml(path), str(path))


def backend_rules(env: Mapping[str, str]) -> dict[str, BackendRule]:
    """configs/backends.toml, each entry replaced by the user's config.toml [backends] entry of that key."""
    path = configs_dir(env) / "backends.toml"
    rules = parse_backend_rules(state.load_toml(path, cache_dir(env)), str(path))
    user = config_dir(env) / "config.toml"
    if user.is_file():
        try:
            mine = state.load_toml(user, cache_dir(env)).get("backends", {})
        except (OSError, ValueError):
            return rules  # cmdline.launch_args reports a broken config file before any probe
        if not isinstance(mine, Mapping):
            raise SafeLlamaError(f"safe-llama: {user}: [backends] must be a table", ExitStatus.BAD_CONFIG)
        rules |= parse_backend_rules(mine, f"{user}: [backends]")
    return rules
