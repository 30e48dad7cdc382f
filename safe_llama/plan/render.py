"""Results as JSON-ready dicts and as text for people, from the same values. Pure."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from safe_llama.cmdline.llama_args import redact_argv, redact_env
from safe_llama.device.limits import Sourced
from safe_llama.errors import SafeLlamaError
from safe_llama.model.facts import ModelFacts
from safe_llama.model.kv import KvPlan, mib_line
from safe_llama.plan import allocation_words
from safe_llama.plan.planner import Plan
from safe_llama.plan.target import Target
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
    for place, items in (result.get("memory") or {}).items():
        parts = ", ".join(f"{k.replace('_', ' ')} {human(v)}" for k, v in items.items())
        lines.append(f"memory  {place}: {parts or 'nothing'} (total {human(sum(items.values()))})")
    if "target" in result:
        lines += decision_text(result)
    return "\n".join(lines) + "\n"


def decision_result(
    target: Target, decided: Plan | None, argv: list[str], error: SafeLlamaError | None, keep_in: Path | None = None
) -> dict[str, Any]:
    """The planner's decision, secrets redacted: steps, final argv and environment, allocations. keep_in: the
    cache folder that keeps configs/secrets.toml's parse (llama_args.secrets)."""
    out: dict[str, Any] = {
        "target": {
            "backend": target.backend,
            "device": target.device,
            "on_gpu": target.on_gpu,
            "integrated": target.integrated,
            "max_alloc": _sourced(target.max_alloc),
            "max_tensor": _sourced(target.max_tensor),
            "device_memory": _sourced(target.device_memory),
            "device_free": _sourced(target.device_free),
            "device_budget": _sourced(target.device_budget),
            "host_budget": _sourced(target.host_budget),
            "binary_version": target.binary_version,
            "rpc": [
                {"name": r.name, "endpoint": r.endpoint, "free": r.free_bytes, "memory": _sourced(r.memory)}
                for r in target.remote
            ],
        },
        "fits": decided is not None,
    }
    if decided is None:
        out["error"] = None if error is None else error.message
        out["decision"] = None
        out["allocations"] = []
        return out
    out["decision"] = {
        "steps": [s.name for s in decided.steps],
        "reasons": [s.reason for s in decided.steps],
        "argv": redact_argv(argv, keep_in=keep_in),
        "env": redact_env(dict(decided.env_changes), keep_in),
        "changed": sorted(decided.argv_changes),
        "notes": list(decided.notes),
    }
    out["allocations"] = [
        {
            "name": allocation_words.label(a),
            "bytes": a.bytes,
            "limit": a.limit,
            "limit_name": allocation_words.limit_label(a),
            "fits": a.fits,
        }
        for a in decided.allocations
    ]
    out["ctx_by_type"] = dict(decided.ctx_by_type)
    return out


def _sourced(value: Sourced[int] | None) -> dict[str, Any] | None:
    if value is None:
        return None
    return {"bytes": value.value, "source": value.source, "detail": value.detail}


def bar(used: int, limit: int, width: int = 30) -> str:
    share = used / limit if limit > 0 else float("inf")
    filled = min(width, round(share * width)) if limit > 0 else width  # no room at all: a full bar, not a crash
    return "[" + "#" * filled + "." * (width - filled) + "]" + (" OVER" if used > limit else f" {share:4.0%}")


def decision_text(result: dict[str, Any]) -> list[str]:
    import shlex  # here: the table for people; `plan --json` goes without it

    t = result["target"]
    where = t["device"] or ("GPU" if t["on_gpu"] else "host CPU")
    lines = [
        "",
        f"target  {t['backend']} {where}{' (integrated)' if t['integrated'] else ''}"
        + (f", llama.cpp {t['binary_version']}" if t["binary_version"] else ""),
    ]
    decision = result.get("decision")
    if decision is None:
        lines.append(f"decision: nothing fits. {result.get('error') or ''}".rstrip())
        return lines
    lines.append("")
    for a in result["allocations"]:
        lines.append(f"{a['name']:<52}{human(a['bytes']):>12} {bar(a['bytes'], a['limit'])}")
        lines.append(f"{'':<52}{'':>12}  limit: {a['limit_name']}")
    if result.get("ctx_by_type"):
        per_type = ", ".join(f"{k} {v}" for k, v in result["ctx_by_type"].items())
        lines.append(f"largest context that fits: {per_type}")
    lines.append("")
    if decision["steps"]:
        for reason in decision["reasons"]:
            lines.append(f"change: {reason}")
    else:
        lines.append("change: none: it fits as asked")
    for note in decision["notes"]:
        lines.append(f"note: {note}")
    lines.append("argv: " + " ".join(shlex.quote(a) for a in decision["argv"]))
    if decision["env"]:
        lines.append("env:  " + " ".join(f"{k}={shlex.quote(v)}" for k, v in decision["env"].items()))
    return lines
