"""What the user declares about the device and the host instead of (or over) what the probes see: sizes from
the command line, SAFE_LLAMA_* or the config file, and each RPC worker's budget (--rpc-memory).

Owns parsing that text into DeclaredLimits; a bad size is a usage error naming where it was set."""

from __future__ import annotations

from collections.abc import Callable, Mapping

from safe_llama.device.limits import DeclaredLimits
from safe_llama.errors import ExitStatus, SafeLlamaError
from safe_llama.units import parse_bytes


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
        try:
            value = parse_bytes(text)
        except ValueError as err:
            raise SafeLlamaError(f"safe-llama: {option}: {err}", ExitStatus.USAGE) from None
        if value <= 0:
            raise SafeLlamaError(f"safe-llama: {option}: must be more than 0", ExitStatus.USAGE)
        return value

    return DeclaredLimits(
        profile=profile,
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
