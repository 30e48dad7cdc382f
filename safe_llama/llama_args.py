"""llama.cpp's command line, read as llama.cpp reads it, and rewritten with explicit values.

Owns the option table (configs/llama-args.json, extracted from the pinned common/arg.cpp), LLAMA_ARG_*
environment twins, and argv rewriting. Pure: takes argv and env as values; must not run anything.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path

from safe_llama.paths import configs_dir

# llama.cpp's example ids for the three tools safe-llama stands in front of.
TOOL_EXAMPLE = {"cli": "cli", "server": "server", "completion": "completion"}

# Options whose values are secrets: never printed, logged or stored.
SECRET_OPTIONS = frozenset({"--api-key", "--api-key-file", "--ssl-key-file", "--hf-token"})
SECRET_ENV = frozenset({"LLAMA_API_KEY", "HF_TOKEN", "LLAMA_ARG_HF_TOKEN", "HUGGING_FACE_HUB_TOKEN"})
REDACTED = "<redacted>"

_TRUTHY = {"1", "true", "on", "yes", "enabled"}
_FALSY = {"0", "false", "off", "no", "disabled"}


@dataclass(frozen=True)
class OptionSpec:
    names: tuple[str, ...]
    negative: tuple[str, ...]
    kind: str  # flag | bool | value | value2
    env: str | None
    examples: frozenset[str]
    excludes: frozenset[str]

    @property
    def key(self) -> str:
        """The canonical name: the first long name, else the first name."""
        return next((n for n in self.names if n.startswith("--")), self.names[0])

    def applies_to(self, tool: str) -> bool:
        example = TOOL_EXAMPLE[tool]
        if example in self.excludes:
            return False
        return example in self.examples or "common" in self.examples


@dataclass(frozen=True)
class ArgTable:
    by_name: Mapping[str, tuple[OptionSpec, bool]]  # name -> (spec, is_positive)
    specs: tuple[OptionSpec, ...]


@cache
def arg_table(tool: str, path: Path | None = None) -> ArgTable:
    source = path or configs_dir() / "llama-args.json"
    raw = json.loads(source.read_text())
    specs: list[OptionSpec] = []
    by_name: dict[str, tuple[OptionSpec, bool]] = {}
    for item in raw["options"]:
        spec = OptionSpec(
            names=tuple(item["names"]),
            negative=tuple(item["negative"]),
            kind=item["kind"],
            env=item["env"],
            examples=frozenset(item["examples"]),
            excludes=frozenset(item["excludes"]),
        )
        if not spec.applies_to(tool):
            continue
        specs.append(spec)
        for name in spec.names:
            by_name[name] = (spec, True)
        for name in spec.negative:
            by_name[name] = (spec, False)
    return ArgTable(by_name=by_name, specs=tuple(specs))


@dataclass(frozen=True)
class Setting:
    """One option's effective value and where it came from."""

    key: str
    value: str | bool | tuple[str, str]
    source: str  # "argv" or the environment variable's name
    argv_index: int | None = None  # index of the option name in argv (last occurrence)


@dataclass(frozen=True)
class CommandLine:
    tool: str
    argv: tuple[str, ...]
    settings: Mapping[str, Setting]
    unknown: tuple[str, ...] = ()  # options llama.cpp will reject; passed through untouched
    env_overridden: tuple[str, ...] = field(default=())  # env twins a flag on argv beats

    def get(self, key: str) -> Setting | None:
        return self.settings.get(key)

    def value(self, key: str) -> str | bool | tuple[str, str] | None:
        setting = self.settings.get(key)
        return None if setting is None else setting.value


def _normalise(arg: str) -> str:
    return arg.replace("_", "-") if arg.startswith("--") else arg


