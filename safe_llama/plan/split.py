"""The devices llama.cpp spreads a model over and its layer split: which devices, in its order (RPC workers
first), which layer lands where for a -ts (its own float arithmetic), and a split in whole layers that leaves
every device the same share of its memory free.

Also where each tensor's weights land (the -ot/-cmoe rules, the output layer, tied embeddings); a WeightsCache,
made per plan by its caller, keeps that for the ladder's context search, which changes only the KV.

Owns that placement arithmetic; must not size compute buffers nor check limits (plan.memory does)."""

from __future__ import annotations

import bisect
import re
import struct
from collections.abc import Sequence

from safe_llama.cmdline.memory_flags import Override
from safe_llama.device.limits import Sourced
from safe_llama.model.facts import ModelFacts
from safe_llama.model.kv import KvPlan
from safe_llama.plan.tally import Tally, add, offloaded_slots
from safe_llama.plan.target import Target


def _placed(name: str, overrides: Sequence[Override]) -> Override | None:
    for rule in overrides:
        try:
            if re.search(rule.pattern, name):
                return rule
        except re.error:
            continue
    return None


def experts_on_devices(facts: ModelFacts, overrides: Sequence[Override], places: Sequence[str]) -> bool:
    """Whether any MoE expert tensor lands on a device (its layer offloaded and no rule sends it to the host)."""
    for name, _ in facts.tensors:
        if "_exps." not in name or not name.startswith("blk."):
            continue
        head = name[4:].partition(".")[0]
        if not head.isdigit() or int(head) >= len(places) or places[int(head)] == "host":
            continue
        rule = _placed(name, overrides)
        if rule is None or not rule.to_host:
            return True
    return False


def placed_weights(
    facts: ModelFacts,
    overrides: Sequence[Override],
    devices: Sequence[str],
    places: Sequence[str],
    offloaded: int,
    repack_types: frozenset[str],
    max_tensor: int | None = None,
) -> Tally:
    """Weights per place (and the host's repacked copies): the part of plan.memory's tally that no KV changes.
    max_tensor: the largest tensor a device's operations take (Vulkan's storage range): a larger weight stays
    on the host, as llama.cpp's weight_buft_supported finds."""
    out: Tally = {}

    n_layer = max(facts.block_count, 1)
    tensors = facts.tensors or tuple(
        [(f"blk.{il}.", b) for il, b in enumerate(facts.weight_bytes_per_layer)] + [("other", facts.other_weight_bytes)]
    )
    types = dict(zip((name for name, _ in facts.tensors), facts.tensor_types, strict=False))
    for name, size in tensors:
        il = None
        if name.startswith("blk."):
            head = name[4:].partition(".")[0]
            il = int(head) if head.isdigit() else None
        if il is not None and il < n_layer:
            place = places[il]
        elif name.startswith("token_embd") or not devices:
            place = "host"  # llama.cpp keeps the input embeddings on the CPU
        else:
            place = places[n_layer]  # the output layer
        rule = _placed(name, overrides)
        if rule is not None:
            place = "host" if rule.to_host else rule.buffer_type
        if place != "host" and max_tensor is not None and size > max_tensor:
            place = "host"
        add(out, place, "weights", size)
        if place == "host" and types.get(name) in repack_types and not name.startswith("token_embd"):
            add(out, place, "repacked", size)
    names = {name for name, _ in tensors}
    if devices and places[n_layer] != "host" and "token_embd.weight" in names and "output.weight" not in names:
        # tied embeddings: llama.cpp loads token_embd a second time as the output layer, on that layer's
        # device (TENSOR_DUPLICATED), which is offloaded from -ngl 1 on (measured on an H200: -ngl 10 of 24
        # layers put 9 layers and the 5.11 MiB copy on CUDA0, 3,173.42 MiB); on the host the two are one
        # mapping, so one too large for the device
        # is counted once, where it lives
        embd = dict(tensors)["token_embd.weight"]
        if max_tensor is None or embd <= max_tensor:
            add(out, places[n_layer], "weights", embd)
    return out


class WeightsCache:
    """The last weights placement per model (a plan's model and its draft), kept by whoever plans (plan() makes
    one per plan and passes it down): the ladder's context search changes the KV only. A facts object is kept
    alive here and compared by identity, never by id alone."""

    def __init__(self) -> None:
        self._kept: dict[int, tuple[ModelFacts, tuple[object, ...], Tally]] = {}

    def placed(
        self,
        facts: ModelFacts,
        overrides: Sequence[Override],
        devices: Sequence[str],
        places: Sequence[str],
        offloaded: int,
        repack_types: frozenset[str],
        max_tensor: int | None = None,
    ) -> Tally:
        """placed_weights, computed once per model and placement. The caller must copy what it changes."""
        key = (tuple(overrides), tuple(devices), tuple(places), offloaded, repack_types, max_tensor)
        kept = self._kept.get(id(facts))
        if kept is None or kept[0] is not facts or kept[1] != key:
            kept = (facts, key, placed_weights(facts, overrides, devices, places, offloaded, repack_types, max_tensor))
            self._kept[id(facts)] = kept
        return kept[2]


