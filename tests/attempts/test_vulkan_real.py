"""Vulkan for real, on Mesa's lavapipe with the pinned Vulkan build and the bundled gemma-3-270m: the plan's
first start at >= 97% of the largest context that starts (the next 256-cell step past 1/0.97 of it aborts:
one layer's K tensor over maxStorageBufferRange), the GGML_VK_FORCE_* limits likewise, and the tied
embedding (170 MiB, over the 128 MiB range) counted once, where llama.cpp's own buffers put it.

lavapipe's quirks, for tests only: llama.cpp lists it with GGML_VK_VISIBLE_DEVICES=0; the server runs with
-ctxcp 0; Mesa's shader cache stays in one folder (MESA_SHADER_CACHE_DIR) so a start takes seconds, not a
minute of LLVM compiling ggml's shaders.
"""

from __future__ import annotations

import json
import math
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from safe_llama.cmdline.memory_flags import LlamaSettings
from safe_llama.device.probing import probe_devices
from safe_llama.model.gguf_header import read_header
from safe_llama.model.header_facts import model_facts
from safe_llama.model.kv import KvRequest
from safe_llama.plan.memory import memory_by_place
from safe_llama.plan.target import target_from
from tests.llama_run import free_port, healthy, run_server_until_ready

MIB = 1 << 20
MESA_CACHE = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "safe-llama-tests" / "mesa"
ASKED = 600_000  # q8_0 K of gemma-3's full-attention layers: 163 MiB here, over lavapipe's 128 MiB range
FORCED = str(64 * MIB)


def _env(clean_env: dict[str, str], tmp_path: Path, vulkan_bin: Path, extra: dict[str, str]) -> dict[str, str]:
    MESA_CACHE.mkdir(parents=True, exist_ok=True)
    return {
        **clean_env,
        "GGML_VK_VISIBLE_DEVICES": "0",
        "MESA_SHADER_CACHE_DIR": str(MESA_CACHE),
        "XDG_CACHE_HOME": str(tmp_path / "cache"),
        "SAFE_LLAMA_BIN_DIR": str(vulkan_bin),
        **extra,
    }