def _env_value(spec: OptionSpec, env: Mapping[str, str]) -> tuple[str | bool, str] | None:
    if spec.env is None:
        return None
    if spec.negative:
        neg = spec.env.replace("LLAMA_ARG_", "LLAMA_ARG_NO_")
        if neg in env:
            return False, neg
    if spec.env not in env:
        return None
    raw = env[spec.env]
    if spec.kind == "flag":
        return (raw.lower() in _TRUTHY), spec.env
    if spec.kind == "bool":
        return (raw.lower() not in _FALSY), spec.env
    return raw, spec.env


def parse(tool: str, argv: Sequence[str], env: Mapping[str, str], table: ArgTable | None = None) -> CommandLine:
    """Read argv and the LLAMA_ARG_* environment the way llama.cpp's common_params_parse does."""
    table = table or arg_table(tool)
    settings: dict[str, Setting] = {}
    for spec in table.specs:
        found = _env_value(spec, env)
        if found is not None:
            settings[spec.key] = Setting(spec.key, found[0], found[1])
    unknown: list[str] = []
    overridden: list[str] = []
    i = 0
    while i < len(argv):
        name = _normalise(argv[i])
        entry = table.by_name.get(name)
        if entry is None:
            unknown.append(argv[i])
            i += 1
            continue
        spec, positive = entry
        if spec.key in settings and settings[spec.key].source != "argv":
            overridden.append(settings[spec.key].source)
        value: str | bool | tuple[str, str]
        if spec.kind in ("flag", "bool"):
            value = positive
            step = 1
        elif spec.kind == "value":
            if i + 1 >= len(argv):
                unknown.append(argv[i])
                break
            value = argv[i + 1]
            step = 2
        else:
            if i + 2 >= len(argv):
                unknown.append(argv[i])
                break
            value = (argv[i + 1], argv[i + 2])
            step = 3
        settings[spec.key] = Setting(spec.key, value, "argv", i)
        i += step
    return CommandLine(tool, tuple(argv), settings, tuple(unknown), tuple(overridden))


def rewrite(cmd: CommandLine, changes: Mapping[str, str | bool], table: ArgTable | None = None) -> list[str]:
    """argv with each changed option set explicitly.

    A value already on argv is replaced where it stands (every occurrence, so duplicates cannot
    disagree); a new one is appended. An explicit flag beats its environment twin, so settings that
    came from LLAMA_ARG_* are overridden without touching the environment.
    """
    table = table or arg_table(cmd.tool)
    specs = {spec.key: spec for spec in table.specs}
    out = list(cmd.argv)
    pending = dict(changes)
    i = 0
    while i < len(out):
        entry = table.by_name.get(_normalise(out[i]))
        if entry is None:
            i += 1
            continue
        spec, _ = entry
        width = {"flag": 1, "bool": 1, "value": 2, "value2": 3}[spec.kind]
        if spec.key in changes:
            new = changes[spec.key]
            if spec.kind == "value":
                out[i + 1 : i + 2] = [str(new)]
            elif spec.kind == "bool" and isinstance(new, bool):
                out[i] = spec.names[0] if new else spec.negative[0]
            elif spec.kind == "flag" and new is False:
                del out[i]
                width = 0
            pending.pop(spec.key, None)
        i += width
    for key, new in pending.items():
        spec = specs[key]
        if spec.kind == "value":
            out += [spec.names[0], str(new)]
        elif spec.kind == "bool":
            out.append(spec.names[0] if new else spec.negative[0])
        elif spec.kind == "flag" and new is True:
            out.append(spec.names[0])
    return out


def redact_argv(argv: Sequence[str], tool: str = "server") -> list[str]:
    """argv safe to print: the value of every secret option replaced."""
    out = list(argv)
    for i, arg in enumerate(out[:-1]):
        if _normalise(arg) in SECRET_OPTIONS or arg == "-hft":
            out[i + 1] = REDACTED
    return out


def redact_env(env: Mapping[str, str]) -> dict[str, str]:
    return {k: (REDACTED if k in SECRET_ENV or "TOKEN" in k or "API_KEY" in k else v) for k, v in env.items()}
