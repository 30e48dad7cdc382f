"""From a llama.cpp command line to the typed request the planner works on.

Owns the meaning of the memory-relevant options and of llama-server's address (their defaults, and numbers
read as llama.cpp reads them: std::stoi / std::stof); pure. Planning, launching, supervising and explaining
all read this one.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass

from safe_llama.cmdline import env_scan
from safe_llama.cmdline.llama_args import CommandLine, read_gpu_layers, read_tensor_split, stoi
from safe_llama.errors import ExitStatus, SafeLlamaError
from safe_llama.model.cache_types import CACHE_TYPES
from safe_llama.model.kv import DEFAULT_N_BATCH, DEFAULT_N_UBATCH, KvRequest

DEFAULT_CACHE_RAM_MIB = 8192  # common.h cache_ram_mib: llama-server's prompt cache, host RAM
DEFAULT_CTX_CHECKPOINTS = 32  # common.h n_ctx_checkpoints: per slot, host RAM
EXPERT_REGEX = r"\.ffn_(up|down|gate|gate_up)_(ch|)exps"  # LLM_FFN_EXPS_REGEX (common/common.h)


@dataclass(frozen=True)
class TensorOverride:
    """-ot PATTERN=BUFFER_TYPE, -cmoe, -ncmoe: tensors whose name matches go to that buffer type."""

    pattern: str  # a std::regex_search pattern
    buffer_type: str  # "CPU" for host RAM, else a device's buffer type (CUDA0, ...)
    origin: str  # the option that made it

    def matches(self, name: str) -> bool:
        try:
            return re.search(self.pattern, name) is not None
        except re.error:
            return False


@dataclass(frozen=True)
class DraftRequest:
    """-md / -hfd: a second model (speculative decoding) with its own layers, device and KV types."""

    model: str | None
    hf_repo: str | None
    n_gpu_layers: int  # -1 auto, -2 all, else a count
    type_k: str
    type_v: str
    overrides: tuple[TensorOverride, ...]


@dataclass(frozen=True)
class Request:
    cmd: CommandLine
    kv: KvRequest
    model_path: str | None  # -m as given (None: not given)
    device: str | None  # --device / LLAMA_ARG_DEVICE
    n_gpu_layers: str | None  # as given: a number, "auto" or "all"
    kv_offload: bool = True  # -nkvo: the KV stays in host RAM
    op_offload: bool = True  # --no-op-offload: operations on host tensors are not offloaded to the device
    overrides: tuple[TensorOverride, ...] = ()
    split_mode: str = "layer"
    tensor_split: tuple[float, ...] = ()
    main_gpu: int = 0
    devices: tuple[str, ...] = ()  # -dev A,B
    load_mode: str = "auto"  # -lm (llama.cpp's replacement for --no-mmap / --mlock)
    mmproj: str | None = None  # -mm
    mmproj_offload: bool = True
    cache_ram_mib: int = 0  # llama-server / llama-cli prompt cache (host RAM); 0: none
    cache_ram_set: bool = False  # -cram / LLAMA_ARG_CACHE_RAM given: the user's value, never replaced
    ctx_checkpoints: int | None = None  # -ctxcp / LLAMA_ARG_CTX_CHECKPOINTS; None: not given (llama.cpp's 32)
    draft: DraftRequest | None = None


def _int(cmd: CommandLine, key: str, label: str) -> int | None:
    value = cmd.value(key)
    if value is None:
        return None
    try:
        return stoi(str(value))
    except ValueError:
        setting = cmd.get(key)
        where = "" if setting is None or setting.source == "argv" else f" (from {setting.source})"
        raise SafeLlamaError(f"safe-llama: {label}{where}: '{value}' is not a whole number", ExitStatus.USAGE) from None


def _cache_type(cmd: CommandLine, key: str, label: str, default: str = "f16") -> str:
    value = cmd.value(key)
    if value is None:
        return default
    name = str(value)
    if name not in CACHE_TYPES:
        raise SafeLlamaError(
            f"safe-llama: {label}: unknown cache type '{value}' (one of {', '.join(CACHE_TYPES)})",
            ExitStatus.USAGE,
        )
    return name


def _flag(cmd: CommandLine, key: str) -> bool | None:
    value = cmd.value(key)
    return None if value is None else bool(value)


def _str(cmd: CommandLine, key: str) -> str | None:
    value = cmd.value(key)
    return value if isinstance(value, str) and value else None


def overrides_of(cmd: CommandLine, ot: str, cmoe: str, ncmoe: str) -> tuple[TensorOverride, ...]:
    """-ot, -cmoe, -ncmoe in llama.cpp's order: the first matching pattern wins (llama-model-loader)."""
    out: list[TensorOverride] = []
    spec = _str(cmd, ot)
    if spec:
        for item in spec.split(","):
            pattern, _, buft = item.partition("=")
            out.append(TensorOverride(pattern, buft, "-ot"))
    if _flag(cmd, cmoe):
        out.append(TensorOverride(EXPERT_REGEX, "CPU", "-cmoe"))
    n = _int(cmd, ncmoe, "-ncmoe")
    for il in range(max(n or 0, 0)):
        out.append(TensorOverride(rf"blk\.{il}{EXPERT_REGEX}", "CPU", "-ncmoe"))
    return tuple(out)