def device_names(target: Target, given: Sequence[str] = (), split_mode: str = "layer", main_gpu: int = 0) -> list[str]:
    """The devices llama.cpp splits layers over, in its order: the -dev list (`given`), else the RPC workers'
    then the local GPU; one with -sm none (the main GPU)."""
    local = [target.device or "GPU0"] if target.on_gpu else []
    names = list(given) if given else [r.name for r in target.remote] + local
    if not names:
        return []
    if split_mode == "none":
        return [names[min(main_gpu, len(names) - 1)]]
    if not given and not target.remote:
        return names[:1]  # the one local device the probe chose
    return names


def _f32(x: float) -> float:
    return float(struct.unpack("f", struct.pack("f", x))[0])


def layer_places(n_layer: int, n_gpu_layers: int, devices: Sequence[str], split: Sequence[float]) -> list[str]:
    """llama.cpp's layer assignment (src/llama-model.cpp load_tensors), in its float arithmetic: the last
    n_gpu_layers of the n_layer repeating layers and the output layer (index n_layer) go to the devices, a
    layer to the first device whose cumulative share of `split` is above its position; equal shares when
    `split` is empty or all zero."""
    places = ["host"] * (n_layer + 1)
    if not devices or n_gpu_layers <= 0:
        return places
    shares = [max(float(x), 0.0) for x in split[: len(devices)]]
    shares += [0.0] * (len(devices) - len(shares))
    if not any(shares):
        shares = [1.0] * len(devices)
    bounds, acc = [], 0.0
    for share in shares:
        acc = _f32(acc + _f32(share))
        bounds.append(acc)
    bounds = [_f32(b / acc) for b in bounds]
    start = max(n_layer + 1 - n_gpu_layers, 0)
    active = offloaded_slots(n_gpu_layers, n_layer)
    for il in range(start, min(start + active, n_layer + 1)):
        at = _f32(float(il - start) / active)
        places[il] = devices[min(bisect.bisect_right(bounds, at), len(devices) - 1)]
    return places


def slot_bytes(facts: ModelFacts, kv: KvPlan, kv_offload: bool) -> list[int]:
    """What each of llama.cpp's offload slots holds on its device: a repeating layer's weights and KV, and
    (the last slot) the output layer's weights, a tied embedding's copy included."""
    n_layer = max(facts.block_count, 1)
    slots = [0] * (n_layer + 1)
    tensors = facts.tensors or tuple(
        [(f"blk.{il}.", b) for il, b in enumerate(facts.weight_bytes_per_layer)] + [("other", facts.other_weight_bytes)]
    )
    for name, size in tensors:
        head = name[4:].partition(".")[0] if name.startswith("blk.") else ""
        if head.isdigit() and int(head) < n_layer:
            slots[int(head)] += size
        elif not name.startswith("token_embd"):
            slots[n_layer] += size
    names = dict(tensors)
    if "token_embd.weight" in names and "output.weight" not in names:
        slots[n_layer] += names["token_embd.weight"]
    if kv_offload:
        for cache in kv.caches:
            per_layer = cache.total_bytes // max(cache.layers, 1)
            for il in [il for il, layer in enumerate(facts.layers) if layer.has_kv][: cache.layers]:
                if il < n_layer:
                    slots[il] += per_layer
    return slots


def balanced_split(slots: Sequence[int], room: Sequence[int]) -> tuple[int, ...] | None:
    """Layers per device (llama.cpp's -ts, in whole slots, so its arithmetic lands each layer where meant):
    consecutive slots in device order, leaving every device the largest equal share of its `room` (its memory
    less what it holds whatever its share) free. When nothing fits, the split where every device is over by
    the same least share (the planner then reduces the context from there). None: no device has room."""
    if not any(r > 0 for r in room):
        return None

    def fill(keep: float) -> list[int] | None:
        counts, at = [], 0
        for space in room:
            load, n = 0, 0
            while at + n < len(slots) and load + slots[at + n] <= space * (1 - keep):
                load += slots[at + n]
                n += 1
            counts.append(n)
            at += n
        return counts if at == len(slots) else None

    lo, hi = -(sum(slots) / min(r for r in room if r > 0)), 1.0  # at lo the first device with room takes all
    best = fill(lo)
    if best is None:
        return None
    for _ in range(40):
        mid = (lo + hi) / 2
        found = fill(mid)
        if found is None:
            hi = mid
        else:
            lo, best = mid, found
    return tuple(best)


def free_split(target: Target, devices: Sequence[str]) -> tuple[float, ...]:
    """llama.cpp's split without -ts: each device's reported free memory (known here for RPC workers; any
    device whose free memory is not known makes it equal shares)."""
    free = {r.name: float(r.free_bytes) for r in target.remote}
    if not devices or any(name not in free for name in devices):
        return ()
    return tuple(free[name] for name in devices)


def memory_of(target: Target, place: str) -> Sourced[int] | None:
    """The memory a device place is checked against: an RPC worker's own, else the local GPU's (None: the
    host, an integrated GPU's shared RAM, or no known size)."""
    for remote in target.remote:
        if remote.name == place:
            return remote.memory
    if place == "host" or not target.on_gpu or target.integrated:
        return None
    return target.device_budget
