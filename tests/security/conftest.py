"""Running safe-llama as a normal user (`nobody`, through setpriv) in folders laid out as an attacker would."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent.parent
NOBODY = 65534
OTHER = 40001  # another normal user (no name needed): the attacker
AS_NOBODY = ["setpriv", f"--reuid={NOBODY}", f"--regid={NOBODY}", "--clear-groups", "--no-new-privs", "--"]


@pytest.fixture
def base(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """A folder every user can traverse (pytest's own are root's 0700), removed afterwards."""
    if os.geteuid() != 0:
        pytest.skip("needs root to run safe-llama as another user")
    import shutil
    import tempfile

    folder = Path(tempfile.mkdtemp(prefix="safe-llama-security-"))
    os.chmod(folder, 0o755)  # noqa: S103 (nobody must reach the folders inside)
    yield folder
    shutil.rmtree(folder)


def owned(path: Path, uid: int, mode: int) -> Path:
    """Make path a folder (if missing) owned by uid, with mode."""
    path.mkdir(parents=True, exist_ok=True)
    os.chown(path, uid, uid)
    os.chmod(path, mode)
    return path


def run_as_nobody(args: list[str], env: dict[str, str], timeout: float = 60) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*AS_NOBODY, sys.executable, "-m", "safe_llama", *args],
        env={"PATH": "/usr/bin:/bin", "PYTHONPATH": str(ROOT), "HOME": "/nonexistent", **env},
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
        cwd="/",
    )


def plant_binary(cache_root: Path, marker: Path, uid: int = OTHER) -> Path:
    """A 'pinned build' of llama-completion that, when run, writes marker (it stands for whatever an attacker
    would run as the victim: no real llama.cpp can show it)."""
    build = cache_root / "llama.cpp" / "11434.0.0" / "cpu"
    (build / "bin").mkdir(parents=True)
    fake = build / "bin" / "llama-completion"
    fake.write_text(f"#!/bin/sh\necho ran-as-$(id -u) > {marker}\n")
    fake.chmod(0o755)
    (build / ".complete").write_text("")
    for path in [cache_root, *cache_root.rglob("*")]:
        os.lchown(path, uid, uid)
    return fake
