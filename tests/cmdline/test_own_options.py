"""The one table of safe-llama's own options: every row is read by the parser entry.py uses and shown in the
help cli.py makes, for each command that takes it; nothing else declares an option."""

from __future__ import annotations

import ast

import pytest

from safe_llama import cli
from safe_llama.cmdline import own_options
from safe_llama.cmdline.own_options import COMMANDS, LAUNCH, OPTIONS, ROOT, TOOLS, Option, read
from safe_llama.errors import ExitStatus, SafeLlamaError
from tests import ROOT as REPO

GROUP = cli.group
ROWS = [pytest.param(option, command, id=f"{command}{option.names[-1]}") for option in OPTIONS
        for command in option.commands]  # fmt: skip


def _given(option: Option, name: str) -> list[str]:
    return [name] if option.kind == "flag" else [name, "7"]


@pytest.mark.parametrize(("option", "command"), ROWS)
def test_every_option_is_read_by_every_command_that_takes_it(option: Option, command: str) -> None:
    expected = option.flag_value if option.kind == "flag" else "7"
    for name in option.names:
        reading = read(command, [*_given(option, name), "server"])
        assert reading.settings == {option.key: expected}, name
        assert reading.words == ["server"]


def _help(args: list[str], capsys: pytest.CaptureFixture[str]) -> str:
    assert cli.show_help(args) == 0
    return capsys.readouterr().out


@pytest.mark.parametrize(("option", "command"), ROWS)
def test_every_option_is_shown_in_its_command_s_help(
    option: Option, command: str, capsys: pytest.CaptureFixture[str]
) -> None:
    shown = _help(["--help"] if command in (LAUNCH, ROOT) else [command, "--help"], capsys)
    assert all(name in shown for name in option.names), shown
    assert option.help in " ".join(shown.split())
    if command == LAUNCH:
        assert option.env in shown


def test_the_help_declares_exactly_the_table_s_options() -> None:
    """cli.py's commands have exactly the table's options (and click's --help), nothing of their own."""
    for command in COMMANDS.values():
        params = GROUP.commands[command.name].params
        declared = {name for p in params for name in [*p.opts, *p.secondary_opts] if name.startswith("-")}
        assert declared == set(own_options.options_of(command.name)), command.name  # and click's own --help
    root = {name for p in GROUP.params for name in p.opts}
    assert root == set(own_options.options_of(ROOT)) | {"--install-completion", "--show-completion"}  # typer's
    assert list(GROUP.commands) == [*COMMANDS, *TOOLS, "rpc-server"]  # the words that launch: listed, completed


DOORS = ["safe_llama/entry.py", "safe_llama/cli.py", "safe_llama/cmdline/launch_args.py",
         "safe_llama/commands/plan.py", "safe_llama/pipeline/options.py"]  # fmt: skip


def test_nothing_else_declares_an_option() -> None:
    """Only cli.py imports typer (and makes its options there from the rows, one option and one argument
    object each), and the doors name none of the table's options."""
    names = {name for option in OPTIONS for name in option.names}
    for path in sorted((REPO / "safe_llama").rglob("*.py")):
        tree = ast.parse(path.read_text())
        imported = [n for n in ast.walk(tree) if isinstance(n, ast.Import | ast.ImportFrom)
                    and any(m.split(".")[0] == "typer" for m in [getattr(n, "module", None) or "",
                                                                  *(a.name for a in n.names)])]  # fmt: skip
        made = [n for n in ast.walk(tree) if isinstance(n, ast.Call) and isinstance(n.func, ast.Name)
                and n.func.id in ("TyperOption", "TyperArgument")]  # fmt: skip
        where = str(path.relative_to(REPO))
        if where != "safe_llama/cli.py":
            assert imported == [], where
        else:
            assert len(made) == 4, where  # a flag or a valued option; one word or all of the rest
        if where in DOORS:
            literals = [n.value for n in ast.walk(tree) if isinstance(n, ast.Constant) and n.value in names]
            assert literals == [], where


@pytest.mark.parametrize(
    ("args", "words"),
    [
        pytest.param(["--min-ctx=5", "server", "--min-ctx", "9"], ["server", "--min-ctx", "9"], id="tool-stops"),
        pytest.param(["--", "--json"], ["--json"], id="double-dash"),
    ],
)
def test_the_first_word_ends_the_options(args: list[str], words: list[str]) -> None:
    assert read("plan", args).words == words


def test_a_loose_command_keeps_unknown_options_as_words() -> None:
    reading = read("explain", ["log.txt", "-c", "65536", "-m", "x.gguf", "--json"])
    assert reading.settings == {"model": "x.gguf", "json": "1"}
    assert reading.words == ["log.txt", "-c", "65536"]


@pytest.mark.parametrize(
    ("command", "args", "said"),
    [
        pytest.param("plan", ["--bogus", "server"], "safe-llama: --bogus: no such option", id="unknown"),
        pytest.param(LAUNCH, ["--attempts"], "safe-llama: --attempts: needs a value", id="no-value"),
        pytest.param("plan", ["--json=1"], "safe-llama: --json: takes no value", id="flag-value"),
        pytest.param("devices", ["--attempts", "3"], "safe-llama: --attempts: no such option", id="other-command"),
    ],
)
def test_bad_options_are_one_usage_line(command: str, args: list[str], said: str) -> None:
    with pytest.raises(SafeLlamaError) as caught:
        read(command, args)
    assert caught.value.status == ExitStatus.USAGE
    assert caught.value.message.startswith(said) and "\n" not in caught.value.message


def test_help_is_asked_not_read() -> None:
    assert read("plan", ["--json", "--help", "--bogus"]).help


def test_a_strict_command_collects_words_between_options() -> None:
    """entry then refuses them: devices takes no arguments."""
    assert read("devices", ["--json", "extra", "--refresh"]) == ({"json": "1", "refresh": "1"}, ["extra"], False)


@pytest.mark.parametrize(
    ("settings", "expected"),
    [({}, None), ({"integrated": "1"}, True), ({"discrete": "1"}, False), ({"integrated": "1", "discrete": "1"}, False),
     ({"integrated": "false"}, None)],
)  # fmt: skip
def test_integrated_or_discrete(settings: dict[str, str], expected: bool | None) -> None:
    assert own_options.integrated(settings) is expected


def test_names_are_unique_per_command() -> None:
    for command in {c for option in OPTIONS for c in option.commands}:
        names = [name for option in OPTIONS if command in option.commands for name in option.names]
        assert len(names) == len(set(names)), command
