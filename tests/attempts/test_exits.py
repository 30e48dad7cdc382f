"""run.exits: every way out of a door as its documented exit code, one line on stderr and never a traceback
unless SAFE_LLAMA_DEBUG asks for one."""

from __future__ import annotations

import pytest

from safe_llama.attempts.exits import guarded
from safe_llama.errors import ExitStatus, SafeLlamaError


def _raise(err: BaseException) -> int:
    raise err


def test_the_body_s_own_code_passes_through(capsys: pytest.CaptureFixture[str]) -> None:
    assert guarded(lambda: 0) == 0
    assert guarded(lambda: 42) == 42  # a child's exit code, unchanged
    assert capsys.readouterr().err == ""


@pytest.mark.parametrize("status", [ExitStatus.BAD_CONFIG, ExitStatus.NOTHING_FITS, ExitStatus.NOT_FOUND])
def test_a_known_error_is_its_message_and_status(status: ExitStatus, capsys: pytest.CaptureFixture[str]) -> None:
    assert guarded(lambda: _raise(SafeLlamaError("safe-llama: it went wrong", status))) == int(status)
    assert capsys.readouterr() == ("", "safe-llama: it went wrong\n")


def test_an_interrupt_is_130_and_quiet(capsys: pytest.CaptureFixture[str]) -> None:
    assert guarded(lambda: _raise(KeyboardInterrupt())) == 130
    assert capsys.readouterr().err == ""


class _UsageError(Exception):
    """As typer's (vendored click's) usage errors: show() prints the usage, exit_code is set."""

    def __init__(self, exit_code: object) -> None:
        super().__init__("no such option: --nope")
        self.exit_code = exit_code
        self.shown = 0

    def show(self) -> None:
        self.shown += 1


def test_a_usage_error_is_shown_and_exits_2(capsys: pytest.CaptureFixture[str]) -> None:
    usage = _UsageError(2)
    assert guarded(lambda: _raise(usage)) == 2
    assert usage.shown == 1 and capsys.readouterr().err == ""


def test_something_with_show_but_no_exit_code_is_internal(capsys: pytest.CaptureFixture[str]) -> None:
    odd = _UsageError("2")
    assert guarded(lambda: _raise(odd)) == ExitStatus.INTERNAL
    assert odd.shown == 0 and "internal error" in capsys.readouterr().err


def test_the_unexpected_is_70_with_one_line(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.delenv("SAFE_LLAMA_DEBUG", raising=False)
    assert guarded(lambda: _raise(ZeroDivisionError("division by zero"))) == 70
    assert capsys.readouterr().err == (
        "safe-llama: internal error: ZeroDivisionError: division by zero (SAFE_LLAMA_DEBUG=1 for details)\n"
    )


def test_safe_llama_debug_adds_the_traceback(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("SAFE_LLAMA_DEBUG", "1")
    assert guarded(lambda: _raise(KeyError("k"))) == ExitStatus.INTERNAL
    err = capsys.readouterr().err
    assert err.startswith("Traceback (most recent call last):") and "KeyError: 'k'" in err
    assert err.endswith("safe-llama: internal error: KeyError: 'k' (SAFE_LLAMA_DEBUG=1 for details)\n")
