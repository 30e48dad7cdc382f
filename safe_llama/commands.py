"""The commands' bodies: each gathers facts, calls the pure core, and renders one result.

Owns the order of the steps for a command; must not hold policy nor parse options itself.
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path

from safe_llama import render
from safe_llama.device_map import DeclaredLimits
from safe_llama.errors import ExitStatus, SafeLlamaError
from safe_llama.facts_cache import facts_for
from safe_llama.kv import plan_kv
from safe_llama.llama_args import CommandLine, parse, rewrite
from safe_llama.model_facts import ModelFacts
from safe_llama.paths import config_dir, configs_dir
from safe_llama.planner import Plan, Target, plan, target_from, with_learned
from safe_llama.policy import load_policy
from safe_llama.request import Request, to_request


@dataclass(frozen=True)
class PlanOptions:
    """safe-llama's own planning options (from its command line, SAFE_LLAMA_* or the config file)."""

    ladder: tuple[str, ...] | None = None
    min_ctx: int | None = None
    declared: DeclaredLimits = field(default_factory=DeclaredLimits)
    llama_bin: str | None = None
    llama_version: str | None = None  # planning for another build: its `--version`
    kv_split: bool | None = None  # force the allocation model: split at max alloc, or one buffer
    learned_max_alloc: int | None = None
    kv_cap: int | None = None  # after a failed start: stay at or under this much KV
    compute_extra: int = 0  # after a failed start that named the compute buffers' size: what the estimate missed
    margin_scale: float = 1.0  # after a failed start: the share of the policy's margin kept (planner.Target)


@dataclass(frozen=True)
class Prepared:
    cmd: CommandLine
    request: Request
    model_path: str
    facts: ModelFacts
    target: Target
    binary: Path | None
    plan: Plan | None
    error: SafeLlamaError | None  # NOTHING_FITS


def model_path_for(model: str | None, env: Mapping[str, str]) -> str:
    if model is not None:
        return model
    from safe_llama.bundled import bundled_model_path

    return str(bundled_model_path(env))


def prepare(
    tool: str, args: Sequence[str], env: Mapping[str, str], options: PlanOptions, *, binary: Path | None = None
) -> Prepared:
    """Facts about the model and the device, and the plan (or why nothing fits). `binary`: the llama.cpp
    tool already found by the caller (the launcher), so it is not looked up twice."""
    from safe_llama.binaries import find_binary
    from safe_llama.devices import probe_devices

    cmd = parse(tool, args, env)
    req = to_request(cmd)
    path = model_path_for(req.model_path, env)
    facts = facts_for(path, env)
    try:
        binary = binary or find_binary(tool, env=env, explicit=options.llama_bin)
    except SafeLlamaError:
        if options.llama_bin:
            raise
        binary = None  # planning without a binary: the declared limits and the host budget only
    report = probe_devices(binary=binary, args=args, env=env, declared=options.declared, opencl_always=False)
    version = options.llama_version or (report.llama.version.version if report.llama and report.llama.version else None)
    target = target_from(
        report.target,
        report.host,
        binary_version=version,
        profile=report.profile,
        kv_split=options.kv_split,
        malloc_arena_max_set="MALLOC_ARENA_MAX" in env,
    )
    return replan(Prepared(cmd, req, path, facts, target, binary, None, None), options, env)


def replan(prepared: Prepared, options: PlanOptions, env: Mapping[str, str]) -> Prepared:
    """The plan again for the same model and device, with what was learned (a device limit, a KV cap):
    no file or device is read again."""
    cmd, req, facts = prepared.cmd, prepared.request, prepared.facts
    target = with_learned(prepared.target, options.learned_max_alloc)
    target = replace(
        target, kv_cap=options.kv_cap, compute_extra=options.compute_extra, margin_scale=options.margin_scale
    )
    policy = load_policy(configs_dir(env) / "planner.toml", config_dir(env) / "config.toml")
    ngl = req.n_gpu_layers
    user_ngl = int(ngl) if ngl is not None and ngl.lstrip("-").isdigit() and int(ngl) >= 0 else None
    try:
        decided: Plan | None = plan(
            facts,
            req.kv,
            target,
            policy,
            ladder=options.ladder,
            user_fit_set=cmd.get("--fit") is not None,
            user_ngl=user_ngl,
            floor=options.min_ctx,
        )
        error = None
    except SafeLlamaError as err:
        if err.status != ExitStatus.NOTHING_FITS:
            raise
        decided, error = None, err
    return replace(prepared, target=target, plan=decided, error=error)


def final_argv(prepared: Prepared) -> list[str]:
    """The tool's argv as the plan launches it: the user's, with the plan's explicit changes."""
    changes = dict(prepared.plan.argv_changes) if prepared.plan else {}
    if prepared.request.model_path is None:
        changes["--model"] = prepared.model_path
    return rewrite(prepared.cmd, changes)


def plan_command(
    *, tool: str, args: list[str], json_out: bool, options: PlanOptions, env: Mapping[str, str] = os.environ
) -> int:
    from safe_llama.paths import cache_dir
    from safe_llama.state import check_cache

    unusable = check_cache(cache_dir(env))
    if unusable is not None:
        sys.stderr.write(f"safe-llama: warning: {unusable}: nothing is cached\n")
    prepared = prepare(tool, args, env, options)
    kv = prepared.plan.kv if prepared.plan else plan_kv(prepared.facts, prepared.request.kv)
    result = render.plan_result(
        tool=tool,
        model_path=prepared.model_path,
        facts=prepared.facts,
        kv=kv,
        bundled=prepared.request.model_path is None,
    )
    result.update(render.decision_result(prepared.target, prepared.plan, final_argv(prepared), prepared.error))
    if json_out:
        sys.stdout.write(json.dumps(result, indent=1) + "\n")
    else:
        sys.stdout.write(render.plan_text(result))
    if prepared.error is not None:
        sys.stderr.write(f"{prepared.error.message}\n")
        return int(prepared.error.status)
    return 0
