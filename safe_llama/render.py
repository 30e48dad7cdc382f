"""Results as JSON-ready dicts and as text for people, from the same values. Pure."""

from __future__ import annotations

from typing import Any

from safe_llama.kv import KvPlan, mib_line
from safe_llama.model_facts import ModelFacts
from safe_llama.units import human


def plan_result(*, tool: str, model_path: str, facts: ModelFacts, kv: KvPlan, bundled: bool) -> dict[str, Any]:
    ctx = kv.context
    return {
        "tool": tool,
        "model": {
            "path": model_path,
            "bundled": bundled,
            "architecture": facts.architecture,
            "known_architecture": facts.known_architecture,
            "block_count": facts.block_count,
            "context_length": facts.context_length,
            "weight_bytes": facts.total_weight_bytes,
        },
        "kv": {
            "n_ctx": ctx.n_ctx,
            "n_ctx_seq": ctx.n_ctx_seq,
            "n_seq_max": ctx.n_seq_max,
            "n_stream": ctx.n_stream,
            "unified": ctx.unified,
            "n_ubatch": ctx.n_ubatch,
            "flash_attn": kv.flash_attn,
            "total_bytes": kv.total_bytes,
            "caches": [
                {
                    "kind": c.kind,
                    "cells": c.cells,
                    "layers": c.layers,
                    "type_k": c.type_k,
                    "type_v": c.type_v,
                    "k_bytes": c.k_bytes,
                    "v_bytes": c.v_bytes,
                    "log_mib": dict(zip(("total", "k", "v"), mib_line(c), strict=True)),
                }
                for c in kv.caches
            ],
        },
        "notes": list(facts.notes) + list(kv.notes),
    }


def plan_text(result: dict[str, Any]) -> str:
    model = result["model"]
    kv = result["kv"]
    lines = [
        f"model   {model['path']}{' (bundled)' if model['bundled'] else ''}",
        f"        {model['architecture']}, {model['block_count']} layers, trained context {model['context_length']}, "
        f"weights {human(model['weight_bytes'])}",
        f"context n_ctx {kv['n_ctx']} ({kv['n_ctx_seq']} per sequence), {kv['n_seq_max']} sequence(s), "
        f"{kv['n_stream']} stream(s){', unified' if kv['unified'] else ''}",
        "",
        f"{'cache':<10}{'cells':>9}{'layers':>8}  {'K':<6}{'V':<6}{'K bytes':>16}{'V bytes':>16}{'total':>14}",
    ]
    for c in kv["caches"]:
        lines.append(
            f"{c['kind']:<10}{c['cells']:>9}{c['layers']:>8}  {c['type_k']:<6}{c['type_v']:<6}"
            f"{c['k_bytes']:>16,}{c['v_bytes']:>16,}{human(c['k_bytes'] + c['v_bytes']):>14}"
        )
    lines.append(f"{'total':<10}{'':>9}{'':>8}  {'':<12}{'':>16}{kv['total_bytes']:>16,}{human(kv['total_bytes']):>14}")
    for note in result["notes"]:
        lines.append(f"note: {note}")
    return "\n".join(lines) + "\n"
