"""The devices llama.cpp spreads a model over and its layer split: which devices, in its order (RPC workers
first), which layer lands where for a -ts (its own float arithmetic), and a split in whole layers that leaves
every device the same share of its memory free.

Owns that placement arithmetic; must not size compute buffers nor check limits (plan.memory does)."""

from __future__ import annotations

import bisect
import struct
from collections.abc import Sequence

from safe_llama.device.limits import Sourced
from safe_llama.model.facts import ModelFacts
from safe_llama.model.kv import KvPlan
from safe_llama.plan.target import Target


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
    active = min(n_gpu_layers, n_layer + 1)
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
    return target.device_memory
