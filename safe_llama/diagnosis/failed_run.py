"""The failed command as far as it is known: explain's own arguments first, then the log's lines, then a
command line the log quotes (`failed_run`). Pure: values in, values out; must not read files, probe or plan.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from safe_llama.cmdline.llama_args import CommandLine, parse, rewrite
from safe_llama.cmdline.memory_flags import BY_FIELD, changes_of
from safe_llama.cmdline.request import to_request
from safe_llama.diagnosis.log_reading import LogFacts
from safe_llama.errors import SafeLlamaError
from safe_llama.model.kv import resolve_context


@dataclass(frozen=True)
class FailedRun:
    """The failed command as far as it is known: explain's own arguments first, then the log."""

    tool: str
    tool_from: str
    args: tuple[str, ...]  # llama.cpp options, model and context included when known
    args_from: str
    env: Mapping[str, str]
    model_path: str | None
    model_from: str
    n_ctx: int | None  # the cells the failed allocation was sized for (padded, as llama.cpp did)
    n_ctx_from: str
    # what a remedy's command runs: the tool's full path here (explain's shell finds it), else its bare name
    program: str | None = None


def failed_run(facts: LogFacts, *, args: Sequence[str], model: str | None, tool: str | None) -> FailedRun:
    """Explicit values beat the log's lines, which beat a command line quoted in the log."""
    chosen_tool, tool_from = tool, "--tool"
    if chosen_tool is None:
        chosen_tool, tool_from = facts.tool, facts.tool_from
    if chosen_tool is None:
        chosen_tool, tool_from = "server", "not in the log: llama-server assumed"
    if args:
        base, args_from = tuple(args), "explain's arguments"
    elif facts.command_args and facts.command_tool == chosen_tool:
        base, args_from = facts.command_args, facts.command_from
    else:
        base, args_from = (), ""
    cmd = parse(chosen_tool, base, {})
    given_model = cmd.value("--model")
    model_path, model_from = model, "-m"
    if model_path is None and given_model is not None and args:
        model_path, model_from = str(given_model), "explain's arguments"
    if model_path is None and facts.model_path is not None:
        model_path, model_from = facts.model_path, facts.model_from
    if model_path is None and given_model is not None:
        model_path, model_from = str(given_model), args_from
    changes: dict[str, str | bool] = {}
    if model_path is not None and given_model is None:
        base = ("-m", model_path, *base)  # first, where people put it
        cmd = parse(chosen_tool, base, {})
    elif model_path is not None and given_model != model_path:
        changes["--model"] = model_path
    asked = cmd.value(BY_FIELD["n_ctx"].option)
    n_ctx, n_ctx_from = facts.n_ctx, facts.n_ctx_from
    cells = _cells_asked(cmd)
    if cells is not None and (args or n_ctx is None):
        n_ctx, n_ctx_from = cells, f"{args_from}: -c {asked}"
    if asked is None and n_ctx is not None:
        changes |= changes_of({"n_ctx": n_ctx})
    final = tuple(rewrite(cmd, changes))
    return FailedRun(
        tool=chosen_tool,
        tool_from=tool_from,
        args=final,
        args_from=args_from,
        env=dict(facts.command_env) if args_from == facts.command_from and args_from else {},
        model_path=model_path,
        model_from=model_from,
        n_ctx=n_ctx,
        n_ctx_from=n_ctx_from,
    )


def _cells_asked(cmd: CommandLine) -> int | None:
    """The cells a command's -c makes, padded as llama.cpp pads them (per stream); None without a positive -c,
    or when llama.cpp would reject the command's values."""
    try:
        kv = to_request(cmd).kv
    except (SafeLlamaError, ValueError):
        return None
    return resolve_context(kv, 0).n_ctx if kv.n_ctx else None
