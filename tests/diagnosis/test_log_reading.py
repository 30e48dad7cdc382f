"""Tests for safe_llama/diagnosis/log_reading.py: reading llama.cpp logs (the fixtures in tests/fixtures/logs/, real
output of the pinned llama.cpp, CPU and OpenVINO builds, and the seed report's text), the command lines quoted in
them, and the failed run as far as it is known."""

from __future__ import annotations

import pytest

from safe_llama.diagnosis.failed_run import failed_run
from safe_llama.diagnosis.log_reading import parse_command, read_log
from safe_llama.diagnosis.signatures import load_table
from tests import FIXTURES

LOGS = FIXTURES / "logs"
TABLE = load_table()
BUNDLED = "/root/.cache/safe-llama/models/gemma-3-270m-q4_k_m.gguf"
SEED_MODEL = "/home/lucasso/models/Llama-3.2-3B-Instruct-Q4_K_M.gguf"


def log(name: str) -> str:
    return (LOGS / name).read_text()


# ---------------------------------------------------------------------------------------------------
# Reading logs
# ---------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("name", "tool", "model", "n_ctx", "backend", "signature"),
    [
        pytest.param(
            "openvino-seed.log", "completion", SEED_MODEL, None, "openvino", "openvino-max-alloc-size", id="seed"
        ),
        pytest.param("server-kv-oom.log", "server", BUNDLED, 2000128, "cpu", "cpu-aligned-malloc", id="server-oom"),
        pytest.param(
            "server-kv-oom-lv4.log", "server", BUNDLED, 2000128, "cpu", "cpu-aligned-malloc", id="server-oom-lv4"
        ),
        pytest.param("cli-kv-oom.log", "cli", BUNDLED, None, "cpu", "cpu-aligned-malloc", id="cli-oom"),
        pytest.param("cli-kv-oom.pty.log", "cli", BUNDLED, None, "cpu", "cpu-aligned-malloc", id="cli-oom-pty"),
        pytest.param(
            "completion-kv-oom.log", "completion", BUNDLED, 2000128, "cpu", "cpu-aligned-malloc", id="completion-oom"
        ),
        pytest.param(
            "openvino-cpu-kv-oom.log", "completion", None, 2000128, "openvino", "cpu-aligned-malloc",
            id="openvino-cpu-oom",
        ),
        pytest.param("server-bad-magic.log", "server", "badmagic.gguf", None, None, "gguf-invalid", id="bad-magic"),
        pytest.param(
            "server-truncated-data.log", "server", "trunc100m.gguf", None, None, "model-corrupt", id="truncated"
        ),
        pytest.param("server-bad-argument.log", "server", None, None, None, "invalid-argument", id="bad-argument"),
        pytest.param(
            "cuda-oom-fitoff.log", "server", "/tmp/bigkv.gguf", 2000128, "cuda", "cuda-malloc", id="cuda-oom"
        ),
    ],
)  # fmt: skip
def test_read_log_finds_the_failure_and_its_facts(
    name: str, tool: str, model: str | None, n_ctx: int | None, backend: str | None, signature: str
) -> None:
    reading = read_log(log(name), TABLE)
    assert reading.failure is not None and reading.failure.signature_id == signature
    assert (reading.facts.tool, reading.facts.model_path, reading.facts.n_ctx, reading.facts.backend) == (
        tool,
        model,
        n_ctx,
        backend,
    )


def test_read_log_verbosity_4_gives_slots_and_the_llama_context_line() -> None:
    facts = read_log(log("server-kv-oom-lv4.log"), TABLE).facts
    assert facts.n_seq_max == 4
    assert "llama_context: n_ctx" in facts.n_ctx_from


def test_a_header_comment_is_read_for_its_command_line_only() -> None:
    text = "# note: failed to allocate buffer for kv cache; ran: llama-server -m m.gguf -c 8192\nall good\n"
    reading = read_log(text, TABLE)
    assert reading.failure is None
    assert reading.facts.command_args == ("-m", "m.gguf", "-c", "8192")
    assert reading.facts.annotation_lines == 1


def test_a_ready_log_has_no_failure() -> None:
    reading = read_log(log("completion-ready.log"), TABLE)
    assert reading.failure is None and reading.facts.started and not reading.error_lines


