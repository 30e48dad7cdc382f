"""The planning policy (configs/planner.toml, overridable by the user's config.toml). Loading only.

Owns reading and validating the policy; what the values mean is the planner's business.
Over 400 lines on purpose: each key of planner.toml has its field, its schema row and its reader line here.
"""

from __future__ import annotations

import math
import re
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
    graph_inputs_bytes: int
    host_inputs_bytes_per_embd: int  # beside a GPU, per token of the ubatch per n_embd, with flash attention
    host_inputs_bytes_per_embd_without_flash: int
    activation_bytes_per_attention: int = 0  # per element of one token's Q, K, V and attention output rows
    # a layer split over CPU devices (RPC workers under a CPU-only head): each device's own graph per token
    split_bytes_per_token: int = 0
    split_bytes_per_embd: int = 0
    split_bytes_per_ff: int = 0
    split_first_bytes_per_embd: int = 0  # ...and the first device's inputs from the host on top


@dataclass(frozen=True)
class Policy:
    """The planner's policy (configs/planner.toml, the user's config.toml over it): margins, overheads, the ladder."""

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
    keep_user_kv: bool = True  # a user's -fa off, -ctk, -ctv are constraints of the KV steps
    supervisor_bytes: int = 0  # under a cgroup: what safe-llama's supervisor grows by after it probed
    handed_supervisor_bytes: int = 0  # under a cgroup: what the handed supervisor is charged (a hand-off at the spawn)
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
    except FileNotFoundError:
        raise SafeLlamaError(f"safe-llama: {path}: no such file", ExitStatus.BAD_CONFIG) from None
    except (OSError, ValueError) as err:
        raise SafeLlamaError(f"safe-llama: {path}: {err}", ExitStatus.BAD_CONFIG) from None


# ------------------------------------------------------------------------------ what each key accepts
# Every key of configs/planner.toml, once: what it accepts (the check and the words of its error) and its
# default (REQUIRED: the file must hold it). A value is finite, in range and of its kind, or the file and key
# holding it are named with what is accepted: a NaN margin or a negative floor never reaches the planner.

CTX_MOST = 2**31 - 1  # llama.cpp reads -c into an int32
BYTES_MOST = 2**50  # 1 PiB: more than any device or host this plans for
PER_UNIT_MOST = 2**20  # bytes per token, cell, embedding or ff element
REQUIRED = object()


class Refused(ValueError):
    """A value a key does not accept: `accepted` says what it does; `sub` the table entry holding it."""

    def __init__(self, value: object, accepted: str, sub: str | None = None) -> None:
        super().__init__(accepted)
        self.value, self.accepted, self.sub = value, accepted, sub


Kind = Callable[[Any], Any]


def whole(least: int, most: int, unit: str = "") -> Kind:
    accepted = f"a whole number{unit} from {least:,} to {most:,}"

    def check(value: Any) -> int:
        if isinstance(value, bool) or not isinstance(value, int) or not least <= value <= most:
            raise Refused(value, accepted)
        return value

    return check


def real(least: float, most: float, *, open_low: bool = False, open_high: bool = False) -> Kind:
    low, to = ("more than", "and") if open_low else ("from", "to")
    accepted = f"a number {low} {least:g} {to} {'less than ' if open_high else ''}{most:g}"

    def check(value: Any) -> float:
        if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
            raise Refused(value, accepted)
        if value < least or value > most or (open_low and value == least) or (open_high and value == most):
            raise Refused(value, accepted)
        return float(value)

    return check


def flag(value: Any) -> bool:
    if not isinstance(value, bool):
        raise Refused(value, "true or false")
    return value


def names(value: Any) -> tuple[str, ...]:
    if not isinstance(value, list) or not all(isinstance(v, str) and v for v in value):
        raise Refused(value, "a list of names")
    return tuple(value)


def per_backend(kind: Kind, *, default: bool = True) -> Kind:
    """A table of backend = value, each value of `kind`; `default` for a backend without its own."""

    def check(table: Any) -> dict[str, Any]:
        if not isinstance(table, Mapping):
            raise Refused(table, "a table of backend = value")
        if default and "default" not in table:
            raise Refused(table, "a table with a default entry", "default")
        out = {}
        for backend, value in table.items():
            try:
                out[backend] = kind(value)
            except Refused as err:
                raise Refused(err.value, err.accepted, err.sub or backend) from None
        return out

    return check


