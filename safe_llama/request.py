"""From a llama.cpp command line to the typed request the planner works on.

Owns the meaning of the memory-relevant options (their defaults, value checks); pure.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from safe_llama.errors import ExitStatus, SafeLlamaError
from safe_llama.kv import CACHE_TYPES, DEFAULT_N_BATCH, DEFAULT_N_UBATCH, KvRequest
from safe_llama.llama_args import CommandLine


@dataclass(frozen=True)
class Request:
    cmd: CommandLine
    kv: KvRequest
    model_path: str | None  # None: no -m; the bundled model is used
    device: str | None  # --device / LLAMA_ARG_DEVICE
    n_gpu_layers: str | None  # as given: a number, "auto" or "all"
    host: str
    port: int


def _int(cmd: CommandLine, key: str, label: str) -> int | None:
    value = cmd.value(key)
    if value is None:
        return None
    try:
        return int(str(value), 0)
    except ValueError:
        setting = cmd.get(key)
        where = "" if setting is None or setting.source == "argv" else f" (from {setting.source})"
        raise SafeLlamaError(f"safe-llama: {label}{where}: '{value}' is not a whole number", ExitStatus.USAGE) from None


def _cache_type(cmd: CommandLine, key: str, label: str) -> str:
    value = cmd.value(key)
    if value is None:
        return "f16"
    name = str(value).lower()
    if name not in CACHE_TYPES:
        raise SafeLlamaError(
            f"safe-llama: {label}: unknown cache type '{value}' (one of {', '.join(CACHE_TYPES)})",
            ExitStatus.USAGE,
        )
    return name


def _flag(cmd: CommandLine, key: str) -> bool | None:
    value = cmd.value(key)
    return None if value is None else bool(value)


def to_request(cmd: CommandLine) -> Request:
    fa = str(cmd.value("--flash-attn") or "auto").lower()
    fa = {"1": "on", "true": "on", "0": "off", "false": "off"}.get(fa, fa)
    if fa not in ("on", "off", "auto"):
        raise SafeLlamaError(f"safe-llama: -fa: '{fa}' is not on, off or auto", ExitStatus.USAGE)
    fit = str(cmd.value("--fit") or "on").lower() not in ("off", "0", "false")
    n_ctx = _int(cmd, "--ctx-size", "-c")
    if n_ctx is not None and n_ctx < 0:
        raise SafeLlamaError(f"safe-llama: -c: {n_ctx} is negative", ExitStatus.USAGE)
    n_parallel = _int(cmd, "--parallel", "-np")
    kv = KvRequest(
        tool=cmd.tool,
        n_ctx=n_ctx,
        n_parallel=n_parallel,
        kv_unified=_flag(cmd, "--kv-unified"),
        n_batch=_int(cmd, "--batch-size", "-b") or DEFAULT_N_BATCH,
        n_ubatch=_int(cmd, "--ubatch-size", "-ub") or DEFAULT_N_UBATCH,
        swa_full=bool(_flag(cmd, "--swa-full")),
        type_k=_cache_type(cmd, "--cache-type-k", "-ctk"),
        type_v=_cache_type(cmd, "--cache-type-v", "-ctv"),
        flash_attn=fa,
        fit=fit,
        kv_unified_per_slot=_int(cmd, "--kv-unified-per-slot", "--kv-unified-per-slot") or 0,
    )
    model = cmd.value("--model")
    device = cmd.value("--device")
    ngl = cmd.value("--gpu-layers")
    return Request(
        cmd=cmd,
        kv=kv,
        model_path=None if model is None else str(model),
        device=None if device is None else str(device),
        n_gpu_layers=None if ngl is None else str(ngl),
        host=str(cmd.value("--host") or "127.0.0.1"),
        port=_int(cmd, "--port", "--port") or 8080,
    )


def tool_env(env: Mapping[str, str]) -> dict[str, str]:
    """The environment variables llama.cpp reads for its options (for display and planning)."""
    return {k: v for k, v in env.items() if k.startswith("LLAMA_ARG_") or k.startswith("GGML_")}
