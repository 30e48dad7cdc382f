"""Tests for safe_llama/attempts/resume.py: the file a failed start handed off at the spawn leaves for the full
safe-llama, read back as attempt 1's outcome, and every way it is refused (its place, its owner's rights, its
shape and bounds). The capture is real llama-server output (tests/fixtures/logs/server-kv-oom.log)."""

from __future__ import annotations

import marshal
import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from safe_llama.attempts import resume
from safe_llama.constants import RESUME_ENV
from safe_llama.diagnosis.signatures import load_table
from tests import FIXTURES


@pytest.fixture
def env(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[dict[str, str]]:
    cache = tmp_path / "cache"
    (cache / "safe-llama").mkdir(parents=True, mode=0o700)
    monkeypatch.setenv("XDG_CACHE_HOME", str(cache))
    yield {"XDG_CACHE_HOME": str(cache)}
    os.environ.pop(RESUME_ENV, None)


def _capture() -> bytes:
    return (FIXTURES / "logs" / "server-kv-oom.log").read_bytes().split(b"\n", 1)[1]


def test_a_failed_start_is_read_back_as_the_full_supervisor_judges_it(env: dict[str, str]) -> None:
    path = resume.write(env, 1, None, {"stderr": bytearray(_capture()), "stdout": b""})
    assert path == resume.path_for(env, os.getpid()) and oct(os.stat(path).st_mode & 0o777) == "0o600"
    os.environ[RESUME_ENV] = path
    taken = resume.take({**env, RESUME_ENV: path})
    assert taken is not None and not os.path.exists(path) and RESUME_ENV not in os.environ
    outcome = resume.outcome(taken, load_table())
    assert (outcome.exit_code, outcome.ready, outcome.pid) == (1, False, os.getpid())
    assert outcome.failure is not None and outcome.failure.memory and outcome.failure.kind == "alloc"
    assert outcome.retry


def test_an_oom_kill_named_by_its_evidence_is_a_memory_failure(env: dict[str, str]) -> None:
    path = resume.write(env, -9, "the group's oom_kill rose", {"stderr": b"0.00.010.000 I srv load_model: x\n"})
    taken = resume.take({**env, RESUME_ENV: path})
    assert taken is not None
    failure = resume.outcome(taken, load_table()).failure
    assert failure is not None and failure.kind == "oom_killed" and failure.memory


def _written(env: dict[str, str], **changed: object) -> str:
    data: dict[str, object] = {"format": resume.FORMAT, "pid": os.getpid(), "returncode": 1, "evidence": "",
                               "outputs": [("stderr", b"x")]}  # fmt: skip
    data.update(changed)
    path = resume.path_for(env, os.getpid())
    Path(path).write_bytes(marshal.dumps(data))
    os.chmod(path, 0o600)
    return path


@pytest.mark.parametrize(
    "changed",
    [
        pytest.param({"pid": 1}, id="another-pid"),
        pytest.param({"format": 99}, id="another-format"),
        pytest.param({"returncode": 1 << 40}, id="returncode-out-of-range"),
        pytest.param({"evidence": "a\nb"}, id="evidence-unprintable"),
        pytest.param({"evidence": "e" * 600}, id="evidence-too-long"),
        pytest.param({"outputs": [("stderr", b"x" * (resume.MOST_OUTPUT + 1))]}, id="output-too-long"),
        pytest.param({"outputs": [("elsewhere", b"x")]}, id="output-of-no-stream"),
        pytest.param({"outputs": [("stderr", b"x")] * 3}, id="three-outputs"),
        pytest.param({"returncode": "1"}, id="returncode-not-a-number"),
    ],
)
def test_a_file_of_a_wrong_shape_or_bounds_is_refused(env: dict[str, str], changed: dict[str, object]) -> None:
    path = _written(env, **changed)
    assert resume.take({**env, RESUME_ENV: path}) is None
    assert not os.path.exists(path)  # read once, whatever it held


def test_only_this_process_s_file_in_the_cache_is_read(env: dict[str, str], tmp_path: Path) -> None:
    elsewhere = tmp_path / f"resume-{os.getpid()}.marshal"
    elsewhere.write_bytes(marshal.dumps({"format": resume.FORMAT}))
    assert resume.take({**env, RESUME_ENV: str(elsewhere)}) is None
    assert elsewhere.exists()  # not ours to remove: it is not where a resume file is kept
    path = _written(env)
    os.chmod(path, 0o666)  # noqa: S103 -- others could have written it: refused
    assert resume.take({**env, RESUME_ENV: path}) is None
    assert resume.take(env) is None  # none named


def test_the_argv_goes_through_the_environment_exactly(monkeypatch: pytest.MonkeyPatch) -> None:
    """Any word, spaces, an empty one and bytes that are no UTF-8 included; read once, then gone."""
    argv = ["/usr/bin/safe-llama", "server", "-m", "a model.gguf", "", "--api-key", os.fsdecode(b"\xff\xfe k")]
    monkeypatch.setenv(resume.ARGV_ENV, resume.argv_words(argv))
    assert resume.take_argv() == argv
    assert resume.ARGV_ENV not in os.environ and resume.take_argv() is None
    monkeypatch.setenv(resume.ARGV_ENV, "zz not hex")
    assert resume.take_argv() is None
