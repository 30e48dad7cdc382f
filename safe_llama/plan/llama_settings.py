"""The llama.cpp settings a plan chooses (LlamaSettings; not safe-llama's own launch settings, which
cmdline.launch_args reads) and the command line's memory options it keeps: the KV request, stateful execution,
the GPU layers, and where things live (Layout: offload switches, tensor rules, devices and split, projector, prompt
cache and checkpoints, load mode, a draft model).

Owns those values; must not size anything (plan.memory) nor choose them (the planner)."""

from __future__ import annotations

from dataclasses import dataclass, field

from safe_llama.model.facts import ModelFacts
from safe_llama.model.kv import KvRequest
from safe_llama.plan.split import Override


@dataclass(frozen=True)
class Draft:
    """A second model loaded beside the main one (-md / -hfd): weights and a KV of the same context."""

    facts: ModelFacts
    n_gpu_layers: int | None  # None: all
    type_k: str = "f16"
    type_v: str = "f16"
    overrides: tuple[Override, ...] = ()


@dataclass(frozen=True)
class Layout:
    """The command line's memory options that are not the KV request: where things live."""

    kv_offload: bool = True  # False (-nkvo): the KV stays in host RAM
    op_offload: bool = True  # False (--no-op-offload): operations on host tensors stay on the CPU
    overrides: tuple[Override, ...] = ()
    devices: tuple[str, ...] = ()  # -dev A,B (several: layers split between them)
    split_mode: str = "layer"  # none: everything on the main GPU
    tensor_split: tuple[float, ...] = ()  # -ts proportions, per device
    # no -ts from the user and RPC workers among the devices: the plan chooses the split (balanced_split)
    balance: bool = False
    main_gpu: int = 0
    mmproj_bytes: int = 0  # the projector file (-mm, or -hf's own)
    mmproj_offload: bool = True
    prompt_cache_mib: int = 0  # -cram: llama-server's prompt cache limit (-1: none but the context)
    # -cram's value is set (the user's, or the plan's under a cgroup): the cache counts in a cgroup's charge
    prompt_cache_set: bool = False
    ctx_checkpoints: int = 0  # -ctxcp: context checkpoints per llama-server slot (llama.cpp's 32 by default)
    ctx_checkpoints_set: bool = False  # as prompt_cache_set, for -ctxcp
    load_mode: str = "auto"  # -lm: none reads weights into allocated RAM instead of mapping the file
    draft: Draft | None = None


@dataclass(frozen=True)
class LlamaSettings:
    """The values of llama.cpp's memory options a plan sets: the KV request, stateful execution, GPU layers."""

    kv: KvRequest
    stateful: bool = False
    n_gpu_layers: int | None = None  # None: all layers on the device (llama.cpp's default)
    layout: Layout = field(default_factory=Layout)
