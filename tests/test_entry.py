"""entry.run is the one dispatch: every command word, the launch and the help are decided there, each
command's options read from the one table (cmdline/own_options.py) without typer."""

from __future__ import annotations

import pytest

from safe_llama import entry
from safe_llama.cmdline import own_options


@pytest.mark.parametrize("command", own_options.COMMANDS.values(), ids=list(own_options.COMMANDS))
def test_every_command_s_module_has_its_runner(command: own_options.Command) -> None:
    """The row names a commands/ module whose main(settings, words) entry.run calls."""
    import importlib
    import inspect

    assert command.module.startswith("safe_llama.commands.")
    runner = importlib.import_module(command.module).main
    assert list(inspect.signature(runner).parameters) == ["settings", "words"]


def test_neither_a_launch_nor_the_help_imports_a_command() -> None:
    """The table names each command's module as text: entry.run imports it only when its word runs."""
    import subprocess
    import sys

    from tests import ROOT

    script = (
        "import sys; from safe_llama import entry; from safe_llama.cmdline.launch_args import split; "
        "split(['--min-ctx', '5', 'server', '-m', 'x.gguf']); entry.run(['plan', '--help']); "
        "entry.run(['--help']); print([m for m in sys.modules if m.startswith('safe_llama.commands')])"
    )
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, cwd=ROOT, check=True)
    assert done.stdout.splitlines()[-1] == "[]"


def test_doctor_gets_what_the_table_reads(monkeypatch: pytest.MonkeyPatch) -> None:
    from safe_llama.commands import doctor

    calls: list[dict[str, object]] = []

    def run_doctor(**call: object) -> int:
        calls.append(call)
        return 1

    monkeypatch.setattr(doctor, "run_doctor", run_doctor)
    assert entry.run(["doctor", "--refresh"]) == 1
    assert calls == [{"json_out": False, "refresh": True}]


def test_plan_gets_what_the_table_reads(monkeypatch: pytest.MonkeyPatch) -> None:
    from safe_llama.commands import plan

    calls: list[dict[str, object]] = []

    def run_plan(**call: object) -> int:
        calls.append(call)
        return 0

    monkeypatch.setattr(plan, "run_plan", run_plan)
    assert entry.run(["plan", "--json", "--min-ctx", "8192", "--ladder=ctx", "server", "-m", "x.gguf", "--json"]) == 0
    assert calls == [{"tool": "server", "args": ["-m", "x.gguf", "--json"],
                      "given": {"json": "1", "min_ctx": "8192", "ladder": "ctx"}}]  # fmt: skip


@pytest.mark.parametrize(
    ("args", "said"),
    [
        pytest.param(["plan", "--bogus", "server"], "safe-llama: --bogus: no such option", id="plan-unknown"),
        pytest.param(["plan", "--min-ctx", "many", "server"], "'many' is not a whole number", id="plan-number"),
        pytest.param(["plan", "servr"], "unknown tool 'servr'", id="plan-tool"),
        pytest.param(["plan"], "which tool?", id="plan-no-tool"),
        pytest.param(["--bogus", "server"], "safe-llama: --bogus: no such option", id="launch-unknown"),
        pytest.param(["--min-ctx"], "safe-llama: --min-ctx: needs a value", id="launch-no-value"),
        pytest.param(["--min-ctx", "5"], "which tool?", id="launch-no-tool"),
        pytest.param(["devices", "extra"], "devices: takes no arguments", id="devices-word"),
        pytest.param(["explain", "--tool", "x"], "unknown tool 'x'", id="explain-tool"),
        pytest.param(["bogus"], "unknown command 'bogus'", id="command"),
    ],
)
def test_bad_input_is_one_line_and_exit_2(args: list[str], said: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert entry.run(args) == 2
    err = capsys.readouterr().err
    assert said in err and err.count("\n") == 1, err


@pytest.mark.parametrize(
    ("args", "shown"),
    [
        pytest.param(["--help"], "Launcher options", id="root"),
        pytest.param([], "Launcher options", id="bare"),
        pytest.param(["--min-ctx", "5", "--help"], "Launcher options", id="launch"),
        pytest.param(["plan", "--help"], "--kv-single", id="plan"),
        pytest.param(["explain", "--help"], "--model", id="explain"),
    ],
)
def test_help(args: list[str], shown: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert entry.run(args) == (2 if not args else 0)  # bare: click's usage error, the help on stderr
    printed = capsys.readouterr()
    assert shown in (printed.err if not args else printed.out)


def test_version(capsys: pytest.CaptureFixture[str]) -> None:
    from safe_llama import __version__

    assert entry.run(["--version"]) == 0
    assert capsys.readouterr().out == f"safe-llama {__version__}\n"


def test_no_module_runs_anything_at_exit() -> None:
    """The console scripts end with os._exit once stdout and stderr are flushed (entry._end): sound only while
    nothing registers work for the interpreter's exit (atexit, or logging, which registers its shutdown)."""
    import ast

    from tests import ROOT

    found = []
    for path in sorted((ROOT / "safe_llama").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else []
            names += [node.module or ""] if isinstance(node, ast.ImportFrom) else []
            found += [f"{path.name}: {n}" for n in names if n.split(".")[0] in ("atexit", "logging")]
    assert found == []


@pytest.mark.parametrize(
    ("argv", "code", "out", "err"),
    [
        pytest.param(["--version"], 0, "safe-llama ", "", id="version"),
        pytest.param(["bogus"], 2, "", "unknown command 'bogus'", id="usage"),
    ],
)
def test_the_console_script_flushes_and_keeps_its_exit_code(argv: list[str], code: int, out: str, err: str) -> None:
    import subprocess
    import sys

    from tests import ROOT

    script = f"import sys; sys.argv = ['safe-llama', *{argv!r}]; from safe_llama.entry import main; main()"
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, cwd=ROOT, check=False)
    assert done.returncode == code and done.stdout.startswith(out) and err in done.stderr
    assert done.stdout.endswith("\n") or not out
