"""The bundled model in a chat (llama-cli, llama-server): the options it needs for each reply to end by
itself (configs/bundled-model.toml), added to a command line that names no model and sets none of them.

Owns which of those options a command line gets and the one line that says so. Pure but for reading the
table; must not decide whether the bundled model is used (model_source does) or launch anything.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from safe_llama.cmdline.llama_args import arg_table, parse
from safe_llama.errors import ExitStatus, SafeLlamaError
from safe_llama.state import load_toml


@dataclass(frozen=True)
class ChatOption:
    """One option the bundled model's chat adds (configs/bundled-model.toml), unless the user set it."""

    name: str  # a llama.cpp option
    value: str | None  # None: a flag
    same: tuple[str, ...]  # other options that set the same thing: the user's choice of any of them wins
    says: str  # its words in the line that announces it


@dataclass(frozen=True)
class ChatDefaults:
    """The bundled model's chat options, and the tools they apply to."""

    tools: tuple[str, ...]
    options: tuple[ChatOption, ...]  # in the order added


def _option(raw: Any, where: str) -> ChatOption:
    if not isinstance(raw, dict) or set(raw) - {"name", "value", "same", "says"}:
        raise SafeLlamaError(
            f"safe-llama: {where}: an [[option]] has name, value, same and says", ExitStatus.BAD_CONFIG
        )
    name, value, same, says = raw.get("name"), raw.get("value"), raw.get("same", []), raw.get("says")
    if (
        not isinstance(name, str)
        or not isinstance(says, str)
        or not (value is None or isinstance(value, str))
        or not (isinstance(same, list) and all(isinstance(s, str) for s in same))
    ):
        raise SafeLlamaError(
            f"safe-llama: {where}: [[option]] {name!r}: name and says are text, value text or absent, same a list",
            ExitStatus.BAD_CONFIG,
        )
    return ChatOption(name, value, tuple(same), says)


def parse_chat_defaults(raw: Mapping[str, Any], where: str) -> ChatDefaults:
    tools, options = raw.get("tools"), raw.get("option", [])
    if not isinstance(tools, list) or not all(isinstance(t, str) for t in tools):
        raise SafeLlamaError(f"safe-llama: {where}: tools must be a list of tool names", ExitStatus.BAD_CONFIG)
    if not isinstance(options, list):
        raise SafeLlamaError(f"safe-llama: {where}: 'option' must be an array of tables", ExitStatus.BAD_CONFIG)
    return ChatDefaults(tuple(tools), tuple(_option(o, where) for o in options))


def load_chat_defaults(path: Path, keep_in: Path | None = None) -> ChatDefaults:
    """The bundled model's chat options (configs/bundled-model.toml), read for a launch of the bundled model;
    keep_in: the cache folder where its parse is kept (state.load_toml), so tomllib is not imported then."""
    try:
        return parse_chat_defaults(load_toml(path, keep_in), str(path))
    except OSError as err:
        raise SafeLlamaError(f"safe-llama: {path}: {err.strerror}", ExitStatus.BAD_CONFIG) from None
    except ValueError as err:  # tomllib.TOMLDecodeError, or an untrusted folder
        raise SafeLlamaError(f"safe-llama: {path}: {err}", ExitStatus.BAD_CONFIG) from None


def chat_options(
    tool: str, args: Sequence[str], env: Mapping[str, str], defaults: ChatDefaults
) -> tuple[list[str], str | None]:
    """The options to add to a command line that runs the bundled model, and the line saying so (None when
    none is added: another tool, or the user set each of them)."""
    import shlex  # only when the chat's words are said

    if tool not in defaults.tools:
        return [], None
    cmd = parse(tool, args, env)
    table = arg_table(tool)
    added: list[str] = []
    says: list[str] = []
    for option in defaults.options:
        specs = [table.by_name[name][0] for name in (option.name, *option.same) if name in table.by_name]
        if option.name not in table.by_name or any(cmd.get(spec.key) is not None for spec in specs):
            continue  # this llama.cpp has no such option for the tool, or the user chose it
        added += [option.name] if option.value is None else [option.name, option.value]
        says += [option.says] if option.says else []
    if not added:
        return [], None
    line = (
        f"{' '.join(shlex.quote(w) for w in added)}: the bundled model (Gemma 3 270M, a base model without a chat "
        f"template) gets {' and '.join(says)}, so each reply ends by itself"
    )
    return added, line
