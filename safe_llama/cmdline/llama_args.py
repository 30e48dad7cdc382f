"""llama.cpp's command line, read as llama.cpp reads it, and rewritten with explicit values.

Owns the option table (configs/llama-args.json, extracted from the pinned common/arg.cpp), LLAMA_ARG_*
environment twins, and argv rewriting. Pure: takes argv and env as values; must not run anything.
Values are NamedTuples, not dataclasses: this module runs before every pass-through exec, and importing
dataclasses (inspect with it) costs more than the whole parse.

Over 400 lines on purpose: reading a value as llama.cpp does (std::stoi, std::stof, the handlers' own
readers), the parse that refuses what llama.cpp refuses, and the values it reads as another number are one
reading of one table; split, each part would import the others.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Callable, Mapping, Sequence
from functools import cache
from pathlib import Path
from typing import NamedTuple

from safe_llama.constants import mask_values
from safe_llama.model.cache_types import CACHE_TYPES
from safe_llama.paths import packaged_configs

# llama.cpp's example ids for the three tools safe-llama stands in front of.
TOOL_EXAMPLE = {"cli": "cli", "server": "server", "completion": "completion"}

# Options whose values are secrets: never printed, logged or stored.
REDACTED = "<redacted>"
# Options llama.cpp answers without loading a model (canonical keys).
NO_MODEL_OPTIONS = ("--help", "--version", "--list-devices", "--completion-bash", "--cache-list")

# common_arg_utils::is_truthy / is_falsey: exact, case-sensitive spellings
_TRUTHY = {"1", "true", "on", "enabled"}
# kv_cache_types in common/arg.cpp, matched case-sensitively against ggml_type_name
_FALSY = {"0", "false", "off", "disabled"}


class OptionSpec(NamedTuple):
    names: tuple[str, ...]
    negative: tuple[str, ...]
    kind: str  # flag | bool | value | value2
    env: str | None
    examples: frozenset[str]
    excludes: frozenset[str]
    value_type: str | None = None  # value options: "int" (the parser applies std::stoi) or "string"

    @property
    def key(self) -> str:
        """The canonical name: the first long name, else the first name."""
        return next((n for n in self.names if n.startswith("--")), self.names[0])

    def applies_to(self, tool: str) -> bool:
        example = TOOL_EXAMPLE[tool]
        if example in self.excludes:
            return False
        return example in self.examples or "common" in self.examples


class ArgTable(NamedTuple):
    by_name: Mapping[str, tuple[OptionSpec, bool]]  # name -> (spec, is_positive)
    specs: tuple[OptionSpec, ...]


@cache
def arg_table(tool: str, path: Path | None = None) -> ArgTable:
    source = path or packaged_configs() / "llama-args.json"
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
            value_type=item.get("value_type"),
        )
        if not spec.applies_to(tool):
            continue
        specs.append(spec)
        for name in spec.names:
            by_name[name] = (spec, True)
        for name in spec.negative:
            by_name[name] = (spec, False)
    return ArgTable(by_name=by_name, specs=tuple(specs))


# C's isspace in the "C" locale: what strtol/strtof skip before a number.
_C_SPACE = " \t\n\v\f\r"
_INT_RE = re.compile(r"[+-]?[0-9]+")
# compiled on its first use (re's own cache): most command lines hold no float
_FLOAT = (
    r"(?i)[+-]?(?:0[xX](?:[0-9a-fA-F]+\.?[0-9a-fA-F]*|\.[0-9a-fA-F]+)(?:[pP][+-]?[0-9]+)?"
    r"|(?:[0-9]+\.?[0-9]*|\.[0-9]+)(?:[eE][+-]?[0-9]+)?"
    r"|inf(?:inity)?|nan(?:\([0-9A-Za-z_]*\))?)"
)
INT32_MIN, INT32_MAX = -(2**31), 2**31 - 1
FLT_MAX = 3.4028234663852886e38
FLT_MIN = 1.1754943508222875e-38


def stoi(text: str) -> int:
    """std::stoi: base 10 after C whitespace and a sign, trailing text ignored ("0x10" is 0, "08" is 8,
    "4_096" is 4); ValueError where llama.cpp throws (no digits, outside int)."""
    found = _INT_RE.match(text.lstrip(_C_SPACE))
    if found is None:
        raise ValueError(f"stoi: no conversion of {text!r}")
    value = int(found.group(0))
    if not INT32_MIN <= value <= INT32_MAX:
        raise ValueError(f"stoi: {text!r} is out of range")
    return value


def stof(text: str) -> float:
    """std::stof (strtof): decimal or hex floats, inf, nan, trailing text ignored; ValueError where
    llama.cpp throws (no conversion, or ERANGE: overflow, or underflow below the smallest normal)."""
    found = re.match(_FLOAT, text.lstrip(_C_SPACE))
    if found is None:
        raise ValueError(f"stof: no conversion of {text!r}")
    body = found.group(0)
    bare = body.lstrip("+-").lower()
    if bare.startswith("0x"):
        mantissa, _, exponent = bare[2:].partition("p")
        whole, _, frac = mantissa.partition(".")
        digits = int((whole + frac) or "0", 16)
        value = math.ldexp(digits, int(exponent or "0") - 4 * len(frac))
    else:
        value = float(bare.split("(")[0])
    if body.startswith("-"):
        value = -value
    if math.isfinite(value) and (abs(value) > FLT_MAX or (value != 0 and abs(value) < FLT_MIN)):
        raise ValueError(f"stof: {text!r} is out of range")
    return value


class Setting(NamedTuple):
    """One option's effective value and where it came from."""

    key: str
    value: str | bool | tuple[str, str]
    source: str  # "argv" or the environment variable's name
    argv_index: int | None = None  # index of the option name in argv (last occurrence)


