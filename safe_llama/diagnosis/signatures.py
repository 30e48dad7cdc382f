"""Error signatures: recognising llama.cpp's failure lines and deciding what a failed start means.

Owns the signature table (configs/signatures.toml plus a user's file: each row's pattern, category, stage and
the lesson it teaches), the incremental line scanner and the memory-or-not classification. Pure: no I/O but
reading the table files; must not launch or signal.

Over 400 lines on purpose: the table's loading and checking is half of it, and the scanner and the classification
share its Match and Failure; a split would only move those types.
"""

from __future__ import annotations

import codecs
import re
import signal
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, fields, replace
from pathlib import Path
from typing import Any, Literal, get_args

from safe_llama import state
from safe_llama.errors import ExitStatus, SafeLlamaError
from safe_llama.paths import packaged_configs
from safe_llama.plan.lessons import Lessons

Category = Literal["alloc", "context", "not_memory", "generic", "harmless"]
CATEGORIES: tuple[str, ...] = get_args(Category)

# What a failed start was. Memory kinds (a smaller plan may fix them): alloc, oom_killed, context.
# log_cut: an exit whose log ended before it said why (cut_short): the same start runs once more to read it.
FailureKind = Literal["alloc", "oom_killed", "context", "not_memory", "signal", "exit", "log_cut"]
MEMORY_KINDS: frozenset[str] = frozenset({"alloc", "oom_killed", "context"})
# What a row's `teaches` may name: a field of the one record of lessons (attempts/retry.py's LEARNERS fill them).
LESSON_FIELDS: tuple[str, ...] = tuple(f.name for f in fields(Lessons))

GROUPS = frozenset({"requested_bytes", "requested_mib", "limit_bytes", "buffer"})
# What a failed allocation was for, where a line says so: the retry sizes the next plan from it.
Stage = Literal["kv", "compute", "weights", "output", "thread", "worker"]
STAGES: tuple[str, ...] = get_args(Stage)
MIB = 1024 * 1024
# A longer line is matched on its first MAX_LINE characters, so memory stays bounded.
MAX_LINE = 16384

# llama.cpp's log prefix: an optional `M.SS.mmm.uuu ` timestamp, then the level letter. On a terminal a
# timestamped line can follow llama-cli's spinner on the same line, so that prefix is looked for anywhere.
_TIMESTAMP_PREFIX = re.compile(r"\d+\.\d\d\.\d{3}\.\d{3} [IWED] ")
_LEVEL_PREFIX = re.compile(r"^[IWED] ")
# Colours (CSI ... letter), OSC strings and two-byte escapes: present when the child writes to a pty.
ESCAPES = re.compile(r"\x1b\[[0-?]*[ -/]*[@-~]|\x1b\][^\x07\x1b]*(?:\x07|\x1b\\)?|\x1b[@-Z\\-_]")
_NEWLINE = re.compile(r"\r\n|\r|\n")


@dataclass(frozen=True)
class Signature:
    id: str
    category: Category
    pattern: re.Pattern[str]
    source: str = ""
    stage: Stage | None = None
    teaches: str | None = None  # the plan.lessons.Lessons field its numbers go to (attempts/retry.py's LEARNERS)


@dataclass(frozen=True)
class SignatureTable:
    """Signatures in the order they are tried on each line."""

    signatures: tuple[Signature, ...]

    def match_line(self, line: str) -> Match | None:
        """The first signature matching one clean line (prefix already removed), as a Match."""
        for sig in self.signatures:
            found = sig.pattern.search(line)
            if found is not None:
                return _to_match(sig, line, found.groupdict())
        return None


@dataclass(frozen=True)
class Match:
    """One output line that matched a signature, with the numbers it carried."""

    signature_id: str
    category: Category
    line: str  # the line as printed, without log prefix, colours or line ending
    requested_bytes: int | None = None
    limit_bytes: int | None = None
    buffer: str | None = None
    requested_is_estimate: bool = False  # requested_bytes was computed from a rounded MiB figure
    stage: Stage | None = None
    teaches: str | None = None


@dataclass(frozen=True)
class Failure:
    """Why a start failed. `memory` is the one question the retry loop asks: may a smaller plan fix it?"""

    kind: FailureKind
    memory: bool
    signature_id: str | None = None  # the deciding signature, if a line decided
    line: str | None = None  # the deciding line, for the user
    requested_bytes: int | None = None
    limit_bytes: int | None = None  # the device's largest single allocation, when it said so
    buffer: str | None = None
    signal: int | None = None  # the signal that ended the child, if one did
    evidence: str | None = None  # for a SIGKILL: the memory counter that rose (the OOM killer's trace)
    stage: Stage | None = None  # what the failed allocation was for, when a line of the start-up said
    teaches: tuple[str, ...] = ()  # the Lessons fields the start-up's lines name, in the order printed


