"""The planning policy (configs/planner.toml, overridable by the user's config.toml). Loading only.

Owns reading and validating the policy; what the values mean is the planner's business.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from safe_llama import state
from safe_llama.errors import ExitStatus, SafeLlamaError

if TYPE_CHECKING:
    from fractions import Fraction

STEPS = ("stateful", "weights", "kv-q8", "kv-q4", "ctx", "ngl")


@dataclass(frozen=True)
class ComputeCosts:
    """[compute]: the compute-buffer estimate's calibration (planner.compute_estimate)."""

    activation_bytes_per_embd: int
    activation_bytes_per_ff: int
    host_inputs_bytes: int
    activation_bytes_per_attention: int = 0  # per element of one token's Q, K, V and attention output rows
    # a layer split over CPU devices (RPC workers under a CPU-only head): each device's own graph per token
    split_bytes_per_token: int = 0
    split_bytes_per_embd: int = 0
    split_bytes_per_ff: int = 0
    split_first_bytes_per_embd: int = 0  # ...and the first device's inputs from the host on top


@dataclass(frozen=True)
class Policy:
    ctx_floor: int
    skip_llama_fit: bool
    max_alloc_margin: Mapping[str, int]
    memory_margin_fraction: Mapping[str, float]
    process_overhead: Mapping[str, int]
    address_space_overhead: Mapping[str, int]
    address_space_per_vocab_token: int
    address_space_per_cell: int
    address_space_margin: int
    address_space_server_loop: int
    kv_split: Mapping[str, Any]
    ladder: Mapping[str, tuple[str, ...]]
    malloc_arena_max: int
    openvino_q8: bool
    failed_alloc_share_value: float  # failed_alloc_share as written in the TOML
    kv_f16_copy_backends: tuple[str, ...]  # [compute] kv_f16_copies
    compute: ComputeCosts
    process_per_vocab_token: int = 0
    process_per_cell: int = 0
    cpu_repack_types: frozenset[str] = frozenset()
    rpc_worker_overhead: int = 0  # what an rpc-server keeps resident beside the buffers it holds
    pipeline_copies: int = 1  # the graph inputs' copies when llama.cpp pipelines layers over several devices
    # what a GPU backend's runtime holds on the device once a process starts (CUDA's context): the free figure
    # read before the start is reduced by it
    device_runtime: Mapping[str, int] = field(default_factory=dict)
    device_context: Mapping[str, int] = field(default_factory=dict)  # the part a listing's free figure lacks
    keep_user_ngl: bool = False  # a user's -ngl is kept exactly (no "weights" or "ngl" step lowers it)
    supervisor_bytes: int = 0  # under a cgroup: what safe-llama's supervisor grows by after it probed
    request_bytes: int = 0  # under a cgroup: what a request filling the context adds to llama-server's process
    request_bytes_per_cell: int = 0  # ... and per context cell
    prompt_cache_charge: float = 1.0  # what a cgroup is charged per byte of llama-server's --cache-ram
    oom_after_ready_kv_share: float = 0.875  # the KV share remembered after an OOM kill of a ready server

    @property
    def failed_alloc_share(self) -> Fraction:
        """explain: a remedy's share of the failed allocation when no limit is known, exact (0.75 is 3/4).
        fractions is imported here, not on every launch (it pulls in decimal: 5 ms)."""
        import fractions

        return fractions.Fraction(str(self.failed_alloc_share_value))

    def per_backend(self, table: Mapping[str, Any], backend: str) -> Any:
        return table.get(backend, table.get("default"))

    def address_space_fixed(self, backend: str, tool: str) -> int:
        """The fixed part of the address space a llama.cpp process maps beside its buffers; llama-server's
        also holds its task loop's thread, made after `model loaded` (short of it, it aborts unserved)."""
        fixed = int(self.per_backend(self.address_space_overhead, backend))
        return fixed + (self.address_space_server_loop if tool == "server" else 0)

    def ladder_for(self, backend: str, tool: str) -> tuple[str, ...]:
        for key in (f"{backend}.{tool}", backend, "default"):
            if key in self.ladder:
                return self.ladder[key]
        return ()


def _merge(base: dict[str, Any], over: Mapping[str, Any]) -> dict[str, Any]:
    out = dict(base)
    for key, value in over.items():
        out[key] = _merge(out[key], value) if isinstance(value, dict) and isinstance(out.get(key), dict) else value
    return out


def _read_toml(path: Path, keep_in: Path | None) -> dict[str, Any]:
    try:
        return state.load_toml(path, keep_in)
    except (OSError, ValueError) as err:
        raise SafeLlamaError(f"safe-llama: {path}: {err}", ExitStatus.BAD_CONFIG) from None


