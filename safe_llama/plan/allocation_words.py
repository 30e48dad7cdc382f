"""The plan's allocations in plain words: each buffer's or total's label and its limit's, as the table and the
JSON name them, and the reason lines' "who needs how much, against what" (describe).

Owns that wording (the text is compared by tests and fixtures: change it only on purpose); must not add bytes
nor check a limit (plan.memory does). The diagnosis's own words are diagnosis.explain_words."""

from __future__ import annotations

from typing import Protocol

from safe_llama.device.limits import Sourced
from safe_llama.units import human


class Allocation(Protocol):
    """What these words read of a plan.memory.Allocation (a protocol: that class names itself through them, so
    this module cannot import it)."""

    @property
    def buffer(self) -> str: ...
    @property
    def place(self) -> str: ...
    @property
    def bytes(self) -> int: ...
    @property
    def limit(self) -> int: ...
    @property
    def n_ctx(self) -> int: ...
    @property
    def host_kind(self) -> str: ...
    @property
    def source(self) -> Sourced[int] | None: ...
    @property
    def margin_fraction(self) -> float: ...
    @property
    def margin_bytes(self) -> int: ...
    @property
    def counted(self) -> tuple[str, ...]: ...
    @property
    def cache(self) -> str: ...
    @property
    def caches(self) -> int: ...
    @property
    def part(self) -> str: ...
    @property
    def piece(self) -> int: ...
    @property
    def pieces(self) -> int: ...
    @property
    def one_allocation(self) -> bool: ...
    @property
    def endpoint(self) -> str: ...
    @property
    def sole(self) -> bool: ...
    @property
    def fits(self) -> bool: ...


def describe(a: Allocation) -> str:
    """One allocation against its limit in plain words: "CUDA0 (weights, KV, compute) 164.25 GiB at
    -c 2000128 is above its 137.00 GiB usable (139.80 GiB probed: ..., less 2%)"."""
    at = f" at -c {a.n_ctx}" if a.n_ctx else ""
    where = "within" if a.fits else "above"
    return f"{subject(a)} {human(a.bytes)}{at} is {where} {limit_words(a)}"


def label(a: Allocation) -> str:
    """The allocation's name in the plan's table and JSON: "KV full buffer 2/3", "host total (...)"."""
    if a.buffer == "kv cap":
        return "KV total"
    if a.buffer == "kv tensor":
        return f"KV {a.cache} {a.part} tensor of one layer"
    if a.buffer == "kv buffer":
        name = f"KV {a.cache} buffer" + (f" {a.piece}/{a.pieces}" if a.pieces > 1 else "")
        return name + (" (one allocation)" if a.one_allocation else "")
    if a.buffer == "device total":
        if a.sole:
            return "device total (weights, KV, compute estimate)"
        return f"{_device(a)} total ({_items(a.counted)})"
    if a.host_kind == "address space":
        return "host address space (process, mapped model file, KV, compute estimate)"
    kind = "cgroup charge" if a.host_kind == "cgroup" else "total"
    return f"host {kind} ({_host_parts(a, 'compute estimate')})"


def limit_label(a: Allocation) -> str:
    """The limit's name in the plan's table and JSON: "device memory 8.00 GiB (declared: ...) less 2%"."""
    source = a.source
    if a.buffer == "kv cap" or source is None:
        return "smaller than the start that failed"
    if a.buffer == "kv tensor":
        return f"largest device tensor {human(source.value)} ({source.source})"
    if a.buffer == "kv buffer":
        name = f"device max allocation {human(source.value)} ({source.source})"
        return name + (f" less {human(a.margin_bytes)} margin" if a.margin_bytes else "")
    if a.buffer == "device total":
        return f"device memory {human(source.value)} ({_origin(source)}){_margin_words(a.margin_fraction)}"
    return f"host budget {human(source.value)} ({_origin(source)}) {_host_margin(a)}"