def _ngl(value: str | None) -> int:
    if value is None:
        return -1
    try:
        return read_gpu_layers(value)
    except ValueError:
        raise SafeLlamaError(f"safe-llama: -ngl: '{value}' is not a number, auto or all", ExitStatus.USAGE) from None


def to_request(cmd: CommandLine) -> Request:
    fa = str(cmd.value("--flash-attn") or "auto")
    fa = {"1": "on", "true": "on", "enabled": "on", "0": "off", "false": "off", "disabled": "off", "-1": "auto"}.get(
        fa, fa
    )
    if fa not in ("on", "off", "auto"):
        raise SafeLlamaError(f"safe-llama: -fa: '{fa}' is not on, off or auto", ExitStatus.USAGE)
    fit = str(cmd.value("--fit") or "on") not in ("off", "0", "false", "disabled")
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
    model = _str(cmd, "--model")
    device = _str(cmd, "--device")
    ngl = cmd.value("--gpu-layers")
    draft_model, draft_hf = _str(cmd, "--spec-draft-model"), _str(cmd, "--spec-draft-hf")
    draft = None
    if draft_model or draft_hf:
        draft = DraftRequest(
            model=draft_model,
            hf_repo=draft_hf,
            n_gpu_layers=_ngl(_str(cmd, "--spec-draft-ngl")),
            type_k=_cache_type(cmd, "--spec-draft-type-k", "-ctkd"),
            type_v=_cache_type(cmd, "--spec-draft-type-v", "-ctvd"),
            overrides=overrides_of(
                cmd, "--spec-draft-override-tensor", "--spec-draft-cpu-moe", "--spec-draft-n-cpu-moe"
            ),
        )
    ts = _str(cmd, "--tensor-split")
    cache_ram = _int(cmd, "--cache-ram", "-cram")
    return Request(
        cmd=cmd,
        kv=kv,
        model_path=model,
        device=device,
        n_gpu_layers=None if ngl is None else str(ngl),
        kv_offload=cmd.value("--kv-offload") is not False,
        op_offload=cmd.value("--op-offload") is not False,
        overrides=overrides_of(cmd, "--override-tensor", "--cpu-moe", "--n-cpu-moe"),
        split_mode=_str(cmd, "--split-mode") or "layer",
        tensor_split=read_tensor_split(ts) if ts else (),
        main_gpu=_int(cmd, "--main-gpu", "-mg") or 0,
        devices=tuple(d for d in (device or "").split(",") if d and d != "none"),
        load_mode=_str(cmd, "--load-mode") or "auto",
        mmproj=_str(cmd, "--mmproj"),
        mmproj_offload=cmd.value("--mmproj-offload") is not False,
        cache_ram_mib=(DEFAULT_CACHE_RAM_MIB if cache_ram is None else cache_ram) if cmd.tool == "server" else 0,
        cache_ram_set=cache_ram is not None,
        ctx_checkpoints=_int(cmd, "--ctx-checkpoints", "-ctxcp"),
        draft=draft,
    )


@dataclass(frozen=True)
class Listen:
    """Where llama-server listens: --host, --port, --api-prefix and TLS, each a flag or its LLAMA_ARG_* twin."""

    host: str = "127.0.0.1"  # as given: an address, a name, several joined by commas, or a path ending in .sock
    port: int = 8080  # 0: the system picks one (the server logs which)
    api_prefix: str = ""
    tls: bool = False  # --ssl-key-file and --ssl-cert-file both given: https


def listen_of(cmd: CommandLine) -> Listen:
    """llama-server's address as it reads its options. Never raises: a port llama.cpp refuses reads as the
    default (llama.cpp then exits before it listens)."""
    port = cmd.value("--port")
    try:
        number = stoi(port) if isinstance(port, str) else Listen.port
    except ValueError:
        number = Listen.port
    return Listen(
        host=_str(cmd, "--host") or Listen.host,
        port=number,
        api_prefix=_str(cmd, "--api-prefix") or "",
        tls=bool(_str(cmd, "--ssl-key-file") and _str(cmd, "--ssl-cert-file")),
    )


def tool_env(env: Mapping[str, str]) -> dict[str, str]:
    """The environment variables llama.cpp reads for its options (for display and planning)."""
    return env_scan.prefixed(env, ("LLAMA_ARG_", "GGML_"))
