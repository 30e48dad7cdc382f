"""The facts of many models at once, each header read once: one index file under the cache folder keyed by each
file's path, size and mtime, so a scan of a hundred models reads one small file instead of a hundred headers.

Owns that index: its place (cache_dir/models/index.json, private, written atomically by state.py), its bounds
(MAX_ENTRIES entries, MAX_BYTES read; the least recently seen dropped first) and its validation (each entry's
facts through facts_from_json: a wrong one is read again from the model). Must not read headers itself
(model.facts does) nor decide what a problem means (the caller shows it).
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from safe_llama import state
from safe_llama.errors import SafeLlamaError
from safe_llama.model.facts import ModelFacts
from safe_llama.model.facts_cache import facts_from_json, facts_to_json
from safe_llama.model.header_facts import load_model_facts
from safe_llama.paths import cache_dir

FORMAT = 1
MAX_ENTRIES = 4096
MAX_BYTES = 256 << 20  # an index larger than this is not read (and is rewritten)


@dataclass(frozen=True)
class Read:
    """One file's facts, or why it has none (not GGUF, damaged): one line, never a traceback."""

    path: str
    size: int
    facts: ModelFacts | None
    problem: str | None
    cached: bool


def index_path(env: Mapping[str, str]) -> Path:
    return cache_dir(env) / "models" / "index.json"


def _load(where: Path) -> dict[str, dict[str, object]]:
    try:
        if where.stat().st_size > MAX_BYTES:
            return {}
    except OSError:
        return {}
    data = state.read_json(where)
    if not isinstance(data, dict) or data.get("format") != FORMAT or not isinstance(data.get("entries"), dict):
        return {}
    return {k: v for k, v in data["entries"].items() if isinstance(k, str) and isinstance(v, dict)}


def _key(st: os.stat_result) -> list[int]:
    return [st.st_size, st.st_mtime_ns]


def _problem_of(err: Exception) -> str:
    if isinstance(err, SafeLlamaError):
        # MODEL_PROBLEM's line: "safe-llama: PATH: PROBLEM"; the path is shown beside it already
        return err.message.removeprefix("safe-llama: ").split(": ", 1)[-1]
    return str(err) or type(err).__name__


def read_all(
    paths: Sequence[str],
    env: Mapping[str, str],
    *,
    progress: Callable[[int], None] | None = None,
    reader: Callable[[str], ModelFacts] = load_model_facts,
) -> list[Read]:
    """Each path's facts: from the index when its size and mtime are unchanged, else from its header (kept
    for the next scan). `progress(done)` after each file."""
    where = index_path(env)
    entries = _load(where)
    out: list[Read] = []
    changed = False
    for done, path in enumerate(paths, 1):
        try:
            st = os.stat(path)
        except OSError as err:
            out.append(Read(path, 0, None, err.strerror or "cannot be read", False))
            continue
        key = _key(st)
        entry = entries.get(path)
        read = None
        if entry is not None and entry.get("key") == key:
            with contextlib.suppress(KeyError, TypeError, ValueError):
                problem = entry.get("problem")
                if isinstance(problem, str):
                    read = Read(path, st.st_size, None, problem, True)
                else:
                    facts = facts_from_json(entry["facts"])  # type: ignore[arg-type]
                    if facts.path == path:
                        read = Read(path, st.st_size, facts, None, True)
        if read is not None:
            entries[path] = entries.pop(path)  # the most recently read stays longest
        else:
            try:
                facts = reader(path)
                read = Read(path, st.st_size, facts, None, False)
                entry = {"key": key, "facts": facts_to_json(facts)}
            except (SafeLlamaError, OSError, ValueError) as err:
                read = Read(path, st.st_size, None, _problem_of(err), False)
                entry = {"key": key, "problem": read.problem}
            entries.pop(path, None)
            entries[path] = entry
            changed = True
        out.append(read)
        if progress is not None:
            progress(done)
    if changed:
        kept = dict(list(entries.items())[-MAX_ENTRIES:])
        with contextlib.suppress(OSError):  # a read-only cache only costs speed
            state.write_json(where, {"format": FORMAT, "entries": kept})
    return out
