"""Invocations that load no model (--help, --version, --list-devices, --completion-bash, -cl, a usage
error) are llama.cpp's own business: the real binary replaces this process, argv untouched.

Owns that decision and the exec; must stay light (no typer, no probing): it runs before anything else.
The common answers come without the option table: a compact form of it (no_model_table,
kept in the cache beside the table's identity) is walked as llama_args.parse walks argv, and where a value
or the environment would need parse's own checks, parse decides; the binary named by SAFE_LLAMA_BIN_DIR
or --llama-bin is checked as binaries.find_binary checks it, other places are left to find_binary.
"""

from __future__ import annotations

import os

from safe_llama import trust
from safe_llama.constants import GUARD_ENV, TOOL_BINARY, cache_root, config_root, packaged_configs
from safe_llama.device.self_check import is_self, own_paths
from safe_llama.remembered import early

TYPE_CHECKING = False  # typing.TYPE_CHECKING without importing typing (mypy reads the name)
if TYPE_CHECKING:
    from collections.abc import Mapping, Sequence
    from typing import Any

TABLE_FORMAT = 1


def loads_no_model(tool: str, args: Sequence[str], env: Mapping[str, str]) -> bool:
    from safe_llama.cmdline.llama_args import parse

    return parse(tool, args, env).loads_no_model


def no_model_table(tool: str) -> dict[str, Any]:
    """The option table as quick_no_model needs it: name -> (values it takes, loads no model, value checked),
    and the environment variables whose presence could decide alone (a no-model option's twin, a checked or
    boolean option's twin)."""
    from safe_llama.cmdline.llama_args import NO_MODEL_OPTIONS, arg_table, value_checked

    table = arg_table(tool)
    arity = {"flag": 0, "bool": 0, "value": 1}
    names = {
        name: (arity.get(spec.kind, 2), spec.key in NO_MODEL_OPTIONS, value_checked(spec))
        for name, (spec, _) in table.by_name.items()
    }
    env: set[str] = set()
    for spec in table.specs:
        if spec.env is not None and (spec.key in NO_MODEL_OPTIONS or spec.kind == "bool" or value_checked(spec)):
            env.add(spec.env)
            if spec.negative:
                env.add(spec.env.replace("LLAMA_ARG_", "LLAMA_ARG_NO_"))
    return {"names": names, "env": sorted(env)}


def quick_no_model(table: Mapping[str, Any], args: Sequence[str], env: Mapping[str, str]) -> bool | None:
    """parse(tool, args, env).loads_no_model from no_model_table's form, or None where only parse can say
    (a value parse checks, a variable that could decide): tests hold the two equal over many argvs."""
    if any(name in env for name in table["env"]):
        return None
    names = table["names"]
    i = 0
    while i < len(args):
        word = args[i]
        entry = names.get(word.replace("_", "-") if word.startswith("--") else word)
        if entry is None:
            return True  # an unknown word: llama.cpp prints its usage
        takes, no_model, checked = entry
        if no_model or (takes and i + takes >= len(args)):
            return True  # a no-model option, or an option short of its values
        if checked:
            return None
        i += 1 + takes
    return False


def _table_path(tool: str, env: Mapping[str, str]) -> str | None:
    """Where the compact table is kept: named by the option table's and llama_args.py's identities."""
    cmdline = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "cmdline")
    sources = [os.path.join(packaged_configs(), "llama-args.json"), os.path.join(cmdline, "llama_args.py")]
    identities = [early.identity(path) for path in sources]
    if None in identities:
        return None
    key = early.key(f"no-model-table {TABLE_FORMAT} {tool}", [repr(identities)], "")
    return os.path.join(cache_root(env), "args", f"{key}.marshal")


def _no_model(tool: str, args: Sequence[str], env: Mapping[str, str]) -> bool:
    path = _table_path(tool, env)
    table = trust.load_entry(path, trust.SHAPES["args"]) if path is not None else None
    if table is None:
        table = no_model_table(tool)
        if path is not None:
            _keep(path, table)
    found = quick_no_model(table, args, env)
    return loads_no_model(tool, args, env) if found is None else found


def _keep(path: str, table: Mapping[str, Any]) -> None:
    import marshal
    from pathlib import Path

    from safe_llama import state

    try:
        state.write_bytes(Path(path), marshal.dumps(dict(table)))
    except (OSError, ValueError):
        return  # an unwritable cache: the table is derived again next time


def _quick_binary(tool: str, env: Mapping[str, str], given: Mapping[str, str]) -> str | None:
    """find_binary's answer when the first place it looks is --llama-bin or SAFE_LLAMA_BIN_DIR (no config
    file, which could name another) and that place holds an executable that is not safe-llama; None
    otherwise (find_binary then looks, and says why it found nothing)."""
    explicit = given.get("bin_dir") or env.get("SAFE_LLAMA_BIN_DIR") or ""
    if not explicit or os.path.lexists(os.path.join(config_root(env), "config.toml")):
        return None
    path = os.path.join(explicit, TOOL_BINARY[tool]) if os.path.isdir(explicit) else explicit
    if not os.path.exists(path) or is_self(path, own_paths()) or os.path.isdir(path) or not os.access(path, os.X_OK):
        return None
    return path


def exec_if_no_model(tool: str, args: Sequence[str], env: Mapping[str, str], given: Mapping[str, str]) -> None:
    """Replace this process with the real binary when llama.cpp will load no model; return otherwise
    (also when the binary cannot be found: the launch path then says why)."""
    if GUARD_ENV in env or not _no_model(tool, args, env):
        return  # started by safe-llama in place of llama.cpp: the launch path refuses the loop
    binary = _quick_binary(tool, env, given)
    if binary is None:
        from safe_llama.cmdline.launch_args import resolve
        from safe_llama.device.binaries import find_binary
        from safe_llama.errors import SafeLlamaError

        try:
            binary = str(find_binary(tool, env=env, explicit=resolve(given, env).get("bin_dir")))
        except SafeLlamaError:
            return
    os.execv(binary, [binary, *args])  # noqa: S606 -- argv handed on as a list, never through a shell


def pass_through_early(tool: str, args: list[str], given: dict[str, str]) -> None:
    """exec_if_no_model for the doors: a bad config file or option is left to the full path, which reports it."""
    try:
        exec_if_no_model(tool, args, os.environ, given)
    except Exception as err:
        from safe_llama.errors import SafeLlamaError  # only here: enum is an import the common path avoids

        if isinstance(err, SafeLlamaError):
            return
        raise
