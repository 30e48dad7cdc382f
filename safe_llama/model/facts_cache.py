"""Model facts cached by file identity, so a launch reads a small JSON instead of the GGUF header.

Owns the cache location, key and format (facts_to_json / facts_from_json); the reading itself is
model.facts' job.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from safe_llama import state
from safe_llama.errors import ExitStatus
from safe_llama.model.facts import FACTS_SCHEMA, LayerKV, ModelFacts
from safe_llama.paths import cache_dir

if TYPE_CHECKING:  # a sparse-attention model's memory: imported where one is read back
    from safe_llama.model.sparse import SparseMemory

FORMAT = 2  # 2: {"key": the file's identity, "facts"} under state.cache_name


def facts_for(path: str | os.PathLike[str], env: Mapping[str, str]) -> ModelFacts:
    model = Path(path)
    try:
        key = state.file_key(model)
    except OSError as err:
        from safe_llama.messages import MODEL_PROBLEM  # the templates, where one is said

        problem = "model file not found" if isinstance(err, FileNotFoundError) else err.strerror
        raise MODEL_PROBLEM.error(ExitStatus.BAD_MODEL, path=model, problem=problem) from None
    where = cache_dir(env) / "facts" / f"{state.cache_name(f'{FORMAT}|{key}')}.json"
    cached = state.read_json(where)
    if isinstance(cached, dict) and cached.get("key") == key:
        try:
            facts = facts_from_json(cached["facts"])
            if str(facts.path) == str(model):
                return facts
        except (KeyError, TypeError, ValueError):
            pass
    from safe_llama.model.header_facts import load_model_facts  # a miss alone reads the header

    facts = load_model_facts(model)
    with contextlib.suppress(OSError):  # a read-only cache only costs speed
        state.write_json(where, {"key": key, "facts": facts_to_json(facts)})
    return facts


def facts_to_json(facts: ModelFacts) -> dict[str, Any]:
    """A JSON-ready dict (lists, not tuples) that facts_from_json turns back into the same facts."""
    return {
        "schema": FACTS_SCHEMA,
        "path": facts.path,
        "file_size": facts.file_size,
        "architecture": facts.architecture,
        "name": facts.name,
        "known_architecture": facts.known_architecture,
        "block_count": facts.block_count,
        "nextn_predict_layers": facts.nextn_predict_layers,
        "embedding_length": facts.embedding_length,
        "context_length": facts.context_length,
        "feed_forward_length": facts.feed_forward_length,
        "vocab_size": facts.vocab_size,
        "head_count": list(facts.head_count),
        "head_count_kv": list(facts.head_count_kv),
        "key_length": list(facts.key_length),
        "value_length": list(facts.value_length),
        "layers": [
            {
                "has_kv": layer.has_kv,
                "swa": layer.swa,
                "recurrent": layer.recurrent,
                "n_embd_k_gqa": layer.n_embd_k_gqa,
                "n_embd_v_gqa": layer.n_embd_v_gqa,
                "n_embd_r": layer.n_embd_r,
                "n_embd_s": layer.n_embd_s,
                "n_embd_k_idx": layer.n_embd_k_idx,
            }
            for layer in facts.layers
        ],
        "sliding_window": facts.sliding_window,
        "swa_type": facts.swa_type,
        "is_mla": facts.is_mla,
        "is_recurrent": facts.is_recurrent,
        "is_hybrid": facts.is_hybrid,
        "n_layer_kv_from_start": facts.n_layer_kv_from_start,
        "weight_bytes_per_layer": list(facts.weight_bytes_per_layer),
        "other_weight_bytes": facts.other_weight_bytes,
        "notes": list(facts.notes),
        "tensors": [[name, size] for name, size in facts.tensors],
        "tensor_types": list(facts.tensor_types),
        "sparse": None if facts.sparse is None else _sparse_to_json(facts.sparse),
    }


_SPARSE_INTS = ("idx_v_max", "state_head_k", "indexer_head", "n_layer")
_SPARSE_ROWS = ("idx_k", "idx_v", "compress", "ple_rows")
_SPARSE_KINDS = ("dsv4", "dsa_iswa", "msa", "hybrid_idx")


def _sparse_to_json(sparse: SparseMemory) -> dict[str, Any]:
    out: dict[str, Any] = {"kind": sparse.kind}
    out.update({key: getattr(sparse, key) for key in _SPARSE_INTS})
    out.update({key: list(getattr(sparse, key)) for key in _SPARSE_ROWS})
    return out


def _sparse_from_json(d: Any) -> SparseMemory | None:
    if d is None:
        return None
    if not isinstance(d, dict) or set(d) != {"kind", *_SPARSE_INTS, *_SPARSE_ROWS}:
        raise ValueError(f"cached model facts: bad sparse memory {d!r}")
    from safe_llama.model.sparse import SparseMemory

    return SparseMemory(
        kind=_field(d, "kind", lambda v: v in _SPARSE_KINDS),
        idx_k=_ints(d, "idx_k"),
        idx_v=_ints(d, "idx_v"),
        idx_v_max=_field(d, "idx_v_max", _is_int),
        compress=_ints(d, "compress"),
        state_head_k=_field(d, "state_head_k", _is_int),
        indexer_head=_field(d, "indexer_head", _is_int),
        n_layer=_field(d, "n_layer", _is_int),
        ple_rows=_ints(d, "ple_rows"),
    )


def _field(d: Mapping[str, Any], key: str, check: Callable[[Any], bool]) -> Any:
    value = d.get(key)
    if not check(value):
        raise ValueError(f"cached model facts: bad {key!r}: {value!r}")
    return value


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _ints(d: Mapping[str, Any], key: str) -> tuple[int, ...]:
    value = _field(d, key, lambda v: isinstance(v, list) and all(_is_int(x) for x in v))
    return tuple(value)


def facts_from_json(d: Mapping[str, Any]) -> ModelFacts:
    """The inverse of facts_to_json; ValueError for anything else (a stale or damaged cache entry)."""
    _field(d, "schema", lambda v: v == FACTS_SCHEMA)
    layer_keys = ("has_kv", "swa", "recurrent", "n_embd_k_gqa", "n_embd_v_gqa", "n_embd_r", "n_embd_s", "n_embd_k_idx")
    raw_layers = _field(d, "layers", lambda v: isinstance(v, list))
    layers = []
    for raw in raw_layers:
        if not isinstance(raw, dict) or set(raw) != set(layer_keys):
            raise ValueError(f"cached model facts: bad layer {raw!r}")
        for key in layer_keys[:3]:
            _field(raw, key, lambda v: isinstance(v, bool))
        for key in layer_keys[3:]:
            _field(raw, key, _is_int)
        layers.append(LayerKV(**raw))
    swa_types = ("none", "standard", "chunked", "symmetric")
    is_bool: Callable[[Any], bool] = lambda v: isinstance(v, bool)  # noqa: E731
    return ModelFacts(
        path=_field(d, "path", lambda v: isinstance(v, str)),
        file_size=_field(d, "file_size", _is_int),
        architecture=_field(d, "architecture", lambda v: isinstance(v, str)),
        name=_field(d, "name", lambda v: v is None or isinstance(v, str)),
        known_architecture=_field(d, "known_architecture", is_bool),
        block_count=_field(d, "block_count", _is_int),
        nextn_predict_layers=_field(d, "nextn_predict_layers", _is_int),
        embedding_length=_field(d, "embedding_length", _is_int),
        context_length=_field(d, "context_length", _is_int),
        feed_forward_length=_field(d, "feed_forward_length", _is_int),
        vocab_size=_field(d, "vocab_size", _is_int),
        head_count=_ints(d, "head_count"),
        head_count_kv=_ints(d, "head_count_kv"),
        key_length=_ints(d, "key_length"),
        value_length=_ints(d, "value_length"),
        layers=tuple(layers),
        sliding_window=_field(d, "sliding_window", _is_int),
        swa_type=_field(d, "swa_type", lambda v: v in swa_types),
        is_mla=_field(d, "is_mla", is_bool),
        is_recurrent=_field(d, "is_recurrent", is_bool),
        is_hybrid=_field(d, "is_hybrid", is_bool),
        n_layer_kv_from_start=_field(d, "n_layer_kv_from_start", _is_int),
        weight_bytes_per_layer=_ints(d, "weight_bytes_per_layer"),
        other_weight_bytes=_field(d, "other_weight_bytes", _is_int),
        notes=tuple(_field(d, "notes", lambda v: isinstance(v, list) and all(isinstance(x, str) for x in v))),
        tensors=tuple(
            (name, size)
            for name, size in _field(
                d,
                "tensors",
                lambda v: (
                    isinstance(v, list)
                    and all(isinstance(t, list) and len(t) == 2 and isinstance(t[0], str) and _is_int(t[1]) for t in v)
                ),
            )
        ),
        tensor_types=tuple(
            _field(d, "tensor_types", lambda v: isinstance(v, list) and all(isinstance(x, str) for x in v))
        ),
        sparse=_sparse_from_json(d.get("sparse")),
    )
