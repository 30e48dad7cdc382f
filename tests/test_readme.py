"""The README documents every console command, every command of `safe-llama`, every option its help
lists, the launcher options and their SAFE_LLAMA_* variables (the exit codes: tests/test_errors.py)."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

import pytest

from safe_llama import cli
from safe_llama.cmdline.launch_args import LAUNCHER

ROOT = Path(__file__).resolve().parent.parent
README = (ROOT / "README.md").read_text()
GROUP = cli.group


def _mentioned(word: str) -> bool:
    return re.search(rf"(?<![\w-]){re.escape(word)}(?![\w-])", README) is not None


def test_console_scripts() -> None:
    scripts = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["scripts"]
    assert [name for name in scripts if not _mentioned(name)] == []


@pytest.mark.parametrize("command", sorted(GROUP.commands))
def test_every_command_and_its_options(command: str) -> None:
    assert _mentioned(f"safe-llama {command}") or _mentioned(f"`{command}`"), command
    params = GROUP.commands[command].params
    options = [o for p in params for o in [*p.opts, *getattr(p, "secondary_opts", [])] if o.startswith("-")]
    assert [o for o in options if not _mentioned(o)] == []


def test_root_options_are_mentioned() -> None:
    assert [o for p in GROUP.params for o in p.opts if not _mentioned(o)] == []


def test_the_launcher_options_table_is_the_one_table_s() -> None:
    """The README's list is rendered from the rows (cli.launcher_table), not kept by hand."""
    assert cli.launcher_table() in README


def test_the_variables_row_names_every_launcher_variable() -> None:
    row = next(line for line in README.splitlines() if line.endswith("| the launcher options above |"))
    assert row == "| " + ", ".join(f"`{o.env}`" for o in LAUNCHER.values()) + " | the launcher options above |"


@pytest.mark.parametrize(
    ("said", "kind"),
    [("whole numbers", "number"), ("strings", "text"), ("sizes", "size"), ("true/false", "flag")],
)
def test_the_config_file_example_names_each_kind_s_keys(said: str, kind: str) -> None:
    example = README[README.index("[launcher]                 #") : README.index("[planner]                  #")]
    line = next(line for line in example.splitlines() if f"# {said}: " in line)
    listed = line.partition(f"# {said}: ")[2].partition(" (")[0].split(", ")
    assert listed == [key for key, option in LAUNCHER.items() if option.kind == kind]


def test_every_planner_key_is_listed() -> None:
    start = README.index("`[planner]` accepts every key")
    listing = README[start : README.index("with the meaning the comments there give", start)]
    keys = tomllib.loads((ROOT / "configs" / "planner.toml").read_text())
    assert [key for key in keys if f"`{key}`" not in listing] == []


def _layout_section() -> str:
    start = README.index("## How the code is laid out")
    return README[start : README.index("\n## ", start + 1)]


def test_the_layout_section_names_every_module_and_only_real_files() -> None:
    """The section a newcomer reads to find where a change goes stays true: every module of safe_llama/ is
    named in it, and every file path it gives exists."""
    section = _layout_section()
    package = ROOT / "safe_llama"
    modules = [p for p in package.rglob("*.py") if p.name != "__init__.py"]
    missing = [str(p.relative_to(package)) for p in modules if not re.search(rf"(?<![\w/]){p.stem}(?!\w)", section)]
    assert missing == []
    paths = set(
        re.findall(
            r"(?<![\w/.-])((?:safe_llama/|tests/|configs/|scripts/)?[a-z_]+/[\w/.-]+\.(?:py|toml|json))", section
        )
    )
    wrong = [p for p in sorted(paths) if not any((ROOT / base / p).exists() for base in ("", "safe_llama"))]
    assert wrong == []


def test_the_package_listing_names_each_module_in_its_own_package() -> None:
    """The listing of packages in the layout section: each package's entry names every module that is in
    it (a module moved to another package, or a package added, shows here)."""
    section = _layout_section()
    listing = section[section.index("\nleaves ") + 1 : section.index("\n```", section.index("\nleaves "))]
    entries: dict[str, str] = {}
    name = ""
    for line in listing.splitlines():
        if not line.startswith(" "):
            name, _, line = line.partition(" ")
        entries[name] = entries.get(name, "") + " " + line
    package = ROOT / "safe_llama"
    packages = sorted(p.name for p in package.iterdir() if (p / "__init__.py").is_file())
    assert sorted(n.rstrip("/") for n in entries if n.endswith("/")) == packages
    for pkg in packages:
        words = set(re.findall(r"[a-z_0-9]+", entries[pkg + "/"]))
        modules = {p.stem for p in (package / pkg).glob("*.py") if p.name != "__init__.py"}
        assert modules <= words, (pkg, sorted(modules - words))
    top = {p.stem for p in package.glob("*.py") if p.name != "__init__.py"}
    leaves_and_doors = set(re.findall(r"[a-z_0-9]+", entries["leaves"] + entries["doors"]))
    assert top <= leaves_and_doors, sorted(top - leaves_and_doors)
