"""From a llama.cpp command line to the typed request the planner works on.

Owns the request a command line makes (its memory options, each read as its row in cmdline.memory_flags says;
the files it names; a draft model) and llama-server's address; must not read a file. Pure. Planning,
launching, supervising and explaining all read this one.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from safe_llama.cmdline import env_scan, memory_flags
from safe_llama.cmdline.llama_args import CommandLine, stoi
from safe_llama.cmdline.memory_flags import DraftOptions, Layout
from safe_llama.model.kv import KvRequest


@dataclass(frozen=True)
class DraftRequest:
    """-md / -hfd: a second model (speculative decoding) with its own options (cmdline.memory_flags.DRAFT_FLAGS)."""

    model: str | None
    hf_repo: str | None
    options: DraftOptions


@dataclass(frozen=True)
class Request:
    """A command line's memory options (each read as its row in cmdline.memory_flags says) and the files it names."""

    cmd: CommandLine
    kv: KvRequest
    layout: Layout  # without what the files hold: no projector size, no draft model (pipeline.prepare reads them)
    model_path: str | None  # -m as given (None: not given)
    n_gpu_layers: str | None  # as given: a number, "auto" or "all"
    mmproj: str | None = None  # -mm
    draft: DraftRequest | None = None


def _str(cmd: CommandLine, key: str) -> str | None:
    value = cmd.value(key)
    return value if isinstance(value, str) and value else None


def _draft(cmd: CommandLine) -> DraftRequest | None:
    model, hf_repo = _str(cmd, "--spec-draft-model"), _str(cmd, "--spec-draft-hf")
    if not (model or hf_repo):
        return None
    return DraftRequest(model=model, hf_repo=hf_repo, options=memory_flags.draft_options(cmd))


def to_request(cmd: CommandLine) -> Request:
    kv = memory_flags.kv_request(cmd)
    draft = _draft(cmd)
    ngl = cmd.value("--gpu-layers")
    return Request(
        cmd=cmd,
        kv=kv,
        layout=memory_flags.layout(cmd),
        model_path=_str(cmd, "--model"),
        n_gpu_layers=None if ngl is None else str(ngl),
        mmproj=_str(cmd, "--mmproj"),
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
