"""cmdline/bundled_chat.py: the options a chat with the bundled model gets (configs/bundled-model.toml), only
where the user set none of them. The chat ending by itself is tests/run/test_cli_pty.py's (a real terminal)."""

from __future__ import annotations

import pytest

from safe_llama.cmdline.bundled_chat import chat_options, load_chat_defaults, parse_chat_defaults
from safe_llama.errors import SafeLlamaError
from safe_llama.paths import configs_dir

DEFAULTS = load_chat_defaults(configs_dir() / "bundled-model.toml")
ALL = ["-r", "<|im_end|>", "-r", "<|im_start|>", "-n", "256"]


@pytest.mark.parametrize(
    ("tool", "args", "env", "added"),
    [
        pytest.param("cli", [], {}, ALL, id="cli"),
        pytest.param("server", ["--port", "8080"], {}, ALL, id="server"),
        pytest.param("completion", [], {}, [], id="completion: no chat"),
        pytest.param("cli", ["-n", "32"], {}, ALL[:4], id="the user's -n"),
        pytest.param("cli", ["--predict", "32"], {}, ALL[:4], id="the user's -n, long name"),
        pytest.param("server", [], {"LLAMA_ARG_N_PREDICT": "32"}, ALL[:4], id="the user's -n as a variable"),
        pytest.param("cli", ["--chat-template", "gemma"], {}, ALL[4:], id="the user's template"),
        pytest.param("cli", ["--chat-template-file", "t.jinja"], {}, ALL[4:], id="the user's template file"),
        pytest.param("cli", ["-r", "User:"], {}, ALL[4:], id="the user's stop string"),
        pytest.param("cli", ["-r", "x", "-n", "9"], {}, [], id="all the user's"),
    ],
)
def test_options_added_only_where_the_user_set_none(
    tool: str, args: list[str], env: dict[str, str], added: list[str]
) -> None:
    options, line = chat_options(tool, args, env, DEFAULTS)
    assert options == added
    if added:
        assert line is not None and line.startswith(" ".join(f"'{a}'" if "<" in a else a for a in added) + ": ")
        assert "ends by itself" in line
    else:
        assert line is None


def test_a_bad_table_names_the_file() -> None:
    with pytest.raises(SafeLlamaError, match=r"bundled\.toml"):
        parse_chat_defaults({"tools": ["cli"], "option": [{"name": "-n"}]}, "bundled.toml")
