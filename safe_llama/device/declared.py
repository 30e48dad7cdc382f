"""What the user declares about the device and the host instead of (or over) what the probes see: sizes from
the command line, SAFE_LLAMA_* or the config file, a device profile's name, and each RPC worker's budget
(--rpc-memory).

Owns parsing that text into DeclaredLimits; a bad size or profile name is a usage error naming where it was
set. Must not read files (device.probing looks the profile up)."""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping

from safe_llama.device.limits import DeclaredLimits
from safe_llama.errors import ExitStatus, SafeLlamaError
from safe_llama.units import parse_bytes

SIZE_MOST = 1 << 50  # 1024T: more than any device, host or RPC worker this plans for
# A profile is a name looked up in the profile folders (device.probing), never a path: no '/', no '..', no
# leading dot, nothing a shell or a terminal would read differently.
PROFILE_NAME = r"[A-Za-z0-9_-][A-Za-z0-9._-]{0,63}"  # compiled where a profile is named (re's own cache)


def check_profile_name(name: str, where: str) -> str:
    """name when it is a profile's name; else a one-line usage error naming where it was set."""
    if re.fullmatch(PROFILE_NAME, name) and ".." not in name and not name.endswith(".toml"):
        return name
    raise SafeLlamaError(
        f"safe-llama: {where}: {name[:64]!r} is not a profile name (letters, digits, '.', '_', '-'; not a path: "
        "put your own profile in ~/.config/safe-llama/devices/NAME.toml and give NAME)",
        ExitStatus.USAGE,
    )


def declared_limits(
    *,
    profile: str | None = None,
    max_alloc: str | None = None,
    device_memory: str | None = None,
    integrated: bool | None = None,
    host_memory: str | None = None,
    rpc_memory: str | None = None,
    origins: Mapping[str, str] | None = None,
) -> DeclaredLimits:
    """DeclaredLimits from command-line text; a bad size is a usage error naming where it was set
    (`origins`: setting name -> SAFE_LLAMA_* or the config file, when not its option)."""
    where = dict(origins or {})

    def size(option: str, text: str | None) -> int | None:
        if text is None:
            return None
        option = where.get(option.removeprefix("--").replace("-", "_"), option)
        accepted = "a size from 1 byte to 1024T (e.g. 4294959104, 512M, 4G)"
        try:
            value = parse_bytes(text) if len(text) <= 64 else 0
        except ValueError:
            value = 0
        except OverflowError:  # more digits than a float holds
            value = SIZE_MOST + 1
        if not 0 < value <= SIZE_MOST:
            raise SafeLlamaError(f"safe-llama: {option}: {text[:40]!r} is not {accepted}", ExitStatus.USAGE)
        return value

    return DeclaredLimits(
        profile=None if profile is None else check_profile_name(profile, where.get("profile", "--profile")),
        max_alloc_bytes=size("--max-alloc", max_alloc),
        memory_bytes=size("--device-memory", device_memory),
        integrated=integrated,
        host_memory_bytes=size("--host-memory", host_memory),
        rpc_memory=_rpc_memory(rpc_memory, where.get("rpc_memory", "--rpc-memory"), size),
        origins=tuple(sorted(where.items())),
    )


def _rpc_memory(
    text: str | None, option: str, size: Callable[[str, str | None], int | None]
) -> tuple[tuple[str, int], ...]:
    """`HOST:PORT=SIZE[,HOST:PORT=SIZE...]`: what each RPC worker may hold."""
    if not text:
        return ()
    out: dict[str, int] = {}
    for part in (p.strip() for p in text.split(",")):
        endpoint, eq, amount = part.rpartition("=")
        if not eq or not endpoint or ":" not in endpoint:
            raise SafeLlamaError(
                f"safe-llama: {option}: '{part}' is not HOST:PORT=SIZE (e.g. 10.0.0.2:50052=12G)", ExitStatus.USAGE
            )
        value = size(option, amount)
        assert value is not None
        out[endpoint.strip()] = value
    return tuple(sorted(out.items()))
