"""The package tree is the architecture (safe_llama/*/__init__.py say what each owns): imports go one way,
from the doors (entry, cli) through commands, attempts, remembered, process, pipeline, diagnosis, plan,
device and cmdline down to model and the shared leaves, and no module imports itself back through others.
Lazy imports inside functions count too."""

from __future__ import annotations

import ast
from pathlib import Path

from tests import ROOT

PACKAGE = ROOT / "safe_llama"
# lower number: lower layer; a module may import its own layer and the ones below
LAYERS = {
    "leaf": 0, "model": 1, "cmdline": 2, "backends": 3, "device": 4, "plan": 5, "diagnosis": 6, "pipeline": 7,
    "process": 8, "remembered": 9, "attempts": 10, "commands": 11, "door": 12,
}  # fmt: skip
LEAVES = {"errors", "units", "constants", "paths", "state", "trust", "messages", "__init__"}
DOORS = {"entry", "cli", "__main__"}


def module_name(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def layer_of(module: str) -> int:
    parts = module.split(".")
    if len(parts) == 1:
        return LAYERS["leaf"]
    head = parts[1]
    if head in LAYERS:
        return LAYERS[head]
    return LAYERS["door"] if head in DOORS else LAYERS["leaf"] if head in LEAVES else -1


def imports(path: Path) -> set[str]:
    """safe_llama modules this file imports, at the top or inside functions (TYPE_CHECKING ones too)."""
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found |= {a.name for a in node.names if a.name.startswith("safe_llama")}
        elif isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("safe_llama"):
            for alias in node.names:
                sub = f"{node.module}.{alias.name}"
                found.add(sub if (PACKAGE.parent / (sub.replace(".", "/") + ".py")).is_file() else node.module)
    return found


def graph() -> dict[str, set[str]]:
    return {module_name(p): imports(p) for p in sorted(PACKAGE.rglob("*.py"))}


def test_every_module_belongs_to_a_layer() -> None:
    unplaced = [m for m in graph() if layer_of(m) < 0]
    assert not unplaced, f"modules outside every layer: {unplaced}"


def test_imports_go_down_the_layers() -> None:
    upward = [
        f"{m} -> {target}"
        for m, targets in graph().items()
        for target in sorted(targets)
        if target != "safe_llama" and layer_of(target) > layer_of(m)
    ]
    assert not upward, "imports that climb a layer:\n" + "\n".join(upward)


def test_no_import_circle() -> None:
    g = graph()
    edges = {m: {t for t in ts if t in g} for m, ts in g.items()}
    state: dict[str, int] = {}
    stack: list[str] = []

    def visit(m: str) -> list[str] | None:
        state[m] = 1
        stack.append(m)
        for t in sorted(edges[m]):
            if state.get(t) == 1:
                return [*stack[stack.index(t) :], t]
            if t not in state and (cycle := visit(t)):
                return cycle
        stack.pop()
        state[m] = 2
        return None

    for m in sorted(edges):
        if m not in state and (cycle := visit(m)):
            raise AssertionError("import circle: " + " -> ".join(cycle))


def test_no_module_imports_a_command() -> None:
    users = [
        f"{m} -> {t}"
        for m, ts in graph().items()
        for t in ts
        if t.startswith("safe_llama.commands") and layer_of(m) < LAYERS["commands"]
    ]
    assert not users, users


def test_commands_do_not_import_each_other() -> None:
    crossing = [f"{m} -> {t}" for m, ts in graph().items() if m.startswith("safe_llama.commands.")
                for t in ts if t.startswith("safe_llama.commands.") and t != m]  # fmt: skip
    assert not crossing, crossing


def test_long_modules_say_why() -> None:
    """A module over 400 lines states at its top why it is one module."""
    long = [
        f"{module_name(p)} ({n} lines)"
        for p in sorted(PACKAGE.rglob("*.py"))
        if (n := len(p.read_text().splitlines())) > 400
        and "Over 400 lines on purpose" not in (ast.get_docstring(ast.parse(p.read_text())) or "")
    ]
    assert not long, long


def test_every_package_says_what_it_owns() -> None:
    for init in sorted(PACKAGE.glob("*/__init__.py")):
        doc = ast.get_docstring(ast.parse(init.read_text())) or ""
        assert "Owns" in doc or "owns" in doc, f"{init}: no charter"
        assert "ust not" in doc or "othing imports" in doc, f"{init}: no 'must not'"