def _to_match(sig: Signature, line: str, groups: Mapping[str, str | None]) -> Match:
    requested: int | None = None
    estimate = False
    if groups.get("requested_bytes"):
        requested = int(groups["requested_bytes"] or 0)
    elif groups.get("requested_mib"):
        requested = round(float(groups["requested_mib"] or 0) * MIB)
        estimate = True
    limit = groups.get("limit_bytes")
    return Match(
        signature_id=sig.id,
        category=sig.category,
        line=line,
        requested_bytes=requested,
        limit_bytes=int(limit) if limit else None,
        buffer=groups.get("buffer") or None,
        requested_is_estimate=estimate,
        stage=sig.stage,
        teaches=sig.teaches,
    )


def clean_line(raw: str) -> str:
    """A line as a person reads it: colours, trailing whitespace and llama.cpp's log prefix removed."""
    line = ESCAPES.sub("", raw).rstrip()
    stamped = _TIMESTAMP_PREFIX.search(line)
    if stamped is not None:
        return line[stamped.end() :]
    return _LEVEL_PREFIX.sub("", line, count=1)


# ---------------------------------------------------------------------------------------------------
# Loading the table
# ---------------------------------------------------------------------------------------------------


def default_table_path() -> Path:
    return packaged_configs() / "signatures.toml"


def _parse_entry(entry: Any, where: str) -> Signature:
    if not isinstance(entry, dict):
        raise SafeLlamaError(f"safe-llama: {where}: a [[signature]] must be a table", ExitStatus.BAD_CONFIG)
    unknown = set(entry) - {"id", "category", "regex", "source", "stage", "teaches"}
    if unknown:
        raise SafeLlamaError(f"safe-llama: {where}: unknown key(s) {', '.join(sorted(unknown))}", ExitStatus.BAD_CONFIG)
    sig_id, category, regex = entry.get("id"), entry.get("category"), entry.get("regex")
    if not isinstance(sig_id, str) or not sig_id:
        raise SafeLlamaError(f"safe-llama: {where}: a signature needs an id", ExitStatus.BAD_CONFIG)
    where = f"{where}: signature '{sig_id}'"
    if category not in CATEGORIES:
        raise SafeLlamaError(
            f"safe-llama: {where}: category must be one of {', '.join(CATEGORIES)}", ExitStatus.BAD_CONFIG
        )
    if not isinstance(regex, str) or not regex:
        raise SafeLlamaError(f"safe-llama: {where}: regex is missing", ExitStatus.BAD_CONFIG)
    try:
        pattern = re.compile(regex)
    except re.error as err:
        raise SafeLlamaError(f"safe-llama: {where}: bad regex: {err}", ExitStatus.BAD_CONFIG) from None
    bad_groups = set(pattern.groupindex) - GROUPS
    if bad_groups:
        raise SafeLlamaError(
            f"safe-llama: {where}: unknown named group(s) {', '.join(sorted(bad_groups))}; "
            f"known: {', '.join(sorted(GROUPS))}",
            ExitStatus.BAD_CONFIG,
        )
    stage = entry.get("stage")
    if stage is not None and stage not in STAGES:
        raise SafeLlamaError(f"safe-llama: {where}: stage must be one of {', '.join(STAGES)}", ExitStatus.BAD_CONFIG)
    teaches = entry.get("teaches")
    if teaches is not None and teaches not in LESSON_FIELDS:
        raise SafeLlamaError(
            f"safe-llama: {where}: teaches must name a field of the lessons: {', '.join(LESSON_FIELDS)}",
            ExitStatus.BAD_CONFIG,
        )
    source = entry.get("source", "")
    return Signature(id=sig_id, category=category, pattern=pattern, source=str(source), stage=stage, teaches=teaches)


def parse_table(text: str, where: str = "signatures") -> tuple[Signature, ...]:
    """The signatures of one TOML document, in file order. Invalid content raises BAD_CONFIG."""
    import tomllib

    try:
        raw = tomllib.loads(text)
    except tomllib.TOMLDecodeError as err:
        raise SafeLlamaError(f"safe-llama: {where}: {err}", ExitStatus.BAD_CONFIG) from None
    return parse_tables(raw, where)


def parse_tables(raw: Mapping[str, Any], where: str = "signatures") -> tuple[Signature, ...]:
    """The signatures of one TOML document already read, in file order. Invalid content raises BAD_CONFIG."""
    entries = raw.get("signature", [])
    if not isinstance(entries, list):
        raise SafeLlamaError(f"safe-llama: {where}: 'signature' must be an array of tables", ExitStatus.BAD_CONFIG)
    sigs = tuple(_parse_entry(entry, where) for entry in entries)
    seen: set[str] = set()
    for sig in sigs:
        if sig.id in seen:
            raise SafeLlamaError(f"safe-llama: {where}: duplicate signature id '{sig.id}'", ExitStatus.BAD_CONFIG)
        seen.add(sig.id)
    return sigs