def _share(value: Any) -> float:
    """A share strictly between 0 and 1 (read exactly, as written, by Policy.failed_alloc_share)."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise TypeError("a number between 0 and 1")
    if not 0 < value < 1:
        raise ValueError(f"{value} is not between 0 and 1")
    return float(value)


def load_policy(path: Path, user_config: Path | None = None, *, keep_in: Path | None = None) -> Policy:
    """The packaged planner settings with the user's [planner] table over them. A bad value is reported
    against the file and key that hold it: the user's config.toml when they set it, else the packaged file.
    keep_in: the cache folder that keeps the files' parsed form (state.load_toml)."""
    raw: dict[str, Any] = _read_toml(path, keep_in)
    user: Mapping[str, Any] = {}
    if user_config is not None and user_config.is_file():
        user = _read_toml(user_config, keep_in).get("planner", {})
        if not isinstance(user, Mapping):
            raise SafeLlamaError(f"safe-llama: {user_config}: [planner] must be a table", ExitStatus.BAD_CONFIG)
        unknown = sorted(set(user) - set(raw))
        if unknown:
            raise SafeLlamaError(
                f"safe-llama: {user_config}: [planner] {unknown[0]}: unknown key (known: {', '.join(sorted(raw))})",
                ExitStatus.BAD_CONFIG,
            )
        raw = _merge(raw, user)

    def where(key: str, sub: str | None = None) -> str:
        mine = user.get(key)
        if (
            user_config is not None
            and mine is not None
            and (sub is None or not isinstance(mine, Mapping) or sub.split(".")[0] in mine)
        ):
            return f"{user_config}: [planner] {key}{'.' + sub if sub else ''}"
        return f"{path}: {key}{'.' + sub if sub else ''}"

    def setting(key: str, convert: Callable[[Any], Any], default: Any = None) -> Any:
        try:
            value = raw[key] if default is None else raw.get(key, default)
            return convert(value)
        except KeyError:
            raise SafeLlamaError(f"safe-llama: {where(key)}: missing", ExitStatus.BAD_CONFIG) from None
        except (TypeError, ValueError, AttributeError) as err:
            raise SafeLlamaError(f"safe-llama: {where(key)}: invalid value ({err})", ExitStatus.BAD_CONFIG) from None

    def ladder_of(table: Any) -> dict[str, tuple[str, ...]]:
        ladder = {}
        for key, value in table.items():
            if isinstance(value, dict):  # "openvino.server" written as a TOML sub-table
                for sub, steps in value.items():
                    ladder[f"{key}.{sub}"] = tuple(steps)
            else:
                ladder[key] = tuple(value)
        return ladder

    ladder = setting("ladder", ladder_of)
    for key, steps in ladder.items():
        bad = [s for s in steps if s not in STEPS]
        if bad:
            raise SafeLlamaError(
                f"safe-llama: {where('ladder', key)}: unknown step {bad[0]!r} (one of {', '.join(STEPS)})",
                ExitStatus.BAD_CONFIG,
            )
    return Policy(
        ctx_floor=setting("ctx_floor", int),
        skip_llama_fit=setting("skip_llama_fit", bool),
        max_alloc_margin=setting("max_alloc_margin_bytes", lambda t: {k: int(v) for k, v in t.items()}),
        memory_margin_fraction=setting("memory_margin_fraction", lambda t: {k: float(v) for k, v in t.items()}),
        process_overhead=setting("process_overhead_bytes", lambda t: {k: int(v) for k, v in t.items()}),
        address_space_overhead=setting("address_space_overhead_bytes", lambda t: {k: int(v) for k, v in t.items()}),
        address_space_per_vocab_token=setting("address_space_bytes_per_vocab_token", int, 0),
        address_space_per_cell=setting("address_space_bytes_per_cell", int, 0),
        address_space_margin=setting("address_space_margin_bytes", int, 0),
        address_space_server_loop=setting("address_space_server_loop_bytes", int, 0),
        kv_split=setting("kv_split", dict),
        ladder=ladder,
        malloc_arena_max=setting("malloc_arena_max", int, 0),
        openvino_q8=setting("quantized_kv", lambda t: bool(t.get("openvino_q8", False)), {}),
        failed_alloc_share_value=setting("failed_alloc_share", _share),
        kv_f16_copy_backends=setting("compute", lambda t: tuple(str(b) for b in t["kv_f16_copies"])),
        compute=setting(
            "compute",
            lambda t: ComputeCosts(
                int(t["activation_bytes_per_embd"]),
                int(t["activation_bytes_per_ff"]),
                int(t["host_inputs_bytes"]),
                activation_bytes_per_attention=int(t.get("activation_bytes_per_attention", 0)),
                split_bytes_per_token=int(t.get("split_bytes_per_token", 0)),
                split_bytes_per_embd=int(t.get("split_bytes_per_embd", 0)),
                split_bytes_per_ff=int(t.get("split_bytes_per_ff", 0)),
                split_first_bytes_per_embd=int(t.get("split_first_bytes_per_embd", 0)),
            ),
        ),
        process_per_vocab_token=setting("process_bytes_per_vocab_token", int, 0),
        process_per_cell=setting("process_bytes_per_cell", int, 0),
        cpu_repack_types=setting("cpu_repack_types", lambda t: frozenset(str(x).lower() for x in t), []),
        rpc_worker_overhead=setting("rpc_worker_overhead_bytes", int, 0),
        pipeline_copies=setting("pipeline_copies", int, 1),
        device_runtime=setting("device_runtime_bytes", lambda t: {k: int(v) for k, v in t.items()}, {}),
        device_context=setting("device_context_bytes", lambda t: {k: int(v) for k, v in t.items()}, {}),
        keep_user_ngl=setting("keep_user_ngl", bool, False),
        supervisor_bytes=setting("supervisor_bytes", int, 0),
        request_bytes=setting("request_bytes", int, 0),
        request_bytes_per_cell=setting("request_bytes_per_cell", int, 0),
        prompt_cache_charge=setting("prompt_cache_charge", float, 1.0),
        oom_after_ready_kv_share=setting("oom_after_ready_kv_share", _share, 0.875),
    )
