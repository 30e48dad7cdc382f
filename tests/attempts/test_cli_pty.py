"""safe-llama-cli in a real terminal (a pty) on the bundled model: type a prompt, read an answer, Ctrl-C,
and the same exit code llama-cli itself gives in the same session."""

from __future__ import annotations

import os
from pathlib import Path

import pexpect
import pytest

from tests.conftest import console_script


def _session(command: str, args: list[str], env: dict[str, str]) -> tuple[bytes, int | None, int | None]:
    child = pexpect.spawn(command, args, env=env, timeout=120, dimensions=(40, 120))
    try:
        child.expect("available commands:")
        child.expect("\n> ")
        child.sendline("What is the capital of France?")
        child.expect("\n> ")
        answer = child.before
        child.sendcontrol("c")
        child.expect(pexpect.EOF, timeout=30)
    finally:
        child.close(force=True)
    return answer, child.exitstatus, child.signalstatus


@pytest.mark.slow
def test_prompt_answer_ctrl_c(tmp_path: Path, llama_bin: Path, bundled_model: Path, clean_env: dict[str, str]) -> None:
    exe = str(console_script("safe-llama-cli"))
    env = {**clean_env, "SAFE_LLAMA_BIN_DIR": str(llama_bin), "XDG_CACHE_HOME": str(tmp_path), "TERM": "xterm"}
    args = ["-c", "2048", "-n", "16", "--temp", "0", "--seed", "1"]
    wrapped = _session(exe, args, env)
    direct = _session(str(llama_bin / "llama-cli"), ["-m", str(bundled_model), *args], env)
    assert b"What is the capital of France?" in wrapped[0]
    assert b"[ Prompt:" in wrapped[0]  # llama-cli's own answer footer: the answer reached the terminal
    assert wrapped[1:] == direct[1:]
    assert os.path.exists(tmp_path / "safe-llama" / "plans")  # ready was seen: the plan was remembered


@pytest.mark.slow
def test_the_bundled_chat_ends_by_itself(tmp_path: Path, llama_bin: Path, clean_env: dict[str, str]) -> None:
    """The README's first example as a user types it: no model, no -n. Each reply must end by itself (llama.cpp's
    prompt comes back) without the stop string the model writes to start the next turn; the line saying why is
    shown."""
    exe = str(console_script("safe-llama-cli"))
    env = {**clean_env, "SAFE_LLAMA_BIN_DIR": str(llama_bin), "XDG_CACHE_HOME": str(tmp_path), "TERM": "xterm"}
    child = pexpect.spawn(exe, ["-c", "2048", "--seed", "42"], env=env, timeout=120, dimensions=(40, 120))
    try:
        child.expect("available commands:")
        said = child.before.decode(errors="replace")
        child.expect("\n> ")
        replies = []
        for prompt in ("Hello", "What is the capital of France?"):
            child.sendline(prompt)
            # a reply is at most 256 tokens: on 2 busy cores (3 tokens/s) under 90 s
            child.expect("\n> ", timeout=240)
            replies.append(child.before.decode(errors="replace"))
        child.sendcontrol("c")
        child.expect(pexpect.EOF, timeout=30)
    finally:
        child.close(force=True)
    assert "so each reply ends by itself" in said
    for reply in replies:
        assert "[ Prompt:" in reply  # llama-cli's footer: the reply ended and the prompt came back
        assert "<|im_end|>" not in reply and "USER:" not in reply  # the stop string ended it, left out
