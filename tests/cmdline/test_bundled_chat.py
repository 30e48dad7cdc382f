"""cmdline/bundled_chat.py: the options a chat with the bundled model gets (configs/bundled-model.toml), only
where the user set none of them. The chat ending by itself is tests/attempts/test_cli_pty.py's (a real terminal)."""

from __future__ import annotations

import json
import shlex
import signal
import subprocess
import time
import urllib.request
from pathlib import Path

import pytest

from safe_llama.cmdline.bundled_chat import chat_options, load_chat_defaults, parse_chat_defaults
from safe_llama.errors import SafeLlamaError
from safe_llama.paths import packaged_configs
from tests.conftest import console_script
from tests.llama_run import free_port, healthy

DEFAULTS = load_chat_defaults(packaged_configs() / "bundled-model.toml")
ALL = ["--no-jinja", "--chat-template", "vicuna", "-r", "USER:", "-n", "256"]


@pytest.mark.parametrize(
    ("tool", "args", "env", "added"),
    [
        pytest.param("cli", [], {}, ALL, id="cli"),
        pytest.param("server", ["--port", "8080"], {}, ALL, id="server"),
        pytest.param("completion", [], {}, [], id="completion: no chat"),
        pytest.param("cli", ["-n", "32"], {}, ALL[:5], id="the user's -n"),
        pytest.param("cli", ["--predict", "32"], {}, ALL[:5], id="the user's -n, long name"),
        pytest.param("server", [], {"LLAMA_ARG_N_PREDICT": "32"}, ALL[:5], id="the user's -n as a variable"),
        pytest.param("cli", ["--chat-template", "gemma"], {}, ALL[5:], id="the user's template"),
        pytest.param("cli", ["--chat-template-file", "t.jinja"], {}, ALL[5:], id="the user's template file"),
        pytest.param("server", ["--jinja"], {}, ALL[5:], id="the user's Jinja"),
        pytest.param("server", [], {"LLAMA_ARG_JINJA": "1"}, ALL[5:], id="the user's Jinja as a variable"),
        pytest.param("cli", ["-r", "User:"], {}, ALL[5:], id="the user's stop string"),
        pytest.param("cli", ["-r", "x", "-n", "9"], {}, [], id="all the user's"),
    ],
)
def test_options_added_only_where_the_user_set_none(
    tool: str, args: list[str], env: dict[str, str], added: list[str]
) -> None:
    options, line = chat_options(tool, args, env, DEFAULTS)
    assert options == added
    if added:
        assert line is not None and line.startswith(shlex.join(added) + ": ")
        assert "ends by itself" in line
    else:
        assert line is None


def test_a_bad_table_names_the_file() -> None:
    with pytest.raises(SafeLlamaError, match=r"bundled\.toml"):
        parse_chat_defaults({"tools": ["cli"], "option": [{"name": "-n"}]}, "bundled.toml")


@pytest.mark.slow
def test_the_bundled_servers_chat_completions_are_never_empty(
    tmp_path: Path, llama_bin: Path, bundled_model: Path, clean_env: dict[str, str]
) -> None:
    """Ten identical /v1/chat/completions "Hello" without stop or max_tokens, as a newcomer's first requests, to
    the bundled model named by its path (issue 38): none is empty (with ChatML and its end of turn as the stop,
    about half were: the model's first text was "<|im_end|>"), the stop string is not in them, and llama.cpp
    warns of no repeated option."""
    port = free_port()
    env = {**clean_env, "SAFE_LLAMA_BIN_DIR": str(llama_bin), "XDG_CACHE_HOME": str(tmp_path)}
    argv = [str(console_script("safe-llama-server")), "-m", str(bundled_model), "-c", "2048", "--host", "127.0.0.1",
            "--port", str(port)]  # fmt: skip
    proc = subprocess.Popen(argv, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    answers = []
    try:
        deadline = time.monotonic() + 180
        while not healthy(port) and proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.2)
        for seed in range(1, 11):
            body = json.dumps({"messages": [{"role": "user", "content": "Hello"}], "seed": seed}).encode()
            request = urllib.request.Request(
                f"http://127.0.0.1:{port}/v1/chat/completions", body, {"Content-Type": "application/json"}
            )
            with urllib.request.urlopen(request, timeout=240) as response:  # noqa: S310 - http://127.0.0.1
                answers.append(json.loads(response.read())["choices"][0])
    finally:
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=60)
    replies = [(c["message"]["content"], c["finish_reason"]) for c in answers]
    assert [reply for reply in replies if not reply[0].strip()] == [], replies  # none empty, nor only spaces
    assert all("USER:" not in text for text, _ in replies), replies  # the stop string is left out
    # most end at the stop string; one that never writes it ends at the 256-token cap ("length")
    assert sum(ending == "stop" for _, ending in replies) >= 8, replies
    assert "so each reply ends by itself" in err and "DEPRECATED" not in err
