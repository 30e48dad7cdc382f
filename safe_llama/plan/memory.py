"""The allocation model: what llama.cpp allocates where (weights by layer and tensor rule, KV, compute, repacked
copies, projector, draft, prompt cache) and which budget each counts against (device memory, the per-allocation cap,
RAM, a cgroup's charge, the address space), per backend as the policy says.

Owns that arithmetic over one set of settings; must not choose settings (the planner walks the ladder).

Over 400 lines on purpose: one place's sum per budget; its parts with a concern of their own (compute, split,
tally, serving, allocation_words) are already out."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace

from safe_llama.backends.registry import backend_named
from safe_llama.cmdline.memory_flags import LlamaSettings, Override
from safe_llama.device.limits import Sourced
from safe_llama.model.facts import ModelFacts
from safe_llama.model.kv import KvPlan, buffers, plan_kv
from safe_llama.plan import allocation_words
from safe_llama.plan.compute import (
    attention_on_host,
    compute_estimate,
    expert_ff_width,
    host_compute_estimate,
    input_mask_bytes,
)
from safe_llama.plan.compute import device_compute as compute_by_device
from safe_llama.plan.policy import Policy
from safe_llama.plan.serving import checkpoint_bytes
from safe_llama.plan.split import (
    WeightsCache,
    balanced_split,
    device_names,
    experts_on_devices,
    free_split,
    layer_places,
    memory_of,
    placed_weights,
    slot_bytes,
)
from safe_llama.plan.tally import Tally, add, offloaded_slots
from safe_llama.plan.target import Target, kv_splits

MIB = 1024 * 1024


@dataclass(frozen=True)
class Allocation:
    """One buffer, or one budget's total, against the limit it must stay under: which buffer, where, how many
    bytes and why they count. Numbers and names only: plan.allocation_words says it in plain words."""

    buffer: str  # "kv cap" | "kv tensor" | "kv buffer" | "device total" | "host total"
    place: str  # "host", a device ("CUDA0", "RPC0"), or "" for the KV as a whole (kv cap)
    bytes: int
    limit: int
    n_ctx: int = 0  # the context the bytes were computed at
    host_kind: str = ""  # a host limit's kind (device.host_budget.HOST_LIMIT_KINDS); "" for the others
    source: Sourced[int] | None = None  # the limit as probed, declared or learned, before the margin
    margin_fraction: float = 0.0  # kept free: this share of `source` (device, RAM and cgroup totals)
    margin_bytes: int = 0  # kept free: these bytes (a KV buffer's max allocation, the address space)
    counted: tuple[str, ...] = ()  # a total's parts, in order (memory_by_place's items; host: see _host_parts)
    cache: str = ""  # a KV buffer's or tensor's cache kind (full, swa, ...)
    caches: int = 1  # how many KV caches the model has
    part: str = ""  # a KV tensor: "K" or "V"
    piece: int = 0  # a KV buffer: which of `pieces` (from 1)
    pieces: int = 1
    one_allocation: bool = False  # a KV buffer: this binary allocates each cache's KV whole
    endpoint: str = ""  # a device on an RPC worker: host:port
    sole: bool = False  # a device total: the plan's one device, holding weights, KV and compute only

    @property
    def fits(self) -> bool:
        return self.bytes <= self.limit

    @property
    def name(self) -> str:
        """plan.allocation_words.label: kept here for the renderers and tests that name an allocation."""
        return allocation_words.label(self)

    @property
    def limit_name(self) -> str:
        """plan.allocation_words.limit_label (see name)."""
        return allocation_words.limit_label(self)


def _model_memory(
    facts: ModelFacts,
    n_gpu_layers: int | None,
    overrides: Sequence[Override],
    devices: Sequence[str],
    split: Sequence[float],
    kv: KvPlan | None,
    kv_offload: bool,
    repack_types: frozenset[str] = frozenset(),
    max_tensor: int | None = None,
    weights_cache: WeightsCache | None = None,
) -> Tally:
    """Weights and KV of one model per place ("host" or a device name); on the host also the weights the
    CPU backend repacks (a second copy in allocated memory: the matrix weights of the repacked types; the
    input embeddings are read by row and stay in the mapping)."""
    n_layer = max(facts.block_count, 1)
    offloaded = offloaded_slots(n_gpu_layers, n_layer)
    places = layer_places(n_layer, offloaded, devices, split)
    place_weights = weights_cache.placed if weights_cache is not None else placed_weights
    weights = place_weights(facts, overrides, devices, places, offloaded, repack_types, max_tensor)
    out = {place: dict(items) for place, items in weights.items()}

    if kv is not None:
        for cache in kv.caches:
            per_layer = cache.total_bytes // max(cache.layers, 1)
            kv_layers = [il for il, layer in enumerate(facts.layers) if layer.has_kv][: cache.layers]
            placed = 0
            for il in kv_layers:
                place = places[il] if kv_offload and il < n_layer else "host"
                add(out, place, "kv", per_layer)
                placed += per_layer
            add(out, "host", "kv", cache.total_bytes - placed)
    return out


def planned_split(
    facts: ModelFacts, settings: LlamaSettings, target: Target, weights_cache: WeightsCache | None = None
) -> tuple[int, ...] | None:
    """The -ts (layers per device) the plan sets over RPC workers at these settings: balanced_split over each
    device's memory less its compute buffer and, on a worker, the worker's own memory. None: a device whose
    memory is not known, or no split that fits."""
    layout = settings.layout
    devices = device_names(target, layout.devices, layout.split_mode, layout.main_gpu)
    kv = plan_kv(facts, settings.kv)
    kv_offload = layout.kv_offload and not settings.stateful
    even = replace(settings, layout=replace(layout, balance=False, tensor_split=tuple(1.0 for _ in devices)))
    held = memory_by_place(facts, even, target, weights_cache)
    room = []
    for name in devices:
        memory = memory_of(target, name)
        if memory is None:
            return None
        fixed = held.get(name, {})
        room.append(memory.value - fixed.get("compute", 0) - fixed.get("worker", 0))
    return balanced_split(slot_bytes(facts, kv, kv_offload), room)


def memory_by_place(
    facts: ModelFacts, settings: LlamaSettings, target: Target, weights_cache: WeightsCache | None = None
) -> Tally:
    """Where each part lives: {"CUDA0": {"weights", "kv", "compute", ...}, "host": {...}}, in bytes.

    Items: weights, kv, compute (estimate), mmproj (projector weights), draft_weights, draft_kv, and on the
    host repacked (the CPU backend's copies of repacked weights), prompt_cache (llama-server's -cram: grows
    in use up to that limit; -1: one context's worth) and checkpoints (llama-server's -ctxcp per slot, for
    models whose memory cannot be rolled back: sliding-window or recurrent layers).
    """
    layout = settings.layout
    kv = plan_kv(facts, settings.kv)
    devices = device_names(target, layout.devices, layout.split_mode, layout.main_gpu)
    kv_offload = layout.kv_offload and not settings.stateful
    main = devices[min(layout.main_gpu, len(devices) - 1)] if devices else "host"
    costs = target.compute_costs
    # the whole KV in host memory while a device runs the graph (its op offload copies K and V over)
    kv_on_host = main != "host" and layout.op_offload and (not kv_offload or settings.n_gpu_layers == 0)
    n_layer = max(facts.block_count, 1)
    offloaded = offloaded_slots(settings.n_gpu_layers, n_layer)
    split = layout.tensor_split or free_split(target, devices)
    expert_ff = 0
    if main != "host" and experts_on_devices(facts, layout.rules, layer_places(n_layer, offloaded, devices, split)):
        expert_ff = expert_ff_width(facts)
    limit = attention_limit(facts, settings, target)
    on_host = attention_on_host(facts, kv, limit)
    compute = compute_estimate(
        facts, kv, settings.kv, kv_f16_copies=target.kv_f16_copies, kv_on_host=kv_on_host, costs=costs,
        expert_ff=expert_ff, max_tensor=limit,
    )  # fmt: skip
    compute += target.compute_extra
    # several devices running all layers: llama.cpp pipelines them, each keeping copies of its graph inputs
    pipelined = (
        len(devices) > 1 and offloaded > n_layer and layout.split_mode == "layer" and kv_offload and not layout.rules
    )
    copies = (target.pipeline_copies - 1) * input_mask_bytes(kv) if pipelined else 0
    if layout.balance and not layout.tensor_split and len(devices) > 1 and offloaded > n_layer:
        chosen = planned_split(facts, settings, target, weights_cache)
        split = tuple(float(x) for x in chosen) if chosen is not None else split
    repack = target.cpu_repack_types if layout.repack else frozenset()
    max_tensor = target.max_tensor.value if target.max_tensor is not None else None
    out = _model_memory(
        facts, settings.n_gpu_layers, layout.rules, devices, split, kv, kv_offload, repack, max_tensor,
        weights_cache,
    )  # fmt: skip
    out.setdefault("host", {})

    if target.integrated or backend_named(target.backend).buffers_on_host_first:
        # integrated GPUs share the host's RAM; OpenVINO allocates every buffer on the host first
        for place in devices:
            add(out, "host", "kv", out.get(place, {}).get("kv", 0))
    if len(devices) > 1:
        # every device that runs layers reserves its own graph (with its copies of the inputs, pipelined)
        placed = layer_places(n_layer, offloaded, devices, split)
        for place, size in compute_by_device(facts, kv, settings.kv, target, placed[: n_layer + 1], compute).items():
            add(out, place, "compute", size + copies)
    else:
        add(out, main, "compute", compute)
    for remote in target.remote:
        if remote.name in devices:
            add(out, remote.name, "worker", target.worker_overhead)
    if main != "host" and (not target.integrated or on_host is not None):
        # the graph's inputs staged in host memory (CUDA_Host compute buffer; H200: 1,606.53 MiB at 1,612,032
        # cells, -ub 512, flash attention) and any attention the device cannot run (then beside an iGPU too)
        add(out, "host", "compute", host_compute_estimate(facts, kv, costs, limit) + copies)
        k_on_host = backend_named(target.backend).quantized_k_attention_on_host
        if k_on_host and not kv.flash_attn and settings.kv.type_k not in _FLOAT_TYPES and not on_host:
            add(out, "host", "compute", compute)  # each layer's KQ and soft_max on the CPU
    if layout.mmproj_bytes:
        add(out, main if layout.mmproj_offload else "host", "mmproj", layout.mmproj_bytes)
    if layout.draft is not None:
        draft = layout.draft
        options = draft.options
        draft_kv = plan_kv(draft.facts, replace(settings.kv, type_k=options.type_k, type_v=options.type_v))
        part = _model_memory(
            draft.facts, options.n_gpu_layers, options.rules, devices, split, draft_kv, kv_offload, repack, max_tensor,
            weights_cache,
        )  # fmt: skip
        for place, items in part.items():
            for item, size in items.items():
                add(out, place, f"draft_{item}", size)
        add(out, main, "draft_compute", compute_estimate(draft.facts, draft_kv, costs=costs))
    if layout.cache_ram_mib:
        # tools/server/server-task.cpp server_prompt_cache: a byte limit; its token limit (n_ctx) rises to
        # what the byte limit holds, so only -1 (no byte limit) bounds it by one context's worth
        limit = kv.total_bytes if layout.cache_ram_mib < 0 else layout.cache_ram_mib * MIB
        add(out, "host", "prompt_cache", limit)
    if layout.ctx_checkpoints > 0 and settings.kv.tool == "server":
        add(
            out,
            "host",
            "checkpoints",
            layout.ctx_checkpoints * max(kv.context.n_seq_max, 1) * checkpoint_bytes(facts, kv),
        )
    return {place: dict(items) for place, items in out.items()}


def attention_limit(facts: ModelFacts, settings: LlamaSettings, target: Target) -> int | None:
    """The largest tensor the device's attention takes (Vulkan's maxStorageBufferRange: above it the attention
    runs on the host, plan.compute.attention_on_host) where the device runs it: layers and their KV on it."""
    layout, n_layer = settings.layout, max(facts.block_count, 1)
    devices = device_names(target, layout.devices, layout.split_mode, layout.main_gpu)
    if target.max_tensor is None or not devices or not offloaded_slots(settings.n_gpu_layers, n_layer):
        return None
    return target.max_tensor.value if layout.kv_offload and not settings.stateful else None


def allocations(
    facts: ModelFacts,
    settings: LlamaSettings,
    target: Target,
    policy: Policy,
    weights_cache: WeightsCache | None = None,
) -> tuple[Allocation, ...]:
    """Every buffer and total the plan checks against its limit at these settings, in bytes."""
    kv = plan_kv(facts, settings.kv)
    layout = settings.layout
    places = memory_by_place(facts, settings, target, weights_cache)
    out: list[Allocation] = []
    n_ctx = kv.context.n_ctx
    if target.kv_cap is not None:
        out.append(Allocation("kv cap", "", kv.total_bytes, target.kv_cap, n_ctx))
    kv_on_device = target.on_gpu and not settings.stateful and layout.kv_offload
    n_layer = max(facts.block_count, 1)
    offloaded = min(offloaded_slots(settings.n_gpu_layers, n_layer), n_layer)
    device_share = offloaded / n_layer if kv_on_device else 0.0
    split = kv_splits(target, policy)
    device = target.device or ""
    if kv_on_device and target.max_tensor is not None and offloaded:
        out.extend(_tensor_limits(kv, target.max_tensor, n_ctx, device))
    if kv_on_device and target.max_alloc is not None and offloaded:
        margin = policy.per_backend(policy.max_alloc_margin, target.backend)
        if target.max_alloc.detail.startswith("GGML_VK_FORCE"):
            margin = 0  # ggml compares a buffer with the forced size to the byte (ggml_vk_create_buffer)
        limit = target.max_alloc.value - margin
        for cache in kv.caches:
            sizes = buffers(cache.tensor_bytes, (target.alloc_block or target.max_alloc.value) if split else None)
            for i, size in enumerate(sizes):
                out.append(
                    Allocation(
                        "kv buffer", device, int(size * device_share), limit, n_ctx, source=target.max_alloc,
                        margin_bytes=margin, cache=cache.kind, caches=len(kv.caches), piece=i + 1,
                        pieces=len(sizes), one_allocation=not split,
                    )
                )  # fmt: skip
    fraction = policy.per_backend(policy.memory_margin_fraction, target.backend) * target.margin_scale
    remote = {r.name: r for r in target.remote}
    for place, items in places.items():
        memory = memory_of(target, place)
        if memory is None:
            continue
        out.append(
            Allocation(
                "device total", place, sum(items.values()), int(memory.value * (1 - fraction)), n_ctx,
                source=memory, margin_fraction=fraction, counted=tuple(items),
                endpoint=remote[place].endpoint if place in remote else "",
                sole=place == (target.device or place) and len(places) <= 2 and set(items) <= _PLAIN,
            )
        )  # fmt: skip
    host = places.get("host", {})
    draft = layout.draft.facts if layout.draft else None
    host_other = sum(v for k, v in host.items() if k not in ("weights", "draft_weights", *_GROWS_IN_USE))
    # what llama-server grows into while it serves: counted in a cgroup's charge or a declared budget once set
    # the prompt cache is charged beyond its -cram (policy: prompt_cache_charge)
    cache_charged = int(host.get("prompt_cache", 0) * policy.prompt_cache_charge)
    in_use = (cache_charged if layout.cache_ram_set else 0) + (
        host.get("checkpoints", 0) if layout.ctx_checkpoints_set else 0
    )
    if target.on_gpu and target.integrated:
        host_other += sum(v for p, items in places.items() if p != "host" for k, v in items.items() if "compute" in k)
    # weights of layers kept on the host: RAM must hold them to run at speed
    host_weights = host.get("weights", 0) + host.get("draft_weights", 0)
    # an integrated GPU's copies of offloaded weights are buffers in host RAM, charged like any other
    device_copies = 0
    if target.on_gpu and target.integrated:
        device_copies = sum(v for p, items in places.items() if p != "host" for k, v in items.items() if "weights" in k)
    mapped = layout.load_mode not in _RESIDENT_LOADS
    for limit in target.limits_on_host:
        budget = limit.budget.value
        if limit.kind == "address space":
            # every mapping counts: the whole file when mapped, reserved but untouched buffers, thread stacks
            # and malloc arenas (the fixed overhead), the tokenizer, and llama-server's per-cell bookkeeping
            overhead = policy.address_space_fixed(target.backend, settings.kv.tool)
            overhead += policy.address_space_per_vocab_token * (facts.vocab_size + (draft.vocab_size if draft else 0))
            overhead += policy.address_space_per_cell * kv.context.n_ctx
            weights = device_copies + (facts.file_size + (draft.file_size if draft else 0) if mapped else host_weights)
            # a retry's search under this exact limit starts at the top of the margin band (margin_scale -1)
            kept = int(policy.address_space_margin * target.margin_scale)
            usable = budget - kept
            margin_bytes, margin_fraction = kept, 0.0
            parts: tuple[str, ...] = ("process", "mapped model file", "kv", "compute")
        else:
            # what the process keeps resident beside its buffers: a fixed part, the tokenizer's tables, the
            # server's per-cell bookkeeping
            overhead = policy.per_backend(policy.process_overhead, target.backend)
            overhead += policy.process_per_vocab_token * (facts.vocab_size + (draft.vocab_size if draft else 0))
            overhead += policy.process_per_cell * kv.context.n_ctx
            # a cgroup's limit and a declared host budget are the server's for good (free RAM is what other
            # programs leave now): what it grows into while serving is sized into them (plan.serving)
            grows_here = limit.kind == "cgroup" or limit.budget.source == "declared"
            if grows_here:
                overhead += in_use
            if limit.kind == "cgroup":
                # what the group is charged at full use, not at start: safe-llama's supervisor (it shares the
                # group and grows past what was charged when it probed; a ready server's is handed off to a small
                # one, but requests can fill the context before that: nothing given back is counted; handed off as
                # llama-server starts, the small one is all that stays: what this process held when it probed is
                # given back, the small one's charge taken), what a request that fills the context adds to the
                # server, and what the server grows into while it serves
                if target.own_charge:
                    overhead += policy.handed_supervisor_bytes - target.own_charge
                else:
                    overhead += policy.supervisor_bytes
                if settings.kv.tool == "server":
                    overhead += policy.request_bytes + policy.request_bytes_per_cell * kv.context.n_ctx
            # under a cgroup the page cache of mapped weights is charged but reclaimable: only weights read
            # into memory or locked there count (-lm none, dio, mlock)
            weights = device_copies + (host_weights if limit.kind == "ram" or not mapped else 0)
            usable = int(budget * (1 - fraction))
            margin_bytes, margin_fraction = 0, fraction
            parts = ("process",) + (("weights",) if weights else ()) + ("kv", "compute")
            parts += ("prompt_cache", "checkpoints") if in_use and grows_here else ()
        out.append(
            Allocation(
                "host total", "host", overhead + weights + host_other, usable, n_ctx, limit.kind, limit.budget,
                margin_fraction=margin_fraction, margin_bytes=margin_bytes, counted=parts,
            )
        )  # fmt: skip
    return tuple(out)


def _tensor_limits(kv: KvPlan, max_tensor: Sourced[int], n_ctx: int, device: str) -> list[Allocation]:
    """Each cache's largest K and V tensor (one layer's, every stream) against the largest tensor the device's
    operations take: above it llama.cpp aborts ("pre-allocated tensor (cache_k_l0) in a buffer (Vulkan0) that
    cannot run the operation"). ggml compares the tensor's bytes to the limit exactly: no margin."""
    out = []
    for cache in kv.caches:
        if cache.kind == "recurrent":
            continue
        # K then V per layer; an MLA cache and the indexer hold K only
        parts = (
            (("K", cache.tensor_bytes[0::2]), ("V", cache.tensor_bytes[1::2]))
            if cache.v_bytes
            else (("K", cache.tensor_bytes),)
        )
        for part, sizes in parts:
            if not sizes:
                continue
            out.append(
                Allocation(
                    "kv tensor", device, max(sizes), max_tensor.value, n_ctx, source=max_tensor, cache=cache.kind,
                    caches=len(kv.caches), part=part,
                )
            )  # fmt: skip
    return out


_PLAIN = frozenset({"weights", "kv", "compute"})
_FLOAT_TYPES = frozenset({"f32", "f16", "bf16"})  # cache types every backend multiplies in any view

# llama-server's host memory that grows with use (counted under a cgroup or a declared budget once its size is set)
_GROWS_IN_USE = ("prompt_cache", "checkpoints")


# load modes (-lm) that read the weights into allocated or locked memory instead of leaving them to the page cache
_RESIDENT_LOADS = frozenset({"none", "dio", "mlock", "mmap+mlock"})