def subject(a: Allocation) -> str:
    """Who needs the bytes, in a reason line: "the KV cache", "CUDA0 (weights, KV, compute)"."""
    if a.buffer == "kv cap":
        return "the KV cache"
    if a.buffer == "kv tensor":
        return f"one layer's {a.part} cache" + (f" ({a.cache})" if a.caches > 1 else "")
    if a.buffer == "kv buffer":
        words = f"KV cache piece {a.piece} of {a.pieces}" if a.pieces > 1 else "KV cache"
        words += " (one allocation)" if a.one_allocation else ""
        return f"{a.cache} {words}" if a.caches > 1 else words
    if a.buffer == "device total":
        return f"{_device(a)} ({_items(a.counted).replace('kv', 'KV')})"
    if a.host_kind == "address space":
        return "the address space (process, mapped model file, KV, compute)"
    kind = "cgroup charge" if a.host_kind == "cgroup" else "memory"
    return f"the host's {kind} ({_host_parts(a, 'compute')})"


def limit_words(a: Allocation) -> str:
    """The limit in a reason line, with its size and source: "its 245.00 MiB usable (250.00 MiB declared: ...)"."""
    source = a.source
    if a.buffer == "kv cap" or source is None:
        return f"the {human(a.limit)} allowed after the start that failed"
    if a.buffer == "kv tensor":
        return f"the device's {human(source.value)} limit per tensor ({_origin(source)})"
    if a.buffer == "kv buffer":
        words = f"the GPU's {human(source.value)} limit per allocation ({source.source}"
        return words + (f", less a {human(a.margin_bytes)} margin)" if a.margin_bytes else ")")
    if a.buffer == "device total":
        margin = _margin_words(a.margin_fraction)
        return f"its {human(a.limit)} usable ({human(source.value)} {_origin(source)}{margin})"
    margin = _host_margin(a)
    return f"its {human(a.limit)} usable ({human(source.value)} {_origin(source)}{', ' * bool(margin)}{margin})"


def host_attention_words(
    *, scores: bool, tensor_bytes: int, host_bytes: int, n_ubatch: int, device: str, limit: Sourced[int]
) -> str:
    """The note where a device's operations cannot take an attention tensor (plan.compute.HostAttention):
    "attention on the CPU: one layer's KQ scores (15.74 GiB at -ub 512) are above Vulkan0's 4.00 GiB limit per
    tensor (...), so llama.cpp runs the attention there; the host's compute buffer holds them and copies of
    the layer's K and V (23.61 GiB more)"."""
    what = "one layer's KQ scores" if scores else "the attention mask"
    held = "them and copies of the layer's K and V" if scores else "copies of one layer's K and V"
    return (
        f"attention on the CPU: {what} ({human(tensor_bytes)} at -ub {n_ubatch}) "
        f"{'are' if scores else 'is'} above {device}'s {human(limit.value)} limit per tensor ({_origin(limit)}), "
        f"so llama.cpp runs the attention there; the host's compute buffer holds {held} ({human(host_bytes)} more)"
    )


def _device(a: Allocation) -> str:
    return f"{a.place} ({a.endpoint})" if a.endpoint else a.place


def _items(counted: tuple[str, ...]) -> str:
    return ", ".join(item.replace("_", " ") for item in counted)


def _host_parts(a: Allocation, compute: str) -> str:
    """A host total's parts (memory.allocations' `counted`): process, weights when any, KV and compute, and
    under a cgroup what the server grows into when counted."""
    words = "process, " + ("weights, " if "weights" in a.counted else "") + f"KV, {compute}"
    return words + (", prompt cache and checkpoints" if "prompt_cache" in a.counted else "")


def _host_margin(a: Allocation) -> str:
    if a.host_kind == "address space":
        return f"less {human(a.margin_bytes)}" if a.margin_bytes >= 0 else f"plus {human(-a.margin_bytes)}"
    return _margin_words(a.margin_fraction).strip()


def _origin(value: Sourced[int]) -> str:
    return f"{value.source}: {value.detail}" if value.detail else value.source


def _margin_words(fraction: float) -> str:
    if fraction > 0:
        return f" less {fraction:.0%}"
    return f" plus {-fraction:.0%}" if fraction < 0 else ""
