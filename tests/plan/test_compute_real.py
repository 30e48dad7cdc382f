"""The compute-buffer estimate against the real pinned CPU build's `sched_reserve: CPU compute buffer size`
lines (llama-completion and llama-server, several contexts, ubatches, slot counts, cache types), and against
the H200 recording of CUDA's f16 K/V copies under flash attention with a quantized cache."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from safe_llama.cmdline.llama_args import parse
from safe_llama.cmdline.request import to_request
from safe_llama.model.header_facts import load_model_facts
from safe_llama.model.kv import plan_kv
from safe_llama.plan.compute import compute_estimate
from tests import FIXTURES
from tests.llama_run import run_server_until_ready
from tests.tiny_gguf import write_tiny_gguf

COMPUTE_LINE = re.compile(r"sched_reserve: +CPU compute buffer size = +([\d.]+) MiB")
MIB = 1 << 20
FIXTURE = FIXTURES / "logs" / "cuda-compute-oom-q8.log"


def _real(tool: str, bin_dir: Path, model: Path, args: list[str], env: dict[str, str]) -> int:
    if tool == "server":
        _, log = run_server_until_ready(bin_dir, ["-m", str(model), *args, "-lv", "4", "--fit", "off"], env)
    else:
        log = subprocess.run(
            [str(bin_dir / "llama-completion"), "-m", str(model), *args, "-n", "1", "-p", "hi", "-no-cnv",
             "-lv", "4", "--fit", "off"],
            capture_output=True, text=True, errors="replace", env=env, stdin=subprocess.DEVNULL, timeout=180,
            check=False,
        ).stderr  # fmt: skip
    found = COMPUTE_LINE.findall(log)
    assert found, log[-3000:]
    return int(float(found[-1]) * MIB)


CASES = [
    ("completion", ["-c", "4096"]),
    ("completion", ["-c", "65536"]),
    ("completion", ["-c", "65536", "-ub", "128"]),
    ("completion", ["-c", "32768", "-ctk", "q8_0", "-ctv", "q8_0", "-fa", "on"]),
    ("server", ["-c", "16384"]),
    ("server", ["-c", "65536", "-np", "1"]),
    # the server layouts of issue 36 (on the CPU the copies and the per-stream masks of a GPU do not arise)
    ("server", ["-c", "65536", "-np", "16", "-no-kvu"]),
    ("server", ["-c", "32768", "-fa", "off", "-np", "4"]),
    ("server", ["-c", "32768", "-np", "16", "-ctk", "q8_0", "-ctv", "q8_0"]),
    ("server", ["-c", "16384", "-ub", "128", "-b", "128"]),
]


@pytest.mark.slow
@pytest.mark.parametrize(("tool", "args"), CASES, ids=[f"{t}:{' '.join(a)}" for t, a in CASES])
@pytest.mark.parametrize("which", ["bundled", "tiny-llama"])
def test_estimate_bounds_the_real_compute_buffer(
    tool: str, args: list[str], which: str, llama_bin: Path, bundled_model: Path, tmp_path: Path,
    clean_env: dict[str, str],
) -> None:  # fmt: skip
    model = bundled_model
    if which == "tiny-llama":
        model = write_tiny_gguf(tmp_path / "tiny.gguf", n_layer=4, n_head=8, n_head_kv=2, head_dim=64, n_ff=1024,
                                n_ctx_train=131072)  # fmt: skip
    real = _real(tool, llama_bin, model, args, clean_env)
    facts = load_model_facts(model)
    req = to_request(parse(tool, [*args, "-m", str(model)], clean_env)).kv
    estimate = compute_estimate(facts, plan_kv(facts, req), req)
    # an upper estimate (never short: a short one fails the start), and not wasteful (the ceiling that matters
    # for the largest context: within half the real size plus 32 MiB)
    assert real <= estimate <= real * 1.5 + 32 * MIB, (real / MIB, estimate / MIB)


def test_cuda_quantized_kv_copies_match_the_h200_recording(tmp_path: Path) -> None:
    """8 layers x 16 KV heads x 256, q8_0 K and V, flash attention, 2,000,128 cells: llama.cpp asked CUDA0 for
    34,837,395,584 bytes of compute buffer. Without the copies the estimate is 32.8 GB short."""
    log = FIXTURE.read_text()
    asked = int(re.findall(r"failed to allocate CUDA0 buffer of size (\d+)", log)[0])
    model = write_tiny_gguf(tmp_path / "big.gguf", n_layer=8, n_head=16, n_head_kv=16, head_dim=256, n_ff=64,
                            n_ctx_train=2_000_000, sparse=True)  # fmt: skip
    facts = load_model_facts(model)
    argv = ["-m", str(model), "-c", "2000128", "-ctk", "q8_0", "-ctv", "q8_0", "-fa", "on", "-np", "1"]
    req = to_request(parse("server", argv, {})).kv
    kv = plan_kv(facts, req)
    with_copies = compute_estimate(facts, kv, req, kv_f16_copies=True)
    without = compute_estimate(facts, kv, req, kv_f16_copies=False)
    assert asked <= with_copies <= asked * 1.01
    assert without < asked * 0.1


# Mesa's lavapipe through the pinned Vulkan build (GGML_VK_VISIBLE_DEVICES=0 lists it): maxStorageBufferRange
# 128 MiB, so attention over a few thousand cells already has a tensor larger than Vulkan takes. Mesa's shader
# cache is kept between runs (a cold one costs about a minute of LLVM compiling ggml's shaders).
MESA_CACHE = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "safe-llama-tests" / "mesa"
VK_COMPUTE = re.compile(r"sched_reserve: +(Vulkan0|Vulkan_Host|CPU) compute buffer size = +([\d.]+) MiB")
SPLITS = re.compile(r"sched_reserve: graph(?: \(pp bs=\d+, tg bs=\d+\))?: nodes = [\d /]+, splits = (\d+)")
LLAMA = {"n_layer": 2, "n_head": 16, "n_head_kv": 16, "head_dim": 64, "n_ff": 64, "n_ctx_train": 1 << 20}
GEMMA = {"arch": "gemma3", "n_layer": 6, "n_head": 8, "n_head_kv": 4, "head_dim": 64, "n_ff": 128,
         "n_ctx_train": 1 << 20, "sliding_window": 1024}  # fmt: skip
# (model, arguments, the layers whose attention runs on the CPU): the graph of one ubatch then has 2 + 2 per
# such layer splits (the CPU's token embeddings, the device, then each layer's attention and the device again)
HOST_ATTENTION = [
    pytest.param(LLAMA, "-c 16384 -fa off -np 1", 2, id="scores-512M"),
    pytest.param(LLAMA, "-c 32768 -ub 4096 -b 4096 -np 1 -ctk q8_0 -ctv q8_0 -fa on", 2, id="flash-mask-256M-q8"),
    # one token per slot: its graph's scores (32 x 16 heads x 16,384 cells, 32 MiB) on the device are its largest
    pytest.param(LLAMA, "-c 16384 -fa off -np 32 -kvu", 2, id="scores-np32-one-token-graph"),
    pytest.param(GEMMA, "-c 16384 -fa off -np 1", 1, id="gemma3-full-layer-only"),
    pytest.param(GEMMA, "-c 16384 -fa off -np 1 --swa-full", 6, id="gemma3-swa-full"),
    pytest.param(LLAMA, "-c 4096 -fa off -np 1", 0, id="scores-128M-exactly-the-range"),
]


@pytest.mark.slow
@pytest.mark.parametrize(("shape", "args", "layers"), HOST_ATTENTION)
def test_attention_over_vulkans_range_runs_on_the_host_as_planned(
    shape: dict[str, object], args: str, layers: int, tmp_path: Path, vulkan_bin: Path, clean_env: dict[str, str]
) -> None:
    """Where an attention tensor (the KQ scores without flash attention, the mask with it) is larger than
    lavapipe's 128 MiB maxStorageBufferRange, llama.cpp runs that attention on the CPU: `safe-llama plan` says
    so, and its compute per place is what the real llama-server logs (the device's within 10 MiB, the host's
    within 5%); a tensor exactly at the range stays on the device."""
    MESA_CACHE.mkdir(parents=True, exist_ok=True)
    env = {**clean_env, "GGML_VK_VISIBLE_DEVICES": "0", "MESA_SHADER_CACHE_DIR": str(MESA_CACHE),
           "XDG_CACHE_HOME": str(tmp_path / "cache"), "SAFE_LLAMA_BIN_DIR": str(vulkan_bin)}  # fmt: skip
    model = write_tiny_gguf(tmp_path / "model.gguf", **shape)  # type: ignore[arg-type]
    argv = ["-m", str(model), *args.split(), "-ctxcp", "0", "-fit", "off"]
    done = subprocess.run(
        [sys.executable, "-m", "safe_llama", "plan", "--json", "server", *argv],
        env=env, capture_output=True, text=True, timeout=300, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads(done.stdout)
    decision, memory = result["decision"], result["memory"]
    assert decision["argv"] == argv
    code, log = run_server_until_ready(vulkan_bin, [*argv, "-lv", "4"], env, timeout=300)
    assert code is None, log[-3000:]
    logged = {dev: float(mib) * MIB for dev, mib in VK_COMPUTE.findall(log)}
    splits = SPLITS.findall(log)
    assert splits and int(splits[-1]) == 2 + 2 * layers, (splits, log[-3000:])
    notes = [note for note in decision["notes"] if note.startswith("attention on the CPU")]
    assert len(notes) == bool(layers), decision["notes"]
    device = memory["Vulkan0"]["compute"]
    assert abs(device - logged["Vulkan0"]) <= 10 * MIB, (device / MIB, logged)
    if layers:
        assert "128.00 MiB limit per tensor" in notes[0]
        host = memory["host"]["compute"]
        on_host = logged.get("Vulkan_Host", logged.get("CPU", 0))  # CPU where pinned memory was refused
        assert abs(host - on_host) <= 0.05 * on_host, (host / MIB, logged)
