"""What the supervisor learns of one child's start-up and end: the watcher of its start-up output (failure
signatures, the ready actions) with its verdict, and how the run ended (Outcome, its exit code).

Owns those values and the watcher's reading of the output through diagnosis's scanner. Must not touch the child
(supervise.py does) nor decide whether to retry (attempts/ does: Outcome.retry is the question it asks).
"""

from __future__ import annotations

import enum
from collections.abc import Callable
from dataclasses import dataclass

from safe_llama.diagnosis.signatures import Failure, Match, Scanner, SignatureTable, classify, cut_short
from safe_llama.process.relay import Stream


class Verdict(enum.Enum):
    CONTINUE = "continue"
    STOP_FAILED = "stop_failed"  # an allocation failure was printed: stop the child, report a failure


@dataclass(frozen=True)
class Outcome:
    """How one child run ended, and what the wrapper should do about it."""

    exit_code: int  # what the wrapper should exit with: the child's N, or 128+N for death by signal N
    returncode: int  # subprocess's convention: N, or -N for death by signal N
    ready: bool  # start-up finished (after that nothing was scanned, nothing may be retried)
    failure: Failure | None  # why start-up failed; None if ready, clean, or stopped by the user
    stopped_by_us: bool  # we signalled the child because of a STOP_FAILED verdict
    user_stop_signal: int | None  # SIGTERM/SIGHUP/SIGINT/SIGQUIT the user sent: never retry
    signals_forwarded: tuple[int, ...]  # every signal passed on to the child, in order
    pid: int
    used_pty: bool
    # killed by SIGKILL after it was ready while a memory counter rose (the OOM killer): the counter, in words
    killed_for_memory: str | None = None
    # killed by SIGKILL not ours nor asked for, with no evidence that names it (probe_host.OomWatch): why, in words
    killed_without_evidence: str | None = None

    @property
    def retry(self) -> bool:
        """The one question of the retry loop: did start-up fail for lack of memory?"""
        return self.failure is not None and self.failure.memory and self.user_stop_signal is None


class StartupWatcher:
    """Sees the child's output during start-up, every chunk after it was passed on: scans it for error
    signatures (one line scanner per stream; table None: scans nothing, the child's failures are its own
    messages and exit code), and calls on_ready (the attempt's ready actions) once start-up is over.

    Answers STOP_FAILED at the first allocation failure: the child may go on running after one (the
    OpenVINO GPU plugin does) and then cannot serve.
    """

    def __init__(self, table: SignatureTable | None, on_ready: Callable[[], None] | None = None) -> None:
        self._table = table
        self._on_ready = on_ready
        self._scanners: dict[Stream, Scanner] = {}
        self.matches: list[Match] = []

    def output(self, stream: Stream, data: bytes) -> Verdict:
        if self._table is None:
            return Verdict.CONTINUE
        scanner = self._scanners.get(stream)
        if scanner is None:
            scanner = self._scanners[stream] = Scanner(self._table)
        found = scanner.feed(data)
        self.matches.extend(found)
        return Verdict.STOP_FAILED if any(m.category == "alloc" for m in found) else Verdict.CONTINUE

    def ready(self) -> None:
        """Start-up is over: output() will not be called again."""
        self._scanners.clear()
        if self._on_ready is not None:
            self._on_ready()

    def conclude(self, returncode: int | None, oom_evidence: str | None = None) -> Failure | None:
        """The child ended before readiness (returncode None: we stopped it): what failed, if anything.
        oom_evidence: what names it as the OOM killer's victim (probe_host.OomWatch), if anything does."""
        if self._table is None:
            return None
        for scanner in self._scanners.values():
            self.matches.extend(scanner.close())
        # llama.cpp logs to stderr (a pty or 2>&1: the one combined stream)
        log = self._scanners.get(Stream.STDERR) or self._scanners.get(Stream.COMBINED)
        cut = log is not None and cut_short(log.last_line)
        self._scanners.clear()
        return classify(self.matches, returncode, oom_evidence=oom_evidence, cut=cut)
