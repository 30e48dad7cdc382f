"""safe-llama's own lines in a log: what a launch said on stderr around llama.cpp's output (its plan, a
retry, the line it exited with), in any of its formats (text, the journal's `<N>` prefix, journalctl's
`unit[pid]: `, JSON records). Owns telling them from llama.cpp's lines and naming them: by the patterns
built from their templates (safe_llama/messages.py's LINES), with configs/own-lines.toml's entry of each id
(which exit code the line ends safe-llama with, which is a retry, and its words).
Pure but for loading the table; must not decide what to advise (commands/explain does) or plan.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, get_args

from safe_llama.errors import ExitStatus, SafeLlamaError
from safe_llama.messages import LINES, PREFIX

Kind = Literal["exit", "retry"]
KINDS: tuple[str, ...] = get_args(Kind)
WORDS = ("what", "why", "fix")

# "safe-llama: " at the start of a line, after the journal's priority (<3>) or journalctl's "unit[pid]: "
_PREFIX = re.compile(rf"^(?:<\d>|\S+\[\d+\]: )?{re.escape(PREFIX)}(?P<text>.*)$")


@dataclass(frozen=True)
class OwnPattern:
    id: str
    kind: Kind
    exit: int | None  # the code safe-llama leaves with after this line (kind exit)
    pattern: re.Pattern[str]
    words: Mapping[str, str] = field(default_factory=dict)  # what, why, fix: {field} placeholders


@dataclass(frozen=True)
class OwnTable:
    patterns: tuple[OwnPattern, ...] = ()

    def match(self, text: str, number: int) -> OwnLine:
        for entry in self.patterns:
            found = entry.pattern.search(text)
            if found is not None:
                groups = {k: v for k, v in found.groupdict().items() if v is not None}
                return OwnLine(text, number, entry.id, entry.kind, entry.exit, groups)
        return OwnLine(text, number)


@dataclass(frozen=True)
class OwnLine:
    """One line safe-llama wrote, without its prefix; what the table says it is, if it knows it."""

    text: str
    number: int  # the line's number in the log
    pattern_id: str | None = None
    kind: Kind | None = None
    exit: int | None = None
    groups: Mapping[str, str] = field(default_factory=dict)


def own_text(line: str) -> str | None:
    """The text of a line safe-llama wrote (its `safe-llama: ` prefix removed), or None for anyone else's."""
    if line.startswith("{") and '"safe-llama"' in line:
        try:
            record = json.loads(line)
        except ValueError:
            return None
        message = record.get("msg") if isinstance(record, dict) and record.get("source") == "safe-llama" else None
        return message if isinstance(message, str) else None
    found = _PREFIX.match(line)
    return found.group("text") if found is not None else None


def _entry(raw: Any, where: str) -> tuple[str, Kind, int | None, dict[str, str]]:
    if not isinstance(raw, dict) or not isinstance(raw.get("id"), str):
        raise SafeLlamaError(f"safe-llama: {where}: each [[line]] needs an id", ExitStatus.BAD_CONFIG)
    where = f"{where}: line '{raw['id']}'"
    if raw["id"] not in {line.id for line in LINES}:
        raise SafeLlamaError(
            f"safe-llama: {where}: not one of safe-llama's own lines (safe_llama/messages.py)", ExitStatus.BAD_CONFIG
        )
    unknown = set(raw) - {"id", "kind", "exit", *WORDS}
    if unknown:
        raise SafeLlamaError(f"safe-llama: {where}: unknown key(s) {', '.join(sorted(unknown))}", ExitStatus.BAD_CONFIG)
    kind, code = raw.get("kind", "exit"), raw.get("exit")
    if kind not in KINDS or (kind == "exit") != isinstance(code, int):
        raise SafeLlamaError(
            f"safe-llama: {where}: kind must be exit (with an exit code) or retry (without)", ExitStatus.BAD_CONFIG
        )
    if code is not None and code not in {int(s) for s in ExitStatus}:
        raise SafeLlamaError(f"safe-llama: {where}: exit {code} is not one of safe-llama's", ExitStatus.BAD_CONFIG)
    words = {k: raw[k] for k in WORDS if k in raw}
    if any(not isinstance(v, str) for v in words.values()):
        raise SafeLlamaError(f"safe-llama: {where}: what, why and fix must be text", ExitStatus.BAD_CONFIG)
    return raw["id"], kind, code, words


def parse_own_table(raw: Mapping[str, Any], where: str) -> OwnTable:
    """The lines of safe_llama/messages.py in its order, each with its entry's kind, exit and words; a line
    without an entry is not named."""
    entries = raw.get("line", [])
    if not isinstance(entries, list):
        raise SafeLlamaError(f"safe-llama: {where}: 'line' must be an array of tables", ExitStatus.BAD_CONFIG)
    said = {entry[0]: entry for entry in (_entry(e, where) for e in entries)}
    return OwnTable(
        tuple(
            OwnPattern(line.id, said[line.id][1], said[line.id][2], line.pattern, said[line.id][3])
            for line in LINES
            if line.id in said
        )
    )


def load_own_table(path: Path) -> OwnTable:
    import tomllib

    try:
        return parse_own_table(tomllib.loads(path.read_text(encoding="utf-8")), str(path))
    except OSError as err:
        raise SafeLlamaError(f"safe-llama: {path}: {err.strerror}", ExitStatus.BAD_CONFIG) from None
    except tomllib.TOMLDecodeError as err:
        raise SafeLlamaError(f"safe-llama: {path}: {err}", ExitStatus.BAD_CONFIG) from None