def fields(kinds: Mapping[str, tuple[Kind, Any]]) -> Kind:
    """A table of known entries, each of its kind; REQUIRED ones must be there, the others take their default."""

    def check(table: Any) -> dict[str, Any]:
        if not isinstance(table, Mapping):
            raise Refused(table, f"a table of {', '.join(kinds)}")
        unknown = sorted(set(table) - set(kinds))
        if unknown:
            raise Refused(table[unknown[0]], f"one of the entries {', '.join(kinds)}", unknown[0])
        out = {}
        for name, (kind, default) in kinds.items():
            if name not in table and default is REQUIRED:
                raise Refused(None, "missing", name)
            try:
                out[name] = kind(table[name]) if name in table else default
            except Refused as err:
                raise Refused(err.value, err.accepted, name) from None
        return out

    return check


def _steps(value: Any) -> tuple[str, ...]:
    accepted = f"a list of steps, each one of {', '.join(STEPS)}"
    if not isinstance(value, list) or not all(isinstance(s, str) and s in STEPS for s in value):
        raise Refused(value, accepted)
    return tuple(value)


def _ladder(table: Any) -> dict[str, tuple[str, ...]]:
    """Per backend, optionally per tool ("openvino.server", written as a TOML sub-table)."""
    flat: dict[str, Any] = {}
    for key, value in per_backend(lambda v: v)(table).items():
        if isinstance(value, Mapping):
            flat.update({f"{key}.{tool}": steps for tool, steps in value.items()})
        else:
            flat[key] = value
    ladder: dict[str, tuple[str, ...]] = per_backend(_steps)(flat)
    return ladder


def _kv_rule(value: Any) -> str | dict[str, str]:
    accepted = '"never", "always" or { since = "X.Y.Z" }'
    if value in ("never", "always"):
        return str(value)
    if (
        isinstance(value, Mapping)
        and set(value) == {"since"}
        and isinstance(value["since"], str)
        and re.fullmatch(r"\d+(\.\d+)*(-[A-Za-z0-9.]+)?", value["since"])
    ):
        return dict(value)
    raise Refused(value, accepted)


def _share(value: Any) -> float:
    """A share strictly between 0 and 1 (read exactly, as written, by Policy.failed_alloc_share)."""
    return float(real(0, 1, open_low=True, open_high=True)(value))


BYTES = whole(0, BYTES_MOST, " of bytes")
PER_UNIT = whole(0, PER_UNIT_MOST, " of bytes")
COMPUTE = fields(
    {
        "kv_f16_copies": (names, REQUIRED),
        "activation_bytes_per_embd": (PER_UNIT, REQUIRED),
        "activation_bytes_per_ff": (PER_UNIT, REQUIRED),
        "graph_inputs_bytes": (BYTES, REQUIRED),
        "host_inputs_bytes_per_embd": (PER_UNIT, REQUIRED),
        "host_inputs_bytes_per_embd_without_flash": (PER_UNIT, REQUIRED),
        "activation_bytes_per_attention": (PER_UNIT, 0),
        "split_bytes_per_token": (PER_UNIT, 0),
        "split_bytes_per_embd": (PER_UNIT, 0),
        "split_bytes_per_ff": (PER_UNIT, 0),
        "split_first_bytes_per_embd": (PER_UNIT, 0),
    }
)

SCHEMA: dict[str, tuple[Kind, Any]] = {
    "ctx_floor": (whole(1, CTX_MOST, " of tokens"), REQUIRED),
    "skip_llama_fit": (flag, REQUIRED),
    "malloc_arena_max": (whole(0, 1024), 0),
    "process_bytes_per_vocab_token": (PER_UNIT, 0),
    "process_bytes_per_cell": (PER_UNIT, 0),
    "failed_alloc_share": (_share, REQUIRED),
    "cpu_repack_types": (names, ()),
    "address_space_bytes_per_vocab_token": (PER_UNIT, 0),
    "address_space_bytes_per_cell": (PER_UNIT, 0),
    "address_space_margin_bytes": (BYTES, 0),
    "address_space_server_loop_bytes": (BYTES, 0),
    "rpc_worker_overhead_bytes": (BYTES, 0),
    "pipeline_copies": (whole(1, 64), 1),
    "keep_user_ngl": (flag, False),
    "keep_user_kv": (flag, True),
    "request_bytes": (BYTES, 0),
    "request_bytes_per_cell": (PER_UNIT, 0),
    "prompt_cache_charge": (real(0, 16), 1.0),
    "supervisor_bytes": (BYTES, 0),
    "handed_supervisor_bytes": (BYTES, 0),
    "oom_after_ready_kv_share": (_share, 0.875),
    "max_alloc_margin_bytes": (per_backend(BYTES), REQUIRED),
    "memory_margin_fraction": (per_backend(real(0, 1, open_high=True)), REQUIRED),
    "process_overhead_bytes": (per_backend(BYTES), REQUIRED),
    "address_space_overhead_bytes": (per_backend(BYTES), REQUIRED),
    "kv_split": (per_backend(_kv_rule, default=False), REQUIRED),
    "device_runtime_bytes": (per_backend(BYTES), {}),
    "device_context_bytes": (per_backend(BYTES), {}),
    "ladder": (_ladder, REQUIRED),
    "quantized_kv": (fields({"openvino_q8": (flag, False)}), {"openvino_q8": False}),
    "compute": (COMPUTE, REQUIRED),
}


