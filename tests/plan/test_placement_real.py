"""Memory flags against the real CPU build: a random-weight MoE model from test-llama-archs, each flag's
plan (per place) against llama.cpp's own buffer lines. On a CPU-only build every place is the host, so
these confirm that the flags move nothing here and that the host figures are llama.cpp's; the device
side of each flag is checked by rule (tests/plan/test_placement.py)."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

FLAGS = [
    pytest.param([], id="as-given"),
    pytest.param(["-cmoe"], id="cpu-moe"),
    pytest.param(["-ncmoe", "1"], id="n-cpu-moe"),
    pytest.param(["-ot", r"blk\.0\.=CPU"], id="override-tensor"),
    pytest.param(["-nkvo"], id="no-kv-offload"),
    pytest.param(["-lm", "none"], id="load-mode-none"),
    pytest.param(["-ctk", "q8_0", "-ctv", "q8_0", "-fa", "on"], id="quantized-kv"),
]


@pytest.fixture(scope="module")
def moe_model(tmp_path_factory: pytest.TempPathFactory, llama_bin: Path) -> Path:
    out = tmp_path_factory.mktemp("archs")
    subprocess.run([str(llama_bin / "test-llama-archs"), "-a", "qwen3moe", "-o", str(out)], check=True,
                   capture_output=True, timeout=120)  # fmt: skip
    (model,) = out.glob("qwen3moe*.gguf")
    return model


@pytest.mark.slow
@pytest.mark.parametrize("flags", FLAGS)
def test_moe_flags_against_real_buffers(
    flags: list[str], moe_model: Path, llama_bin: Path, clean_env: dict[str, str], tmp_path: Path
) -> None:
    args = ["-m", str(moe_model), "-c", "512", "-np", "1", *flags]
    env = {**clean_env, "SAFE_LLAMA_BIN_DIR": str(llama_bin), "XDG_CACHE_HOME": str(tmp_path)}
    planned = subprocess.run([sys.executable, "-m", "safe_llama", "plan", "--json", "completion", *args],
                             env=env, capture_output=True, text=True, timeout=120, check=True)  # fmt: skip
    result = json.loads(planned.stdout)
    assert set(result["memory"]) == {"host"}
    host = result["memory"]["host"]
    real = subprocess.run(
        [str(llama_bin / "llama-completion"), *result["decision"]["argv"], "-n", "1", "-p", "hi", "-no-cnv",
         "-lv", "4"],
        env=env, capture_output=True, text=True, timeout=120, check=True,
    )  # fmt: skip
    log = real.stdout + real.stderr
    weights = sum(float(m) for m in re.findall(r"CPU(?:_Mapped)? model buffer size = +([\d.]+) MiB", log))
    kv = sum(float(m) for m in re.findall(r"CPU KV buffer size = +([\d.]+) MiB", log))
    assert weights > 0 and kv > 0
    assert abs(weights - host["weights"] / 2**20) <= 0.01 + 0.005 * weights, (weights, host["weights"] / 2**20)
    assert abs(kv - host["kv"] / 2**20) <= 0.01, (kv, host["kv"] / 2**20)


@pytest.mark.slow
def test_repacked_weights_are_llama_cpps(
    bundled_model: Path, llama_bin: Path, clean_env: dict[str, str], tmp_path: Path
) -> None:
    """The bundled model's q4_K matrices get a second, repacked copy in allocated memory (CPU_REPACK): the
    plan counts it on the host, to the hundredth of a MiB that llama.cpp prints."""
    env = {**clean_env, "SAFE_LLAMA_BIN_DIR": str(llama_bin), "XDG_CACHE_HOME": str(tmp_path)}
    args = ["-m", str(bundled_model), "-c", "4096"]
    planned = subprocess.run([sys.executable, "-m", "safe_llama", "plan", "--json", "completion", *args],
                             env=env, capture_output=True, text=True, timeout=120, check=True)  # fmt: skip
    result = json.loads(planned.stdout)
    repacked = result["memory"]["host"]["repacked"] / 2**20
    real = subprocess.run(
        [str(llama_bin / "llama-completion"), *result["decision"]["argv"], "-n", "1", "-p", "hi", "-no-cnv",
         "-lv", "4"],
        env=env, capture_output=True, text=True, timeout=120, check=True,
    )  # fmt: skip
    log = real.stdout + real.stderr
    (logged,) = {float(m) for m in re.findall(r"CPU_REPACK model buffer size = +([\d.]+) MiB", log)}
    assert abs(logged - repacked) <= 0.01, (logged, repacked)