def merge_tables(builtin: Sequence[Signature], user: Sequence[Signature]) -> SignatureTable:
    """User signatures first (they win on a line both match); a user id replaces the built-in one."""
    user_ids = {sig.id for sig in user}
    return SignatureTable(tuple(user) + tuple(sig for sig in builtin if sig.id not in user_ids))


def load_table(
    extra: Path | None = None, *, builtin: Path | None = None, keep_in: Path | None = None
) -> SignatureTable:
    """The packaged table, with a user's file of signatures (if given) tried first. keep_in: the cache folder
    where state.load_toml keeps the parsed files (a launch passes it: no tomllib on its path)."""
    builtin_path = builtin if builtin is not None else default_table_path()
    tables: list[tuple[Signature, ...]] = []
    for path in (builtin_path, extra):
        if path is None:
            continue
        try:
            raw = state.load_toml(path, keep_in)
        except OSError as err:
            raise SafeLlamaError(f"safe-llama: {path}: {err.strerror}", ExitStatus.BAD_CONFIG) from None
        except ValueError as err:
            raise SafeLlamaError(f"safe-llama: {path}: {err}", ExitStatus.BAD_CONFIG) from None
        tables.append(parse_tables(raw, str(path)))
    return merge_tables(tables[0], tables[1] if len(tables) > 1 else ())


# ---------------------------------------------------------------------------------------------------
# Scanning output
# ---------------------------------------------------------------------------------------------------


class Lines:
    """Turns one stream's chunks into lines, with memory bounded by max_line whatever the stream holds.

    Lines may be split anywhere across chunks, multi-byte characters included (an incremental UTF-8
    decoder, invalid bytes replaced). \\r\\n, \\r and \\n all end a line. A line longer than max_line
    characters keeps its first max_line characters (a gigabyte without a newline is one short line).
    """

    def __init__(self, *, max_line: int = MAX_LINE) -> None:
        self._max_line = max_line
        self._decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
        self._pending: list[str] = []
        self._pending_len = 0
        self._cr_pending = False  # the last chunk ended in \r: a \n first in the next one belongs to it

    def feed(self, data: bytes) -> list[str]:
        return self._text(self._decoder.decode(data, final=False))

    def close(self) -> list[str]:
        """Flush: the last line, even without a newline."""
        lines = self._text(self._decoder.decode(b"", final=True))
        if self._pending:
            lines.append("".join(self._pending))
            self._pending, self._pending_len = [], 0
        return lines

    def _text(self, text: str) -> list[str]:
        if not text:
            return []
        if self._cr_pending and text[0] == "\n":
            text = text[1:]
        self._cr_pending = text.endswith("\r")
        lines: list[str] = []
        start = 0
        for found in _NEWLINE.finditer(text):
            self._append(text, start, found.start())
            lines.append("".join(self._pending))
            self._pending, self._pending_len = [], 0
            start = found.end()
        self._append(text, start, len(text))
        return lines

    def _append(self, text: str, start: int, end: int) -> None:
        room = self._max_line - self._pending_len
        if room > 0 and end > start:
            piece = text[start : min(end, start + room)]
            self._pending.append(piece)
            self._pending_len += len(piece)


class Scanner:
    """Turns one output stream's chunks into Matches, line by line (Lines: memory bounded by max_line), and keeps
    the last line that was not blank (cut_short asks it)."""

    def __init__(self, table: SignatureTable, *, max_line: int = MAX_LINE) -> None:
        self._table = table
        self._lines = Lines(max_line=max_line)
        self.last_line: str | None = None

    def feed(self, data: bytes) -> list[Match]:
        return self._matches(self._lines.feed(data))

    def close(self) -> list[Match]:
        """Flush: the last line, even without a newline, is matched."""
        return self._matches(self._lines.close())

    def _matches(self, lines: list[str]) -> list[Match]:
        self.last_line = next((line for line in reversed(lines) if line.strip()), self.last_line)
        pieces = [piece for line in lines for piece in _pieces(line)]
        found = (self._table.match_line(line) for line in map(clean_line, pieces) if line)
        return [match for match in found if match is not None]


def _pieces(line: str) -> list[str]:
    """A line as the writers that put it together: text another writer left without its newline (the C++ runtime's
    `  what():  Resource temporarily unavailable` before an abort, llama-cli's spinner) and the timestamped log line
    llama.cpp's logger thread wrote right after it (seen in CI: the std-thread-create line lost to that)."""
    bare = ESCAPES.sub("", line)
    stamped = _TIMESTAMP_PREFIX.search(bare)
    if stamped is None or not bare[: stamped.start()].strip():
        return [line]
    return [bare[: stamped.start()], bare[stamped.start() :]]