def load_policy(path: Path, user_config: Path | None = None, *, keep_in: Path | None = None) -> Policy:
    """The packaged planner settings with the user's [planner] table over them, each value checked against
    SCHEMA. A bad value is reported against the file and key that hold it: the user's config.toml when they
    set it, else the packaged file (or SAFE_LLAMA_CONFIGS's). keep_in: the cache folder that keeps the files'
    parsed form (state.load_toml)."""
    raw: dict[str, Any] = _read_toml(path, keep_in)
    user: Mapping[str, Any] = {}
    if user_config is not None and user_config.is_file():
        user = _read_toml(user_config, keep_in).get("planner", {})
        if not isinstance(user, Mapping):
            raise SafeLlamaError(f"safe-llama: {user_config}: [planner] must be a table", ExitStatus.BAD_CONFIG)
    for source, table, prefix in ((user_config, user, "[planner] "), (path, raw, "")):
        unknown = sorted(set(table) - set(SCHEMA))
        if unknown:
            raise SafeLlamaError(
                f"safe-llama: {source}: {prefix}{unknown[0]}: unknown key (known: {', '.join(sorted(SCHEMA))})",
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

    values: dict[str, Any] = {}
    for key, (kind, default) in SCHEMA.items():
        if key not in raw:
            if default is REQUIRED:
                raise SafeLlamaError(f"safe-llama: {where(key)}: missing", ExitStatus.BAD_CONFIG)
            values[key] = default
            continue
        try:
            values[key] = kind(raw[key])
        except Refused as err:
            said = err.accepted if err.value is None else f"{_shown(err.value)} is not {err.accepted}"
            raise SafeLlamaError(f"safe-llama: {where(key, err.sub)}: {said}", ExitStatus.BAD_CONFIG) from None
    compute = values["compute"]
    return Policy(
        ctx_floor=values["ctx_floor"],
        skip_llama_fit=values["skip_llama_fit"],
        max_alloc_margin=values["max_alloc_margin_bytes"],
        memory_margin_fraction=values["memory_margin_fraction"],
        process_overhead=values["process_overhead_bytes"],
        address_space_overhead=values["address_space_overhead_bytes"],
        address_space_per_vocab_token=values["address_space_bytes_per_vocab_token"],
        address_space_per_cell=values["address_space_bytes_per_cell"],
        address_space_margin=values["address_space_margin_bytes"],
        address_space_server_loop=values["address_space_server_loop_bytes"],
        kv_split=values["kv_split"],
        ladder=values["ladder"],
        malloc_arena_max=values["malloc_arena_max"],
        openvino_q8=values["quantized_kv"]["openvino_q8"],
        failed_alloc_share_value=values["failed_alloc_share"],
        kv_f16_copy_backends=compute["kv_f16_copies"],
        compute=ComputeCosts(**{key: value for key, value in compute.items() if key != "kv_f16_copies"}),
        process_per_vocab_token=values["process_bytes_per_vocab_token"],
        process_per_cell=values["process_bytes_per_cell"],
        cpu_repack_types=frozenset(t.lower() for t in values["cpu_repack_types"]),
        rpc_worker_overhead=values["rpc_worker_overhead_bytes"],
        pipeline_copies=values["pipeline_copies"],
        device_runtime=values["device_runtime_bytes"],
        device_context=values["device_context_bytes"],
        keep_user_ngl=values["keep_user_ngl"],
        keep_user_kv=values["keep_user_kv"],
        supervisor_bytes=values["supervisor_bytes"],
        handed_supervisor_bytes=values["handed_supervisor_bytes"],
        request_bytes=values["request_bytes"],
        request_bytes_per_cell=values["request_bytes_per_cell"],
        prompt_cache_charge=values["prompt_cache_charge"],
        oom_after_ready_kv_share=values["oom_after_ready_kv_share"],
    )


def _shown(value: object) -> str:
    """A refused value as TOML writes it, short and on one line (a table is named by its kind)."""
    if isinstance(value, Mapping):
        return "a table"
    if isinstance(value, bool):
        text = "true" if value else "false"
    elif isinstance(value, str):
        text = '"' + value.replace("\\", "\\\\").replace('"', '\\"') + '"'
    elif isinstance(value, list):
        text = "[" + ", ".join(_shown(v) for v in value) + "]"
    else:
        text = str(value)
    text = "".join(c if c.isprintable() else f"\\x{ord(c):02x}" for c in text)  # no terminal escapes
    return text if len(text) <= 40 else f"{text[:37]}..."
