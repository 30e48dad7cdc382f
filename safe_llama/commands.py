"""The commands' bodies: each gathers facts, calls the pure core, and renders one result.

Owns the order of the steps for a command; must not hold policy nor parse options itself.
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Mapping

from safe_llama import render
from safe_llama.facts_cache import facts_for
from safe_llama.kv import plan_kv
from safe_llama.llama_args import parse
from safe_llama.request import to_request


def model_path_for(model: str | None, env: Mapping[str, str]) -> str:
    if model is not None:
        return model
    from safe_llama.bundled import bundled_model_path

    return str(bundled_model_path(env))


def plan(*, tool: str, args: list[str], json_out: bool, env: Mapping[str, str] = os.environ) -> None:
    cmd = parse(tool, args, env)
    req = to_request(cmd)
    path = model_path_for(req.model_path, env)
    facts = facts_for(path, env)
    kv = plan_kv(facts, req.kv)
    result = render.plan_result(tool=tool, model_path=path, facts=facts, kv=kv, bundled=req.model_path is None)
    if json_out:
        sys.stdout.write(json.dumps(result, indent=1) + "\n")
    else:
        sys.stdout.write(render.plan_text(result))
