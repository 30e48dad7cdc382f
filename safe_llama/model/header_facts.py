"""ModelFacts assembled from one GGUF header: the architecture's rule (model.arch) applied by model.hparams,
layer by layer, and the refusal of a model that cannot work (no width, no heads or KV heads, a head dimension
of 0, a NaN).

Owns that assembly; must not read files except through load_model_facts, nor do KV arithmetic over context
sizes (model.kv and the planner do). Imported only where a header is read (a facts cache miss, a remote header).
"""

from __future__ import annotations

import math
import os

from safe_llama.model.arch import ARCHITECTURES, LLAMA_MAX_LAYERS, UNMODELLED, SwaType
from safe_llama.model.facts import LayerKV, ModelFacts
from safe_llama.model.gguf_constants import constants
from safe_llama.model.gguf_header import (
    GGUFHeader,
    printable,
    read_header,
)
from safe_llama.model.hparams import (
    Meta,
    attending_layers,
    block_index,
    generic_rule,
    indexed_layers,
    read_vocab_size,
    recurrent_layers,
    state_rows,
    swa_pattern,
)
from safe_llama.model.sparse import read_sparse


def load_model_facts(path: str | os.PathLike[str]) -> ModelFacts:
    return model_facts(read_header(path))


def model_facts(header: GGUFHeader) -> ModelFacts:
    """Everything the KV arithmetic needs, derived from a header by llama.cpp's rules."""
    m = Meta(header)
    notes: list[str] = []
    arch = m.string("general.architecture")
    if arch is None:
        m.missing("general.architecture")
    m.arch = arch
    _refuse_non_finite(m)
    name = m.string("general.name")
    shown = printable(arch, 60)

    rule = ARCHITECTURES.get(arch)
    known = rule is not None
    unmodelled = UNMODELLED.get(arch)
    if unmodelled is not None:
        rule = unmodelled.rule
        error = {
            "over": "an over-estimate (never under)",
            "under": "an under-estimate (never over)",
            "unknown": "of unknown direction",
        }
        notes.append(
            f"architecture '{shown}' is not modelled exactly ({unmodelled.reason}): "
            f"its KV estimate is {error[unmodelled.direction]}"
        )
    elif rule is None:
        rule = generic_rule(m)
        notes.append(f"unknown architecture '{shown}': generic rules used")
        if rule.memory != "kv":
            notes.append(f"recurrent state assumed from the {rule.state} keys")

    n_layer_all = m.uint(m.k("block_count"))
    if not 0 < n_layer_all <= LLAMA_MAX_LAYERS:
        m.fail(f"key {printable(m.k('block_count'))} is {n_layer_all}, expected 1 to {LLAMA_MAX_LAYERS}")
    n_embd = m.uint(m.k("embedding_length"))
    if n_embd == 0:
        m.fail(f"key {printable(m.k('embedding_length'))} is 0, expected 1 or more")
    n_ctx_train = m.uint(m.k("context_length"))
    nextn = m.uint(m.k("nextn_predict_layers"), default=0)
    if nextn > n_layer_all:
        m.fail(f"key {printable(m.k('nextn_predict_layers'))} is {nextn}, more than the {n_layer_all} layers")
    if rule.sparse == "dsv4" and nextn:
        # src/models/deepseek4.cpp: without the MTP block's weights the nextn layers are trunk layers
        probe = f"blk.{n_layer_all - nextn}.nextn.eh_proj.weight"
        if not any(t.name == probe for t in header.tensors):
            nextn = 0
    n_layer = n_layer_all - nextn

    no_heads = (0,) * n_layer_all if rule.memory == "recurrent" else None
    head_count = m.per_layer(m.k("attention.head_count"), n_layer_all, no_heads)
    head_count_kv = m.per_layer(m.k("attention.head_count_kv"), n_layer_all, head_count)
    if head_count[0] > 0:
        k_full = m.uint(m.k("attention.key_length"), default=n_embd // head_count[0])
        v_full = m.uint(m.k("attention.value_length"), default=n_embd // head_count[0])
    else:
        k_full = v_full = 0
    swa = rule.swa
    need_swa_dims = swa is not None and swa.head_dims_required
    k_swa = m.uint(m.k("attention.key_length_swa"), default=None if need_swa_dims else k_full)
    v_swa = m.uint(m.k("attention.value_length_swa"), default=None if need_swa_dims else v_full)

    n_ff = m.per_layer(m.k("feed_forward_length"), n_layer_all, (0,) * n_layer_all)
    recurrent = recurrent_layers(m, rule, head_count_kv, n_ff, n_layer_all, n_layer)
    attends = attending_layers(rule, recurrent, n_ff, n_layer)

    swa_type: SwaType = "none"
    window = 0
    is_swa = [False] * n_layer_all
    if swa is not None:
        window_key = m.optional_uint(m.k("attention.sliding_window"))
        active = {
            "always": True,
            "window_positive": window_key is not None and window_key > 0,
            "window_not_zero": window_key != 0,
            "64_layers": n_layer == 64,
        }[swa.when]
        if active:
            swa_type = swa.swa_type
            if swa.forced_window is not None:
                window = swa.forced_window
            elif window_key is not None:
                window = window_key
            elif swa.default_window is not None:
                window = swa.default_window
            else:
                m.missing(m.k("attention.sliding_window"))
            if rule.sparse == "dsv4":
                # set_swa_pattern(0), then the MTP layers too: every layer slides
                is_swa = [True] * n_layer_all
            elif swa.attention_layers:
                is_swa = [il < n_layer and not recurrent[il] for il in range(n_layer_all)]
            else:
                is_swa = swa_pattern(m, swa, n_layer_all, n_layer)
            if not any(is_swa):
                notes.append("a sliding window is set but no layer uses it: llama.cpp will abort")

    # llama_kv_cache_dsv4 caches K only (dsv4_make_k_only)
    is_mla = rule.sparse == "dsv4"
    if rule.mla:
        k_mla = m.optional_uint(m.k("attention.key_length_mla"))
        v_mla = m.optional_uint(m.k("attention.value_length_mla"))
        is_mla = bool(k_mla) and bool(v_mla)

    kv_from_start = -1
    if rule.kv_from_start == "gemma3n":
        kv_from_start = 20  # hard-coded in src/models/gemma3n.cpp
    elif rule.kv_from_start == "gemma4":
        shared = m.uint(m.k("attention.shared_kv_layers"), default=0)
        kv_from_start = max(n_layer_all - shared, -1)

    # the default path leaves MTP layers out of the main context's cache (create_memory)
    # (llama_kv_cache_dsv4 and _msa are given no filter: their caches keep the MTP layers)
    drops_nextn = rule.memory == "kv" and nextn > 0 and n_layer > 0 and rule.sparse not in ("dsv4", "msa")
    state_r, state_s = state_rows(m, rule, n_embd, head_count[0], k_full) if any(recurrent) else (0, 0)
    indexed = indexed_layers(m, rule, n_layer_all, n_layer, n_ctx_train)
    k_idx = m.uint(m.k("attention.indexer.key_length")) if any(indexed) else 0
    has_memory = rule.memory in ("kv", "hybrid")
    if rule.sparse in ("hybrid_idx", "hybrid_qsa"):
        # create_memory's filter_attn: the MTP block is never attended by the trunk graph
        attends = [attends[il] and il < n_layer for il in range(n_layer_all)]

    key_length = tuple(k_swa if is_swa[il] else k_full for il in range(n_layer_all))
    value_length = tuple(v_swa if is_swa[il] else v_full for il in range(n_layer_all))
    sparse = read_sparse(
        m,
        rule,
        n_layer_all=n_layer_all,
        n_layer=n_layer,
        n_embd=n_embd,
        head_k=key_length,
        head_v=value_length,
        attends=attends,
        recurrent=recurrent,
    )
    if sparse is not None and sparse.kind != "dsa_iswa":
        k_idx_of = sparse.idx_k
    else:
        # the DSA indexer shares the main cache's hparams but one head of indexer_head_size;
        # SWA layers keep their own head dim (llama_kv_cache_dsa's hparams_lid)
        k_idx_of = tuple((k_swa if is_swa[il] else k_idx) if indexed[il] else 0 for il in range(n_layer_all))
    layers = tuple(
        LayerKV(
            has_kv=has_memory
            and attends[il]
            and (kv_from_start < 0 or il < kv_from_start)
            and not (drops_nextn and il >= n_layer),
            swa=is_swa[il],
            recurrent=recurrent[il],
            n_embd_k_gqa=key_length[il] * head_count_kv[il],
            n_embd_v_gqa=0 if is_mla else value_length[il] * head_count_kv[il],
            n_embd_r=state_r if recurrent[il] else 0,
            n_embd_s=state_s if recurrent[il] else 0,
            n_embd_k_idx=k_idx_of[il],
        )
        for il in range(n_layer_all)
    )
    _refuse_headless(m, rule.memory, head_count, head_count_kv, layers, is_swa, is_mla)
    if rule.loops:
        # each pass over the stack is a logical layer with its own KV (nanbeige load_arch_hparams)
        n_loops = m.uint(m.k("num_loops"), default=1)
        if not (n_loops >= 1 and n_layer_all * n_loops <= LLAMA_MAX_LAYERS):
            m.fail(f"key {printable(m.k('num_loops'))} is {n_loops}: {n_layer_all} layers x loops must be 1 to 512")
        layers *= n_loops

    layer_bytes = [0] * n_layer_all
    other_bytes = 0
    for tensor in header.tensors:
        il = block_index(tensor.name)
        if il is not None and il < n_layer_all:
            layer_bytes[il] += tensor.n_bytes
        else:
            other_bytes += tensor.n_bytes
    vocab_size = read_vocab_size(m, header)
    notes.extend(m.notes)
    split_count = m.metadata.get("split.count")
    if isinstance(split_count, int) and split_count > 1:
        notes.append(f"the model is split into {split_count} files: weights counted for this file only")

    return ModelFacts(
        path=header.path,
        file_size=header.file_size,
        architecture=arch,
        name=name,
        known_architecture=known,
        block_count=n_layer_all,
        nextn_predict_layers=nextn,
        embedding_length=n_embd,
        context_length=n_ctx_train,
        feed_forward_length=max(n_ff),
        vocab_size=vocab_size,
        head_count=head_count,
        head_count_kv=head_count_kv,
        key_length=key_length,
        value_length=value_length,
        layers=layers,
        sliding_window=window,
        swa_type=swa_type,
        is_mla=is_mla,
        is_recurrent=rule.memory == "recurrent",
        is_hybrid=rule.memory == "hybrid",
        n_layer_kv_from_start=kv_from_start,
        weight_bytes_per_layer=tuple(layer_bytes),
        other_weight_bytes=other_bytes,
        notes=tuple(notes),
        tensors=tuple((t.name, t.n_bytes) for t in header.tensors),
        tensor_types=tuple(_type_name(t.ggml_type) for t in header.tensors),
        sparse=sparse,
    )


def _refuse_non_finite(m: Meta) -> None:
    """A NaN among the architecture's keys, or an infinite rope base, rope scale or norm epsilon: llama.cpp
    loads it and computes garbage or dies, so the model cannot work. (An infinite bound elsewhere can be
    meant: afmoe's kda.gate_lower_bound is -inf.)"""
    prefix = m.k("")
    for key, value in m.metadata.items():
        if not key.startswith(prefix):
            continue
        must_be_finite = ".rope." in key[len(prefix) - 1 :] or "epsilon" in key
        for item in value if isinstance(value, tuple) else (value,):
            if isinstance(item, float) and (math.isnan(item) or (must_be_finite and math.isinf(item))):
                m.fail(f"key {printable(key)} is {item}, expected a finite number")


def _refuse_headless(
    m: Meta,
    memory: str,
    head_count: tuple[int, ...],
    head_count_kv: tuple[int, ...],
    layers: tuple[LayerKV, ...],
    is_swa: list[bool],
    is_mla: bool,
) -> None:
    """An attention model without heads or KV heads, or a layer whose KV heads have a dimension of 0: llama.cpp
    divides by them (and dies with no error line) or builds a 0-byte cache. One layer may lack heads or KV
    heads (deci's attention-free and linear-attention layers; the recurrent layers of hybrids)."""
    attending = [il for il, layer in enumerate(layers) if layer.has_kv and not layer.recurrent]
    if memory == "kv" and attending:
        for key, counts in (("attention.head_count", head_count), ("attention.head_count_kv", head_count_kv)):
            if not any(counts[il] for il in attending):
                m.fail(f"key {printable(m.k(key))} is 0 in every layer, expected 1 or more")
    for il in attending:
        if head_count[il] == 0 or head_count_kv[il] == 0:
            continue
        swa = "_swa" if is_swa[il] and m.k("attention.key_length_swa") in m.metadata else ""
        for part, width in (("key", layers[il].n_embd_k_gqa), ("value", layers[il].n_embd_v_gqa)):
            if width == 0 and not (part == "value" and is_mla):
                key = m.k(f"attention.{part}_length{swa}")
                given = "" if key in m.metadata else " (absent: embedding_length / head_count)"
                m.fail(f"key {printable(key)}{given} is 0 for layer {il}, expected 1 or more")


def _type_name(ggml_type: int) -> str:

    try:
        return str(constants().GGMLQuantizationType(ggml_type).name).lower()
    except ValueError:
        return f"type{ggml_type}"
