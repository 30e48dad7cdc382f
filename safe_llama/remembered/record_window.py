"""The window of a launch record: what one launch reads while it resolves its options, finds the binary and
plans (up to attempt 1's spawn), watched as it happens: every file opened and folder listed (an audit hook),
every environment variable read and prefix scanned (a mapping that notes each read), every line on stderr that
is not one of the plan's reasons (fast_record.py says why the record needs all of it).

Owns the window (Recorder) and what it notes; must not judge what it saw (fast_record.py does) and must stay
out of the way: what it notes changes nothing the launch reads or writes.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator, Mapping
from typing import Any, TextIO

from safe_llama.remembered import early

_PSEUDO_ROOTS = ("/proc/", "/sys/", "/dev/")
_active: list[Recorder] = []  # the window open now (at most one)
_hooked: list[bool] = []


def _audit(event: str, args: tuple[Any, ...]) -> None:
    if not _active or event not in ("open", "os.listdir", "os.scandir"):
        return
    where = args[0] if args else None
    if isinstance(where, (str, bytes, os.PathLike)):
        path = os.fsdecode(where)
        _active[0].opened.append((event, os.path.abspath(path)))


class Recorder:
    """What one launch reads while it plans (see the module's docstring)."""

    def __init__(self, env: Mapping[str, str]) -> None:
        self.raw = env
        self.env = RecordingEnv(self)
        self.names: set[str] = set()
        self.prefix_scans: set[tuple[str, ...]] = set()
        self.everything = False
        self.opened: list[tuple[str, str]] = []  # (audit event, absolute path)
        self.stray = 0  # writes to stderr that are not the plan's reasons
        self.said: list[tuple[str, str]] = []
        self.saying = False
        self._stderr: TextIO | None = None
        self.at_close: dict[str, Any] = {}  # identities of the files opened, when the window closed

    def __enter__(self) -> Recorder:
        if not _hooked:
            sys.addaudithook(_audit)
            _hooked.append(True)
        _active[:] = [self]
        self._stderr = sys.stderr
        sys.stderr = _StderrTee(sys.stderr, self)
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        """The end of the window (attempt 1 is about to start)."""
        if _active and _active[0] is self:
            _active.clear()
            self.at_close = {p: early.identity(p) for e, p in self.opened if e == "open" and not pseudo(p)}
        if self._stderr is not None:
            sys.stderr = self._stderr
            self._stderr = None

    @property
    def open(self) -> bool:
        return bool(_active) and _active[0] is self

    def say(self, say: Any, message: str, level: str = "info") -> None:
        """A line the record holds and the early start says again."""
        self.said.append((message, level))
        self.saying = True
        try:
            say(message, level)
        finally:
            self.saying = False


class RecordingEnv(Mapping[str, str]):
    """The environment, noting what is read while the window is open (after it, reads are not inputs)."""

    def __init__(self, recorder: Recorder) -> None:
        self._recorder = recorder

    def _read(self, name: object) -> None:
        if isinstance(name, str) and self._recorder.open:
            self._recorder.names.add(name)

    def __getitem__(self, name: str) -> str:
        self._read(name)
        return self._recorder.raw[name]

    def __contains__(self, name: object) -> bool:
        self._read(name)
        return name in self._recorder.raw

    def get(self, name: str, default: Any = None) -> Any:
        self._read(name)
        return self._recorder.raw.get(name, default)

    def __iter__(self) -> Iterator[str]:
        if self._recorder.open:
            self._recorder.everything = True
        return iter(self._recorder.raw)

    def __bool__(self) -> bool:  # `env or {}`: whether it is empty is not a read of its contents
        return bool(self._recorder.raw)

    def __len__(self) -> int:
        if self._recorder.open:
            self._recorder.everything = True
        return len(self._recorder.raw)

    def whole(self) -> dict[str, str]:
        """All of it for a child whose answer is cached under a prefix scan (cmdline.env_scan.whole)."""
        return dict(self._recorder.raw)

    def prefixed(self, prefixes: tuple[str, ...]) -> dict[str, str]:
        """The variables whose names start with one of prefixes (cmdline.env_scan): a scan of those only."""
        if self._recorder.open:
            self._recorder.prefix_scans.add(tuple(prefixes))
        return {k: v for k, v in self._recorder.raw.items() if k.startswith(prefixes)}


class _StderrTee:
    def __init__(self, inner: TextIO, recorder: Recorder) -> None:
        self._inner = inner
        self._recorder = recorder

    def write(self, text: str) -> int:
        if text and not self._recorder.saying and self._recorder.open:
            self._recorder.stray += 1
        return self._inner.write(text)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)


def pseudo(path: str) -> bool:
    """A path under /proc, /sys or /dev: its identity changes on every read, so it is no input to hold."""
    return path.startswith(_PSEUDO_ROOTS)
