"""Helpers of the security tests that watch a supervised child: a safe-llama server launched on the fake OpenVINO
llama-server (tests/fakes), its stderr as a queue of lines, waiting for a line, and the child's pid."""

from __future__ import annotations

import queue
import subprocess
import sys
import threading
import time
from pathlib import Path

from tests import ROOT
from tests.attempts.test_launch import _fake_bin
from tests.llama_run import free_port
from tests.tiny_gguf import LLAMA_3B, write_metadata_gguf


def start_server(tmp_path: Path, clean_env: dict[str, str], cache: Path) -> subprocess.Popen[bytes]:
    """`safe-llama server -c 8192` on the fake llama-server (serving for up to 120 s), its stderr piped."""
    model = write_metadata_gguf(tmp_path / "Llama-3.2-3B-Instruct-Q4_K_M.gguf", "llama", LLAMA_3B)
    env = {**clean_env, "XDG_CACHE_HOME": str(cache), "SAFE_LLAMA_BIN_DIR": str(_fake_bin(tmp_path)),
           "FAKE_ARGV_LOG": str(tmp_path / "argv.log"), "FAKE_TOOL": "server", "FAKE_SERVE_SECONDS": "120",
           "PYTHONPATH": str(ROOT)}  # fmt: skip
    return subprocess.Popen(
        [sys.executable, "-m", "safe_llama", "server", "-m", str(model), "-c", "8192", "--port", str(free_port())],
        env=env, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
    )  # fmt: skip


def lines_of(stream: object) -> queue.Queue[str]:
    lines: queue.Queue[str] = queue.Queue()

    def pump() -> None:
        for raw in stream:  # type: ignore[attr-defined]
            lines.put(raw.decode(errors="replace").rstrip("\n"))

    threading.Thread(target=pump, daemon=True).start()
    return lines


def wait_for(lines: queue.Queue[str], words: str, within: float, seen: list[str]) -> str:
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        try:
            line = lines.get(timeout=max(deadline - time.monotonic(), 0.01))
        except queue.Empty:
            break
        seen.append(line)
        if words in line:
            return line
    raise AssertionError(f"no line with {words!r} within {within} s: {seen[-20:]}")


def child_of(pid: int) -> int:
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        children = Path(f"/proc/{pid}/task/{pid}/children").read_text().split()
        if children:
            return int(children[0])
        time.sleep(0.05)
    raise AssertionError("no child")
