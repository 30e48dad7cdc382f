"""What the config files say of devices: the device profiles (configs/devices/<name>.toml, or the user's of the
same name, which shadows it) and the backends' allocation rules with the user's config.toml [backends] entries
over them.

Owns finding and reading those files (a broken one is a BAD_CONFIG error naming it); must not probe the
machine (probing.py does) nor choose the device (target_device.py does).
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

from safe_llama import state
from safe_llama.backends.backend import AllocRule, parse_alloc_rules
from safe_llama.backends.registry import ALLOC_RULES
from safe_llama.device.declared import check_profile_name
from safe_llama.device.limits import DeviceProfile
from safe_llama.device.target_device import parse_profile
from safe_llama.errors import ExitStatus, SafeLlamaError
from safe_llama.paths import cache_dir, config_dir, configs_dir


def _profile_dirs(env: Mapping[str, str]) -> list[Path]:
    # The user's own profiles first, so one can shadow a packaged profile of the same name.
    return [config_dir(env) / "devices", configs_dir(env) / "devices"]


def _read_profile(path: Path, keep_in: Path) -> DeviceProfile:
    """keep_in: the cache folder that keeps its parsed form (state.load_toml)."""
    try:
        data = state.load_toml(path, keep_in)
    except (OSError, ValueError) as err:
        raise SafeLlamaError(f"safe-llama: {path}: {err}", ExitStatus.BAD_CONFIG) from None
    return parse_profile(path.stem, str(path), data)


def load_profile(name: str, env: Mapping[str, str]) -> DeviceProfile:
    """A profile by name: the user's devices/<name>.toml, else configs/devices/<name>.toml. Never a path (a
    name another user wrote must not open /etc/shadow): declared.check_profile_name refuses one."""
    check_profile_name(name, "--profile")
    for directory in _profile_dirs(env):
        candidate = directory / f"{name}.toml"
        if candidate.is_file():
            return _read_profile(candidate, cache_dir(env))
    known = sorted({p.stem for d in _profile_dirs(env) if d.is_dir() for p in d.glob("*.toml")})
    raise SafeLlamaError(
        f"safe-llama: no device profile '{name}' (known: {', '.join(known) or 'none'})", ExitStatus.BAD_CONFIG
    )


def load_profiles(env: Mapping[str, str]) -> tuple[DeviceProfile, ...]:
    seen: dict[str, DeviceProfile] = {}
    for directory in _profile_dirs(env):
        if directory.is_dir():
            for path in sorted(directory.glob("*.toml")):
                seen.setdefault(path.stem, _read_profile(path, cache_dir(env)))
    return tuple(seen.values())


def backend_rules(env: Mapping[str, str]) -> dict[str, AllocRule]:
    """The backends' allocation rules, each replaced by the user's config.toml [backends] entry of its key."""
    rules = dict(ALLOC_RULES)
    user = config_dir(env) / "config.toml"
    if user.is_file():
        try:
            mine = state.load_toml(user, cache_dir(env)).get("backends", {})
        except (OSError, ValueError):
            return rules  # cmdline.launch_args reports a broken config file before any probe
        if not isinstance(mine, Mapping):
            raise SafeLlamaError(f"safe-llama: {user}: [backends] must be a table", ExitStatus.BAD_CONFIG)
        rules |= parse_alloc_rules(mine, f"{user}: [backends]")
    return rules