class CommandLine(NamedTuple):
    tool: str
    argv: tuple[str, ...]
    settings: Mapping[str, Setting]
    unknown: tuple[str, ...] = ()  # options llama.cpp will reject; passed through untouched
    env_overridden: tuple[str, ...] = ()  # env twins a flag on argv beats
    usage_errors: tuple[str, ...] = ()  # what makes llama.cpp's parser print usage and exit 1
    # argv positions of the words llama.cpp rejects: unknown ones, and an option short of its values with
    # the word after it
    rejected_at: tuple[int, ...] = ()

    @property
    def known_argv(self) -> tuple[str, ...]:
        """argv without the words llama.cpp would reject: its options, each with its values."""
        dropped = set(self.rejected_at)
        return tuple(word for i, word in enumerate(self.argv) if i not in dropped)

    @property
    def loads_no_model(self) -> bool:
        """llama.cpp answers from its parser alone: help, version, device list, completion, or a usage error."""
        return bool(self.usage_errors) or any(key in self.settings for key in NO_MODEL_OPTIONS)

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
        return (raw in _TRUTHY), spec.env
    if spec.kind == "bool":
        return (raw in _TRUTHY) if raw in (_TRUTHY | _FALSY) else raw, spec.env
    return raw, spec.env


def parse(tool: str, argv: Sequence[str], env: Mapping[str, str], table: ArgTable | None = None) -> CommandLine:
    """Read argv and the LLAMA_ARG_* environment the way llama.cpp's common_params_parse does."""
    table = table or arg_table(tool)
    settings: dict[str, Setting] = {}
    errors: list[str] = []
    for spec in table.specs:
        found = _env_value(spec, env)
        if found is not None:
            settings[spec.key] = Setting(spec.key, found[0], found[1])
            problem = _value_error(spec, found[0])
            if problem:
                errors.append(f"{found[1]}: {problem}")
    unknown: list[str] = []
    rejected_at: list[int] = []
    overridden: list[str] = []
    i = 0
    while i < len(argv):
        name = _normalise(argv[i])
        entry = table.by_name.get(name)
        if entry is None:
            unknown.append(argv[i])
            rejected_at.append(i)
            errors.append(f"invalid argument: {argv[i]}")
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
                rejected_at.extend(range(i, len(argv)))
                errors.append(f"{argv[i]}: expected a value")
                break
            value = argv[i + 1]
            problem = _value_error(spec, value)
            if problem:
                errors.append(f"{argv[i]}: {problem}")
            step = 2
        else:
            if i + 2 >= len(argv):
                unknown.append(argv[i])
                rejected_at.extend(range(i, len(argv)))
                errors.append(f"{argv[i]}: expected two values")
                break
            value = (argv[i + 1], argv[i + 2])
            step = 3
        settings[spec.key] = Setting(spec.key, value, "argv", i)
        i += step
    return CommandLine(
        tool, tuple(argv), settings, tuple(unknown), tuple(overridden), tuple(errors), tuple(rejected_at)
    )


def misread_numbers(cmd: CommandLine, table: ArgTable | None = None) -> tuple[str, ...]:
    """One line for each whole-number value llama.cpp reads as another number (std::stoi stops at the first
    character that is not a digit: -c 4k is 4, 0x10 is 0), naming where it was set (the option as typed, or
    its LLAMA_ARG_* variable)."""
    table = table or arg_table(cmd.tool)
    specs = {spec.key: spec for spec in table.specs}
    lines = []
    for setting in cmd.settings.values():
        spec = specs.get(setting.key)
        if spec is None or spec.value_type != "int" or not isinstance(setting.value, str):
            continue
        text = setting.value.lstrip(_C_SPACE)
        found = _INT_RE.match(text)
        if found is None or found.end() == len(text):
            continue  # a number as written, or one llama.cpp refuses (usage_errors says it)
        if setting.source == "argv" and setting.argv_index is not None:
            where = f"{cmd.argv[setting.argv_index]} {setting.value}"
        else:
            where = f"{setting.source}={setting.value}"
        lines.append(f"{where} is read by llama.cpp as {int(found.group(0))}")
    return tuple(lines)


