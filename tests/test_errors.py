"""errors.ExitStatus is the one table of exit codes: the README's table and each systemd unit's
RestartPreventExitStatus= are what it says, and no module of safe_llama/ leaves with a bare number."""

from __future__ import annotations

import ast

import pytest

from safe_llama.errors import ExitStatus
from safe_llama.paths import packaged_configs
from tests import ROOT

# each unit: the kinds of permanent failure its process can end with (the worker plans no model)
UNITS = {"safe-llama-server.service": ("all", "launch"), "safe-llama-rpc-server.service": ("all",)}


def test_the_readme_lists_every_code_with_its_meaning() -> None:
    readme = (ROOT / "README.md").read_text()
    table = readme[readme.index("## Exit codes") : readme.index("## What it uses")]
    rows = [line for line in table.splitlines() if line.startswith("| ") and not line.startswith("| code")]
    assert rows[:-1] == [f"| {int(status)} | {status.meaning} |" for status in ExitStatus]
    assert rows[-1].startswith("| other |")


@pytest.mark.parametrize(("unit", "kinds"), UNITS.items(), ids=list(UNITS))
def test_a_unit_prevents_restarts_for_exactly_the_permanent_failures(unit: str, kinds: tuple[str, ...]) -> None:
    text = (packaged_configs() / "systemd" / unit).read_text()
    lines = [line for line in text.splitlines() if line.startswith("RestartPreventExitStatus=")]
    assert len(lines) == 1, unit
    listed = [int(code) for code in lines[0].partition("=")[2].split()]
    assert listed == [int(status) for status in ExitStatus if status.permanent in kinds]


def test_every_meaning_is_one_line_and_every_permanence_known() -> None:
    for status in ExitStatus:
        assert status.meaning and "\n" not in status.meaning, status
        assert status.permanent in ("", "all", "launch"), status


def _bare_exit(node: ast.AST) -> bool:
    """`return 2`, `return 0 if ok else 1`, `exit(2)`, `os._exit(2)`, `code = 2`: a number where a status of the
    table belongs (a plain `return 0`, success, reads as itself)."""
    if isinstance(node, ast.Return) and isinstance(node.value, (ast.Constant, ast.IfExp)):
        numbers = [n.value for n in ast.walk(node.value) if isinstance(n, ast.Constant) and type(n.value) is int]
        return numbers not in ([], [0]) if isinstance(node.value, ast.Constant) else numbers != []
    if isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id == "code" for t in node.targets):
        return isinstance(node.value, ast.Constant)
    if isinstance(node, ast.Call) and isinstance(node.func, (ast.Attribute, ast.Name)):
        name = node.func.attr if isinstance(node.func, ast.Attribute) else node.func.id
        first = node.args[0] if node.args else None
        return name in ("exit", "_exit") and isinstance(first, ast.Constant) and first.value not in (0, None)
    return False


def test_no_bare_exit_code_in_the_doors_and_commands() -> None:
    """The doors and the commands say which status they leave with by its name."""
    found = []
    for path in [ROOT / "safe_llama" / "entry.py", ROOT / "safe_llama" / "cli.py",
                 *sorted((ROOT / "safe_llama" / "commands").glob("*.py"))]:  # fmt: skip
        nodes = ast.walk(ast.parse(path.read_text()))
        found += [f"{path.name}:{getattr(node, 'lineno', 0)}" for node in nodes if _bare_exit(node)]
    assert found == []