def test_openvino_refusing_its_device() -> None:
    reading = read_log(log("openvino-device-refused.log"), TABLE)
    assert reading.failure is None or not reading.failure.memory
    assert reading.refused_device == "GPU"
    assert [ov for ov, _ in reading.available_devices] == ["CPU"]


COMMANDS = [
    ("prompt", "$ llama-server -m m.gguf -c 4096 --port 8080", "server", "-m m.gguf -c 4096 --port 8080", {}),
    (
        "path-and-quotes",
        "user@box:~$ ./build/bin/llama-completion -m 'my model.gguf' -c 65536 -p hi",
        "completion",
        "-m|my model.gguf|-c|65536|-p|hi",
        {},
    ),
    ("env-words", "GGML_OPENVINO_DEVICE=GPU llama-cli -m x.gguf", "cli", "-m x.gguf", {"GGML_OPENVINO_DEVICE": "GPU"}),
    (
        "inside-bash-c",
        "bash -c 'ulimit -v 3000000; llama-server -m MODEL -c 2000000 --port 0'; exit 1",
        "server",
        "-m MODEL -c 2000000 --port 0",
        {},
    ),
    ("redirect", "llama-server -m x.gguf 2>&1 | tee log", "server", "-m x.gguf", {}),
    ("drop-in-unknown-words", "safe-llama-server -c 512 --bogus word", "server", "-c 512", {}),
    # read as llama.cpp's parser reads them: `_` spellings are options, `--name=value` is not one
    ("underscore-spelling", "llama-server --ctx_size 512 -m x.gguf", "server", "--ctx_size 512 -m x.gguf", {}),
    ("no-equals-form", "llama-server -m x.gguf --ctx-size=4096", "server", "-m x.gguf", {}),
    ("option-short-of-its-value", "llama-completion -m x.gguf -c", "completion", "-m x.gguf", {}),
]


@pytest.mark.parametrize(("line", "tool", "args", "env"), [pytest.param(*c[1:], id=c[0]) for c in COMMANDS])
def test_parse_command(line: str, tool: str, args: str, env: dict[str, str]) -> None:
    words = tuple(args.split("|")) if "|" in args else tuple(args.split())
    assert parse_command(line) == (tool, words, env)


def test_a_log_line_is_not_a_command_line() -> None:
    assert parse_command("srv  llama_server: exiting due to model loading error") is None


# ---------------------------------------------------------------------------------------------------
# The failed run: which values win
# ---------------------------------------------------------------------------------------------------


def test_explicit_arguments_beat_the_log_which_beats_its_comment() -> None:
    facts = read_log(log("server-kv-oom.log"), TABLE).facts
    from_log = failed_run(facts, args=(), model=None, tool=None)
    assert from_log.model_path == BUNDLED  # the log's loader line, not the comment's placeholder MODEL
    assert from_log.args[:2] == ("-m", BUNDLED) or "--model" in from_log.args
    assert from_log.n_ctx == 2000128  # what llama.cpp used, not the comment's -c 2000000
    given = failed_run(facts, args=("-c", "4096"), model="/x.gguf", tool="completion")
    assert (given.tool, given.model_path, given.n_ctx, given.args) == (
        "completion",
        "/x.gguf",
        4096,
        ("-m", "/x.gguf", "-c", "4096"),
    )


@pytest.mark.parametrize(
    ("args", "tool", "cells"),
    [
        pytest.param(("-c", "40000"), "completion", 40192, id="one-slot"),
        pytest.param(("-c", "40000"), "server", 40192, id="server-unified-slots"),
        pytest.param(("-np", "2", "-c", "40000"), "server", 2 * 20224, id="two-streams-each-padded"),
        pytest.param(("-c", "0"), "completion", None, id="the-models-context"),
        pytest.param(("-c", "lots"), "completion", None, id="not-a-number"),
    ],
)
def test_the_context_asked_is_padded_as_llama_cpp_pads_it(args: tuple[str, ...], tool: str, cells: int | None) -> None:
    assert failed_run(read_log("", TABLE).facts, args=args, model=None, tool=tool).n_ctx == cells