def read_gpu_layers(value: str) -> int:
    """-ngl / -ngld: 'auto' is -1, 'all' is -2, else std::stoi."""
    return {"auto": -1, "all": -2}.get(value) or stoi(value)


def read_tensor_split(value: str) -> tuple[float, ...]:
    """-ts: proportions split on runs of ',' and '/', each read with std::stof."""
    return tuple(stof(part) for part in re.split(r"[,/]+", value))


def _one_of(*names: str) -> Callable[[str], object]:
    def check(value: str) -> object:
        if value not in names:
            raise ValueError("invalid value")
        return value

    return check


# String options whose handler reads the value itself and throws on a bad one (common/arg.cpp).
_STRING_READERS: dict[str, Callable[[str], object]] = {
    "--gpu-layers": read_gpu_layers,
    "--spec-draft-ngl": read_gpu_layers,
    "--tensor-split": read_tensor_split,
    "--split-mode": _one_of("none", "layer", "row", "tensor"),
    "--flash-attn": _one_of(*sorted(_TRUTHY | _FALSY | {"auto", "-1"})),
    "--cache-type-k": _one_of(*CACHE_TYPES),
    "--cache-type-v": _one_of(*CACHE_TYPES),
    "--spec-draft-type-k": _one_of(*CACHE_TYPES),
    "--spec-draft-type-v": _one_of(*CACHE_TYPES),
    "--load-mode": _one_of("auto", "none", "mmap", "mlock", "mmap+mlock", "dio"),
}


def _value_error(spec: OptionSpec, value: str | bool | tuple[str, str]) -> str | None:
    """Why llama.cpp's parser rejects this value (an int option's std::stoi, a string handler's own
    reading), or None."""
    if isinstance(value, str) and spec.kind == "bool":
        return f"invalid boolean value {value!r}"  # parse_bool_value on an environment twin
    if not isinstance(value, str) or spec.kind != "value":
        return None
    reader = stoi if spec.value_type == "int" else _STRING_READERS.get(spec.key)
    if reader is None:
        return None
    try:
        reader(value)
    except ValueError as err:
        return str(err)
    return None


def value_checked(spec: OptionSpec) -> bool:
    """A value llama.cpp's parser may reject (see _value_error)."""
    return spec.kind == "value" and (spec.value_type == "int" or spec.key in _STRING_READERS)


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


class Secrets(NamedTuple):
    options: frozenset[str]  # every spelling of a secret option
    env: frozenset[str]
    env_fragments: tuple[str, ...]


@cache
def secrets(tool: str = "server", path: Path | None = None, keep_in: Path | None = None) -> Secrets:
    """configs/secrets.toml, each option widened to all its names in the option table. keep_in: the cache folder
    where its parse is kept (state.load_toml): a launch and a plan then go without importing tomllib."""
    from safe_llama import state

    raw = state.load_toml(path or packaged_configs() / "secrets.toml", keep_in)
    named = {_normalise(str(o)) for o in raw["options"]}
    table = arg_table(tool)
    options = set(named)
    for spec in table.specs:
        if named & set(spec.names):
            options |= set(spec.names)
    return Secrets(frozenset(options), frozenset(map(str, raw["env"])), tuple(map(str, raw["env_fragments"])))


def redact_argv(argv: Sequence[str], tool: str = "server", keep_in: Path | None = None) -> list[str]:
    """argv safe to print: the value of every secret option replaced (--opt VALUE and --opt=VALUE)."""
    return mask_values(argv, secrets(tool, keep_in=keep_in).options, REDACTED)


def secret_env(name: str, keep_in: Path | None = None) -> bool:
    """Whether the variable `name` holds a secret (configs/secrets.toml: its names and fragments)."""
    found = secrets(keep_in=keep_in)
    return name in found.env or any(fragment in name for fragment in found.env_fragments)


def redact_env(env: Mapping[str, str], keep_in: Path | None = None) -> dict[str, str]:
    return {k: (REDACTED if secret_env(k, keep_in) else v) for k, v in env.items()}


def secret_values(argv: Sequence[str], tool: str = "server", env: Mapping[str, str] | None = None) -> set[str]:
    """The secrets themselves: the values of the secret options in argv (`--api-key K`, `--api-key=K`, every
    spelling) and of the secret variables in env; for scrubbing them from text that quotes them anywhere."""
    found = {v for k, v in (env or {}).items() if v and secret_env(k)}
    for word, shown in zip(argv, redact_argv(argv, tool), strict=True):
        if shown != word:
            found.add(word.partition("=")[2] if shown.endswith(f"={REDACTED}") else word)
    return found - {""}
