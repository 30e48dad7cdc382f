"""What safe-llama's own lines in a log say happened to the launch, for `safe-llama explain`: it ended with
one of safe-llama's exits (65 model, 67 nothing fits, 68 every retry failed, 69 an RPC worker, 127 no
binary), or a start failed and safe-llama's retry started it.

Owns that outcome in words (configs/own-lines.toml's, read by diagnosis.own_lines) with its fix. Pure; must not
read files or plan (a failure safe-llama already retried is not planned again).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Literal

from safe_llama.constants import TOOL_BINARY
from safe_llama.diagnosis.explain_words import Words, fill
from safe_llama.diagnosis.failed_run import FailedRun
from safe_llama.diagnosis.log_reading import LogReading
from safe_llama.diagnosis.own_lines import OwnLine
from safe_llama.diagnosis.remedies import Remedy, bytes_words
from safe_llama.diagnosis.signatures import Failure


@dataclass(frozen=True)
class OwnExplained:
    status: Literal["explained", "recovered"]
    what: str
    why: tuple[str, ...]
    line: str | None
    memory: bool
    remedies: tuple[Remedy, ...]
    notes: tuple[str, ...]
    exit: int | None  # the code safe-llama left with


def where_words(failure: Failure, backend: str | None) -> str:
    """Where the memory that was missing lives, as far as the failure and the backend tell."""
    buffer = failure.buffer or ""
    if buffer in ("", "CPU") and backend in (None, "cpu", "openvino") and failure.limit_bytes is None:
        return "host memory (RAM, a cgroup memory limit, or ulimit -v)"
    if failure.limit_bytes is not None:
        return "the device"
    return f"{buffer}'s memory" if buffer else "the device's memory"


def failure_what(failure: Failure, words: Words, backend: str | None, tool: str) -> str:
    """llama.cpp's failure in explain's words (its signature's `what`)."""
    said = words.for_signature(failure.signature_id, failure.kind if failure.kind != "oom_killed" else "alloc")
    values = {
        "requested": bytes_words(failure.requested_bytes), "limit": bytes_words(failure.limit_bytes),
        "buffer": failure.buffer or "device", "where": where_words(failure, backend), "tool": tool,
        "line": failure.line or "",
    }  # fmt: skip
    return fill(said.get("what", "it stopped"), values)


def _tool_words(run: FailedRun) -> str:
    """The tool, or llama.cpp when the log does not say which (safe-llama's own lines never name it)."""
    return "llama.cpp" if run.tool_from.startswith("not in the log") else TOOL_BINARY[run.tool]


def own_exit(
    reading: LogReading, ending: OwnLine, run: FailedRun, words: Words, own_words: Mapping[str, Mapping[str, str]]
) -> OwnExplained:
    """A log that ends with one of safe-llama's exits; what llama.cpp said before it (68) comes second."""
    said = own_words.get(ending.pattern_id or "", {})
    values = {**ending.groups, "tool": _tool_words(run), "line": ending.text}
    why = [fill(said["why"], values)] if said.get("why") else []
    failure = reading.failure
    if failure is not None and failure.memory:
        why.append(
            "the first failed start (llama.cpp's line): "
            + failure_what(failure, words, reading.facts.backend, TOOL_BINARY[run.tool])
        )
    retries = reading.retries
    if retries:
        attempts = ", ".join(r.groups.get("attempt", "?") for r in retries)
        why.append(f"retried after attempt(s) {attempts}, each time with a smaller plan")
    what = fill(said.get("what", "safe-llama stopped"), values)
    if ending.exit is not None and f"exit {ending.exit}" not in what:
        what += f" (exit {ending.exit})"
    return OwnExplained(
        status="explained",
        what=what,
        why=tuple(why),
        line=f"safe-llama: {ending.text}",
        memory=ending.exit in (67, 68),
        remedies=(Remedy("fix", fill(said["fix"], values), "", None),) if said.get("fix") else (),
        notes=(),
        exit=ending.exit,
    )


def recovered(reading: LogReading, run: FailedRun, words: Words) -> OwnExplained:
    """A start that failed, then started on safe-llama's retry: what failed, and what each retry changed."""
    retries = reading.retries
    failure = reading.failure
    binary = TOOL_BINARY[run.tool]
    why: list[str] = []
    if failure is not None:
        why.append(f"the first start failed: {failure_what(failure, words, reading.facts.backend, binary)}")
    why += [
        f"attempt {r.groups.get('attempt', '?')} failed, then retried: {r.groups.get('reason') or r.text}"
        for r in retries
    ]
    started = 1 + max(int(r.groups.get("attempt", "1")) for r in retries)
    return OwnExplained(
        status="recovered",
        what=f"{binary} failed to start, and safe-llama's retry started it (attempt {started})",
        why=tuple(why),
        line=failure.line if failure else None,
        memory=bool(failure and failure.memory),
        remedies=(),
        notes=(
            "nothing to do: safe-llama remembers the plan that started (per model, binary and device), so the next "
            "launch starts from it without the failed attempt (unless --no-remember; `safe-llama forget` drops it)",
        ),
        exit=None,
    )
