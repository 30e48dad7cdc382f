"""entry.py reads `plan`'s options without typer (the fast path); cli.py declares the same options for help.
The two must not drift: every option typer knows for `plan` is read by entry, with the same arity."""

from __future__ import annotations

import typer

from safe_llama.cli import app
from safe_llama.entry import PLAN_OPTIONS, plan_call


def test_plan_options_match_typers() -> None:
    command = typer.main.get_command(app).commands["plan"]  # type: ignore[attr-defined]
    declared = {}
    for param in command.params:
        for name in [*param.opts, *getattr(param, "secondary_opts", [])]:
            if name.startswith("--") and name != "--help":
                declared[name] = not (param.is_flag or param.count)
    assert declared == {name: takes_value for name, (_, takes_value) in PLAN_OPTIONS.items()}


def test_plan_call_reads_what_typer_would() -> None:
    call = plan_call(["--json", "--min-ctx", "8192", "--ladder=ctx", "server", "-m", "x.gguf", "--json"])
    assert call == {"json_out": True, "min_ctx": 8192, "ladder": "ctx", "tool": "server",
                    "args": ["-m", "x.gguf", "--json"]}  # fmt: skip
    assert plan_call(["--bogus", "server"]) is None  # typer answers: a usage error
    assert plan_call(["--min-ctx", "many", "server"]) is None
