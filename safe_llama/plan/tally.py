"""Bytes per place and item: {"CUDA0": {"weights": ..., "kv": ...}, "host": {...}}, the one way plan.split and
plan.memory add what llama.cpp allocates; and llama.cpp's count of offloaded layers.

Owns that tally and that count; must not decide where anything goes (plan.split) nor check a limit
(plan.memory)."""

from __future__ import annotations

Tally = dict[str, dict[str, int]]


def add(tally: Tally, place: str, item: str, size: int) -> None:
    """Count `size` bytes of `item` at `place` (nothing for 0: an item is listed only when it holds bytes)."""
    if size:
        items = tally.setdefault(place, {})
        items[item] = items.get(item, 0) + size


def offloaded_slots(n_gpu_layers: int | None, n_layer: int) -> int:
    """What -ngl offloads, as llama.cpp counts it: the last n of its n_layer + 1 slots (the repeating layers,
    then the output layer), all of them for None (its default) or a negative value; the repeating layers
    among them are min(this, n_layer)."""
    if n_gpu_layers is None or n_gpu_layers < 0:
        return n_layer + 1
    return min(n_gpu_layers, n_layer + 1)
