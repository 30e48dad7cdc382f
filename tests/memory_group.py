"""A fresh memory cgroup for a test (v2 with the memory controller, else v1), the one way tests make one: limited,
joinable (a child can enter it), removed after; skipped where this machine refuses (not root, no controller)."""

from __future__ import annotations

import os
import subprocess
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest


def make_group(limit: int) -> Path:
    """A new memory cgroup limited to `limit` bytes (OSError where it cannot be made)."""
    name = f"safe-llama-test-{os.getpid()}-{time.monotonic_ns()}"
    v2 = Path("/sys/fs/cgroup/cgroup.controllers")
    if v2.is_file() and "memory" in v2.read_text():
        folder = Path("/sys/fs/cgroup") / name
        folder.mkdir()
        (folder / "memory.max").write_text(str(limit))
        return folder
    folder = Path("/sys/fs/cgroup/memory") / name
    folder.mkdir()
    (folder / "memory.limit_in_bytes").write_text(str(limit))
    return folder


def entering(folder: Path) -> Callable[[], None]:
    """A preexec_fn that puts the child into the group."""

    def enter() -> None:
        (folder / "cgroup.procs").write_text(str(os.getpid()))

    return enter


@contextmanager
def memory_group(limit: int) -> Iterator[Path]:
    try:
        folder = make_group(limit)
    except OSError as err:
        pytest.skip(f"this machine does not allow creating a memory cgroup: {err}")
    try:  # a process must be able to join it (cgroup v2's no-internal-process rule, delegation)
        subprocess.run(["true"], preexec_fn=entering(folder), check=True, timeout=30)
    except (OSError, subprocess.SubprocessError) as err:
        folder.rmdir()
        pytest.skip(f"this machine does not let a process join a new memory cgroup: {err}")
    try:
        yield folder
    finally:
        for _ in range(50):
            try:
                folder.rmdir()
                break
            except OSError:
                time.sleep(0.1)


def oom_kills(folder: Path) -> int:
    """The group's OOM kills so far (v2 memory.events, v1 memory.oom_control)."""
    for name in ("memory.events", "memory.oom_control"):
        path = folder / name
        if path.is_file():
            for line in path.read_text().splitlines():
                if line.startswith("oom_kill "):
                    return int(line.split()[1])
    return 0
