"""Tests for safe_llama/process/steady.py: the exit code of a child's end. Steady's loop itself runs in every
supervised test (tests/process/test_supervise.py, test_signals.py through supervise.py; test_handed.py in the
handed supervisor)."""

from __future__ import annotations

import pytest

from safe_llama.process.steady import exit_code_for


@pytest.mark.parametrize(("returncode", "code"), [(0, 0), (1, 1), (130, 130), (255, 255), (-9, 137), (-15, 143)])
def test_exit_code_for(returncode: int, code: int) -> None:
    assert exit_code_for(returncode) == code