def _plan(args: list[str], env: dict[str, str]) -> dict[str, object]:
    done = subprocess.run(
        [sys.executable, "-m", "safe_llama", "plan", "--json", "server", *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    decision = json.loads(done.stdout)["decision"]
    assert isinstance(decision, dict)
    return decision


def _serve(args: list[str], env: dict[str, str], timeout: float = 300) -> tuple[bool, str]:
    """safe-llama server until /health 200 or its exit; (ready, its stderr)."""
    port = free_port()
    proc = subprocess.Popen(
        [sys.executable, "-m", "safe_llama", "server", *args, "--host", "127.0.0.1", "--port", str(port)],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    ready = False
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and proc.poll() is None:
        if healthy(port):
            ready = True
            break
        time.sleep(0.2)
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=60)
    return ready, err.decode(errors="replace")


def _with_ctx(argv: list[str], ctx: int) -> list[str]:
    out: list[str] = []
    skip = False
    for arg in argv:
        if skip:
            skip = False
        elif arg in ("-c", "--ctx-size"):
            skip = True
        else:
            out.append(arg)
    return [*out, "-c", str(ctx)]


@pytest.mark.slow
@pytest.mark.parametrize(
    ("forced", "limit_words"),
    [
        pytest.param({}, "maxStorageBufferRange", id="storage-range"),
        pytest.param(
            {"GGML_VK_FORCE_MAX_ALLOCATION_SIZE": FORCED, "GGML_VK_FORCE_MAX_BUFFER_SIZE": FORCED},
            "GGML_VK_FORCE_MAX_BUFFER_SIZE",
            id="forced-buffer-size",
        ),
    ],
)
def test_first_start_within_3_percent_of_the_largest(
    forced: dict[str, str],
    limit_words: str,
    tmp_path: Path,
    vulkan_bin: Path,
    bundled_model: Path,
    clean_env: dict[str, str],
) -> None:
    env = _env(clean_env, tmp_path, vulkan_bin, forced)
    args = ["-m", str(bundled_model), "-c", str(ASKED), "-ctxcp", "0"]
    decision = _plan(args, env)
    argv = [str(a) for a in decision["argv"]]  # type: ignore[attr-defined]
    flag = "--ctx-size" if "--ctx-size" in argv else "-c"
    chosen = int(argv[argv.index(flag) + 1])
    assert chosen < ASKED
    reasons = " ".join(str(r) for r in decision["reasons"])  # type: ignore[attr-defined]
    assert "one layer's K cache" in reasons and limit_words in reasons, reasons
    ready, err = _serve(args, env)
    assert ready, err[-4000:]
    assert "attempt 1 failed" not in err, err[-4000:]
    # the first 256-cell step at or past chosen/0.97 does not start: the largest that starts is below it
    above = math.ceil(chosen / 0.97 / 256) * 256
    llama_env = {**env, **{str(k): str(v) for k, v in decision["env"].items()}}  # type: ignore[attr-defined]
    code, log = run_server_until_ready(vulkan_bin, _with_ctx(argv, above), llama_env, timeout=300)
    assert code is not None, f"-c {above} started: the plan's {chosen} is below 97% of what starts"
    assert "cannot run the operation" in log or "exceeds device buffer size limit" in log, log[-3000:]


@pytest.mark.slow
def test_the_tied_embedding_is_counted_once_where_llama_cpp_puts_it(
    tmp_path: Path, vulkan_bin: Path, bundled_model: Path, clean_env: dict[str, str]
) -> None:
    """gemma-3's token_embd (170 MiB, tied: also the output layer) is over lavapipe's 128 MiB range, so llama.cpp
    keeps it in the mapped file: the plan's device and host weights match llama.cpp's own buffer sizes."""
    env = _env(clean_env, tmp_path, vulkan_bin, {})
    report = probe_devices(binary=vulkan_bin / "llama-server", env=env, opencl_always=False)
    target = target_from(report.target, report.host, binary_version=None)
    facts = model_facts(read_header(str(bundled_model)))
    places = memory_by_place(facts, LlamaSettings(kv=KvRequest(tool="server", n_ctx=4096)), target)
    code, log = run_server_until_ready(
        vulkan_bin, ["-m", str(bundled_model), "-c", "4096", "-ctxcp", "0", "-lv", "4"], env, timeout=300
    )
    assert code is None, log[-3000:]
    sizes = {m[0]: float(m[1]) * MIB for m in re.findall(r"(\S+) model buffer size = +([\d.]+) MiB", log)}
    assert abs(places["Vulkan0"]["weights"] - sizes["Vulkan0"]) < MIB, (places, sizes)
    assert abs(places["host"]["weights"] - sizes["CPU_Mapped"]) < MIB, (places, sizes)
    assert places["host"]["weights"] >= dict(facts.tensors)["token_embd.weight"]


@pytest.mark.slow
def test_the_launch_says_when_the_attention_runs_on_the_cpu(
    tmp_path: Path, vulkan_bin: Path, clean_env: dict[str, str]
) -> None:
    """-fa off over 16,384 cells of 16 heads: each layer's KQ scores (512 MiB) are over lavapipe's 128 MiB range,
    so llama.cpp runs the attention on the CPU (its graph splits per layer); the launch says so and starts."""
    from tests.tiny_gguf import write_tiny_gguf

    env = _env(clean_env, tmp_path, vulkan_bin, {})
    model = write_tiny_gguf(tmp_path / "heads.gguf", n_layer=2, n_head=16, n_head_kv=16, head_dim=64,
                            n_ctx_train=1 << 20)  # fmt: skip
    ready, err = _serve(["-m", str(model), "-c", "16384", "-fa", "off", "-np", "1", "-ctxcp", "0", "-lv", "4"], env)
    assert ready, err[-4000:]
    said = [line for line in err.splitlines() if line.startswith("safe-llama: attention on the CPU: ")]
    assert len(said) == 1 and "KQ scores (512.00 MiB at -ub 512)" in said[0], err[-4000:]
    assert re.search(r"sched_reserve: graph \(pp bs=512, tg bs=1\): nodes = [\d /]+, splits = 6 / 2", err)
