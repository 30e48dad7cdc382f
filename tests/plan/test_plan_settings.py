"""`plan` resolves safe-llama's settings as the launch does (options over SAFE_LLAMA_* over the config
file) and each reason names where a setting came from."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from safe_llama.cmdline.launch_args import resolve_sourced


def _plan(args: list[str], env: dict[str, str]) -> dict[str, object]:
    done = subprocess.run(
        [sys.executable, "-m", "safe_llama", "plan", "--json", *args],
        env=env, capture_output=True, text=True, timeout=120, check=True,
    )  # fmt: skip
    result: dict[str, object] = json.loads(done.stdout)
    return result


def test_origins(tmp_path: Path) -> None:
    (tmp_path / "safe-llama").mkdir()
    (tmp_path / "safe-llama" / "config.toml").write_text('[launcher]\nhost_memory = "3G"\nmin_ctx = 512\n')
    env = {"XDG_CONFIG_HOME": str(tmp_path), "SAFE_LLAMA_HOST_MEMORY": "2G"}
    settings, origins = resolve_sourced({"min_ctx": "256"}, env)
    assert settings == {"host_memory": "2G", "min_ctx": "256"}
    assert origins == {"host_memory": "SAFE_LLAMA_HOST_MEMORY"}


def test_plan_honours_safe_llama_env_and_names_it(tmp_path: Path, clean_env: dict[str, str]) -> None:
    env = {**clean_env, "SAFE_LLAMA_HOST_MEMORY": "2G", "XDG_CONFIG_HOME": str(tmp_path)}
    result = _plan(["server", "-c", "1000000"], env)
    decision = result["decision"]
    assert isinstance(decision, dict)
    ctx = int(decision["argv"][decision["argv"].index("-c") + 1])
    assert ctx < 1000000  # the same budget the launch plans with
    assert "SAFE_LLAMA_HOST_MEMORY" in decision["reasons"][0] and "--host-memory" not in decision["reasons"][0]


def test_plan_honours_the_config_file(tmp_path: Path, clean_env: dict[str, str]) -> None:
    (tmp_path / "safe-llama").mkdir()
    (tmp_path / "safe-llama" / "config.toml").write_text('[launcher]\nhost_memory = "2G"\n')
    result = _plan(["server", "-c", "1000000"], {**clean_env, "XDG_CONFIG_HOME": str(tmp_path)})
    decision = result["decision"]
    assert isinstance(decision, dict)
    assert "[launcher] host_memory" in decision["reasons"][0]


def test_a_context_above_the_trained_one_gets_one_line(tmp_path: Path, clean_env: dict[str, str]) -> None:
    result = _plan(["server", "-c", "65536", "-np", "1"], {**clean_env, "XDG_CONFIG_HOME": str(tmp_path)})
    notes = [n for n in result["notes"] if "above the model's trained context" in n]  # type: ignore[attr-defined]
    assert len(notes) == 1
    assert "context 65536 per sequence is above the model's trained context 32768" in notes[0]
    assert "llama-server caps each slot at 32768 tokens" in notes[0]
