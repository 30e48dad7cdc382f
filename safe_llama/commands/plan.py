"""`safe-llama plan`: the plan for a llama.cpp command line, as text or JSON, without launching anything.

A model that is not downloaded yet (-hf) is not an error here: the result says so and what was asked."""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Mapping, Sequence

from safe_llama.cmdline.llama_args import parse, redact_argv
from safe_llama.cmdline.memory_flags import LlamaSettings
from safe_llama.cmdline.model_source import ModelSource, resolve
from safe_llama.errors import ExitStatus, ModelNotOnDisk
from safe_llama.model.kv import plan_kv
from safe_llama.pipeline.prepare import PlanOptions, context_note, final_argv, prepare
from safe_llama.plan import render
from safe_llama.plan.memory import memory_by_place


def not_on_disk_result(tool: str, args: Sequence[str], source: ModelSource, message: str) -> dict[str, object]:
    return {
        "tool": tool,
        "model": {"path": None, "bundled": False, "source": _source_json(source), "downloaded": False},
        "fits": None,
        "decision": {"steps": [], "reasons": [message], "argv": redact_argv(list(args)), "env": {}, "changed": []},
        "memory": None,
        "notes": [message],
    }


def _source_json(source: ModelSource | None) -> dict[str, object] | None:
    if source is None:
        return None
    return {
        "kind": source.kind,
        "spec": source.spec,
        "path": source.path,
        "where": source.where,
        "mmproj": source.mmproj,
    }


def plan_command(
    *, tool: str, args: list[str], json_out: bool, options: PlanOptions, env: Mapping[str, str] = os.environ
) -> int:
    from safe_llama.paths import cache_dir
    from safe_llama.state import check_cache

    unusable = check_cache(cache_dir(env))
    if unusable is not None:
        sys.stderr.write(f"safe-llama: warning: {unusable}: nothing is cached\n")
    refused = parse(tool, args, env).usage_errors
    if refused:  # llama.cpp's parser stops there: no plan would be used
        words = refused[0]
        for word, shown in zip(args, redact_argv(args, tool, keep_in=cache_dir(env)), strict=True):
            if shown != word:  # its words quote the argument: a secret's value is not repeated
                words = words.replace(word, shown)
        sys.stderr.write(f"safe-llama: llama-{tool} refuses this command line: error: {words}\n")
        return int(ExitStatus.USAGE)
    try:
        prepared = prepare(tool, args, env, options)
    except ModelNotOnDisk as missing:
        source = resolve(parse(tool, args, env), env)
        assert source is not None
        message = missing.message.removeprefix("safe-llama: ")
        if json_out:
            sys.stdout.write(json.dumps(not_on_disk_result(tool, args, source, message), indent=1) + "\n")
        else:
            sys.stdout.write(f"model   {source.spec} (not downloaded yet)\nnote: {message}\n")
        return 0
    kv = prepared.plan.kv if prepared.plan else plan_kv(prepared.facts, prepared.request.kv)
    result = render.plan_result(
        tool=tool,
        model_path=prepared.model_path,
        facts=prepared.facts,
        kv=kv,
        bundled=prepared.bundled,
    )
    result["model"]["source"] = _source_json(prepared.source)
    result["model"]["downloaded"] = prepared.source is None or prepared.source.on_disk
    extra = [*prepared.others.held_lines(), *prepared.announce, *prepared.notes]
    note = context_note(prepared.facts, kv, tool)
    if note:
        extra.append(note)
    result["notes"] = list(result["notes"]) + extra
    decision = render.decision_result(
        prepared.target, prepared.plan, final_argv(prepared), prepared.error, keep_in=cache_dir(env)
    )
    result.update(decision)
    settings = (
        prepared.plan.settings if prepared.plan else LlamaSettings(kv=prepared.request.kv, layout=prepared.layout)
    )
    result["memory"] = memory_by_place(prepared.facts, settings, prepared.target)
    if json_out:
        sys.stdout.write(json.dumps(result, indent=1) + "\n")
    else:
        sys.stdout.write(render.plan_text(result))
    if prepared.error is not None:
        sys.stderr.write(f"{prepared.error.message}\n")
        return int(prepared.error.status)
    return 0


def run_plan(*, tool: str, args: list[str], given: Mapping[str, str], env: Mapping[str, str] = os.environ) -> int:
    """`safe-llama plan`: the same resolution as the launch (given, `plan`'s own options as
    cmdline.own_options reads them, over SAFE_LLAMA_* over the config file), then the plan printed."""
    from dataclasses import replace

    from safe_llama.cmdline import launch_args
    from safe_llama.cmdline.own_options import flag
    from safe_llama.pipeline.options import launch_options

    launcher = {key: value for key, value in given.items() if key in launch_args.LAUNCHER}
    settings, origins = launch_args.resolve_sourced(launcher, env)
    launch = launch_options(settings, origins)
    # the plan of a launch with no terminal on its stdin (a unit, a container): a server may hand off as it starts
    at_spawn = tool == "server" and launch.hand_off
    options = replace(launch.plan, kv_split=flag(given, "kv_split"), hand_off_at_spawn=at_spawn)
    return plan_command(tool=tool, args=args, json_out=bool(flag(given, "json")), options=options, env=env)


def main(settings: Mapping[str, str], words: list[str]) -> int:
    """The command's runner (cmdline.own_options.COMMANDS): `plan`'s options as entry.py read them, then the
    tool and its llama.cpp arguments."""
    from safe_llama.cmdline.launch_args import check_tool
    from safe_llama.cmdline.own_options import TOOL_HINT

    return run_plan(tool=check_tool(words[0] if words else None, TOOL_HINT), args=words[1:], given=settings)