def cut_short(last_line: str | None) -> bool:
    """llama.cpp's log ended before it said why the start failed: its last line is a timestamped info, warning or
    debug line. llama.cpp logs from a worker thread that its exit does not wait for (common/log.cpp leaks the
    logger on purpose), so a process that exits within milliseconds of its error can lose the log's last lines
    (here: 5 of 200 llama-completion starts that failed to allocate their KV under RLIMIT_AS ended at `load the
    model`); a failed start's last words are E lines. Without the timestamps (--no-log-timestamps or
    --no-log-prefix) this cannot be told: False."""
    if last_line is None:
        return False
    line = ESCAPES.sub("", last_line).rstrip()
    stamped = _TIMESTAMP_PREFIX.search(line)
    return stamped is not None and line[stamped.end() - 2] != "E"


def scan_text(table: SignatureTable, data: bytes) -> list[Match]:
    """All matches in a whole output at once (fixtures, tests)."""
    scanner = Scanner(table)
    return scanner.feed(data) + scanner.close()


# ---------------------------------------------------------------------------------------------------
# Classifying a failed start
# ---------------------------------------------------------------------------------------------------


def _first(matches: Iterable[Match], categories: set[str]) -> Match | None:
    return next((m for m in matches if m.category in categories), None)


def _memory_failure(kind: FailureKind, decisive: Match | None, matches: Sequence[Match], sig: int | None) -> Failure:
    allocs = [m for m in matches if m.category == "alloc"]
    if decisive is not None and decisive.category == "alloc":
        allocs.remove(decisive)
        allocs.insert(0, decisive)
    exact = next((m.requested_bytes for m in allocs if m.requested_bytes and not m.requested_is_estimate), None)
    estimate = next((m.requested_bytes for m in allocs if m.requested_bytes), None)
    return Failure(
        kind=kind,
        memory=True,
        signature_id=decisive.signature_id if decisive else None,
        line=decisive.line if decisive else None,
        requested_bytes=exact if exact is not None else estimate,
        limit_bytes=next((m.limit_bytes for m in allocs if m.limit_bytes), None),
        buffer=next((m.buffer for m in allocs if m.buffer), None),
        signal=sig,
        stage=next((m.stage for m in matches if m.stage and m.category in ("alloc", "context")), None),
        teaches=tuple(dict.fromkeys(m.teaches for m in matches if m.teaches and m.category in ("alloc", "context"))),
    )


def classify(
    matches: Sequence[Match], returncode: int | None, *, oom_evidence: str | None = None, cut: bool = False
) -> Failure | None:
    """What a start that ended before readiness means.

    returncode follows subprocess: N for exit(N), -N for death by signal N, None when the child was
    still running and was stopped because an allocation error had been printed. None is returned for a
    clean exit (0) or a still-running child with nothing to report. oom_evidence: the evidence that
    named the child while it ran (probe_host.OomWatch: its own group's counter, or the kernel's line for its pid),
    the only sign that a SIGKILL was the OOM killer's.

    Rules, in order: the first alloc or not_memory line printed decides (a generic line, an assertion,
    never does: an alloc line anywhere after it still does); else a generic line is not memory; else
    SIGKILL with evidence is the OOM killer (oom_killed, memory); else a signal is a crash or a stop,
    a user's `kill -9` included (not memory); else a generic context failure is memory; else a non-zero
    exit is not memory: log_cut where cut (cut_short of the log's last line), exit otherwise.
    """
    if returncode == 0:
        return None
    sig = -returncode if returncode is not None and returncode < 0 else None
    decisive = _first(matches, {"alloc", "not_memory"})
    if decisive is not None and decisive.category == "alloc":
        return _memory_failure("alloc", decisive, matches, sig)
    if decisive is not None:
        return Failure(
            kind="not_memory",
            memory=False,
            signature_id=decisive.signature_id,
            line=decisive.line,
            signal=sig,
        )
    generic = _first(matches, {"generic"})
    if generic is not None:
        return Failure(
            kind="not_memory", memory=False, signature_id=generic.signature_id, line=generic.line, signal=sig
        )
    if sig == signal.SIGKILL and oom_evidence is not None:
        killed = _memory_failure("oom_killed", None, matches, sig)
        return replace(killed, line=f"killed by SIGKILL while {oom_evidence}", evidence=oom_evidence)
    if sig is not None:
        return Failure(kind="signal", memory=False, signal=sig)
    context = _first(matches, {"context"})
    if context is not None:
        return _memory_failure("context", context, matches, None)
    if returncode is None:
        return None
    return Failure(kind="log_cut" if cut else "exit", memory=False)
