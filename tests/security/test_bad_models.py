"""Issue 33: a model that cannot work (no width, no heads or KV heads, a head dimension of 0, a NaN rope base)
is refused by `plan` and a launch with exit 65 and one line naming the key, before llama.cpp is started; its
facts are not cached."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import gguf
import pytest

from safe_llama.errors import ExitStatus
from tests.tiny_gguf import LLAMA_3B


def write_model(path: Path, *, uints: dict[str, int], floats: dict[str, float]) -> Path:
    """A metadata-only llama GGUF (Llama-3.2-3B's hyperparameters) with some keys replaced."""
    writer = gguf.GGUFWriter(str(path), "llama")
    for key, value in {**LLAMA_3B, **uints}.items():
        writer.add_uint32(f"llama.{key}", value)
    for key, number in floats.items():
        writer.add_float32(f"llama.{key}", number)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


def plan(model: Path, cache: Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "XDG_CACHE_HOME": str(cache), "SAFE_LLAMA_REMEMBER": "0"}
    cmd = [sys.executable, "-m", "safe_llama", "plan", "server", "-m", str(model), "-c", "4096"]
    return subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=60, check=False)


@pytest.mark.parametrize(
    ("uints", "floats", "problem"),
    [
        pytest.param({"attention.head_count": 0}, {}, "key llama.attention.head_count is 0 in every layer", id="heads"),
        pytest.param(
            {"attention.head_count_kv": 0}, {}, "key llama.attention.head_count_kv is 0 in every layer", id="kv-heads"
        ),
        pytest.param({"attention.key_length": 0}, {}, "key llama.attention.key_length is 0 for layer 0", id="key-len"),
        pytest.param(
            {"attention.value_length": 0}, {}, "key llama.attention.value_length is 0 for layer 0", id="value-len"
        ),
        pytest.param({"embedding_length": 0}, {}, "key llama.embedding_length is 0", id="embedding"),
        pytest.param({}, {"rope.freq_base": float("nan")}, "key llama.rope.freq_base is nan", id="nan-rope"),
        pytest.param({}, {"rope.freq_base": float("inf")}, "key llama.rope.freq_base is inf", id="inf-rope"),
        pytest.param(
            {},
            {"attention.layer_norm_rms_epsilon": float("nan")},
            "key llama.attention.layer_norm_rms_epsilon is nan",
            id="nan-eps",
        ),
    ],
)
def test_model_that_cannot_work_is_refused(
    tmp_path: Path, uints: dict[str, int], floats: dict[str, float], problem: str
) -> None:
    model = write_model(tmp_path / "bad.gguf", uints=uints, floats=floats)
    result = plan(model, tmp_path / "cache")
    assert result.returncode == ExitStatus.BAD_MODEL, result.stdout + result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"safe-llama: {model}: {problem}"), lines
    assert "expected" in lines[0]  # says what is accepted
    facts = tmp_path / "cache" / "safe-llama" / "facts"
    assert not facts.exists() or not any(facts.iterdir()), "a refused model's facts were cached"


def test_the_same_model_whole_is_planned(tmp_path: Path) -> None:
    model = write_model(tmp_path / "good.gguf", uints={}, floats={"rope.freq_base": 500000.0})
    result = plan(model, tmp_path / "cache")
    assert result.returncode == 0, result.stderr
    assert any((tmp_path / "cache" / "safe-llama" / "facts").iterdir())
