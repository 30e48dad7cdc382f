"""Replays the H200 recordings (tests/fixtures/nvidia-h200-cuda/first-start-*.log, the pinned llama.cpp built
with CUDA, safe-llama's own launches there): the plan for the recorded device reproduces the context that
started on the first spawn, that context is within 3% of the largest that started (bisected there), and the
KV, CUDA0 and CUDA_Host compute buffers llama.cpp logged are what the plan predicts."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from safe_llama.cmdline.llama_args import parse
from safe_llama.cmdline.memory_flags import LlamaSettings
from safe_llama.cmdline.request import to_request
from safe_llama.device.limits import Sourced
from safe_llama.model.header_facts import load_model_facts
from safe_llama.model.kv import plan_kv
from safe_llama.paths import packaged_configs
from safe_llama.plan.compute import compute_estimate, host_compute_estimate
from safe_llama.plan.memory import memory_by_place
from safe_llama.plan.planner import plan
from safe_llama.plan.policy import load_policy
from safe_llama.plan.target import Target
from tests import FIXTURES as TEST_FIXTURES
from tests.tiny_gguf import write_tiny_gguf

FIXTURES = TEST_FIXTURES / "nvidia-h200-cuda"
MIB = 1 << 20
KV_LINE = re.compile(r"llama_kv_cache: size = +([\d.]+) MiB \( *(\d+) cells")
COMPUTE = re.compile(r"sched_reserve: +(\S+) compute buffer size = +([\d.]+) MiB")
DEVICE_MIB = 143155  # llama-server --list-devices there: CUDA0: NVIDIA H200 (143155 MiB, 142629 MiB free)
HOST = 134_463_045_632  # psutil MemAvailable there (125.23 GiB), as safe-llama's plan line names it


@pytest.fixture(scope="module")
def big(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The recorded model's header (random weights there; sparse here: planning reads the header and the size),
    8 layers x 16 KV heads x 256 (128 KiB of f16 KV per token)."""
    return write_tiny_gguf(tmp_path_factory.mktemp("gpu") / "big.gguf", n_layer=8, n_head=16, n_head_kv=16,
                           head_dim=256, n_ff=64, n_ctx_train=2_000_000, sparse=True)  # fmt: skip


def _h200(on_gpu: bool = True) -> Target:
    return Target(
        backend="cuda", device="CUDA0", on_gpu=on_gpu, kv_f16_copies=True,
        device_memory=Sourced(DEVICE_MIB * MIB, "probed", "llama.cpp --list-devices total of CUDA0"),
        host_budget=Sourced(HOST, "probed", "psutil: MemAvailable"),
    )  # fmt: skip


def test_the_plan_for_the_recorded_h200_is_the_context_that_started(big: Path) -> None:
    cases = json.loads((FIXTURES / "first-start-cases.json").read_text())
    truth = {row["case"]: row["largest_that_starts"] for row in cases["run1_margin_5pct"]}
    started = {row["case"]: row for row in cases["run2_margin_2pct"]}
    facts = load_model_facts(big)
    policy = load_policy(packaged_configs() / "planner.toml")
    for case, args in (("ngl99-c2M", ["-c", "2000000", "-ngl", "99"]), ("no-c", ["-ngl", "99"])):
        req = to_request(parse("server", ["-m", str(big), *args], {})).kv
        decided = plan(facts, req, _h200(), policy, user_ngl=99)
        row = started[case]
        assert row["safe_llama"]["ready"] and row["safe_llama"]["attempts"] == 1
        # the recording's plan (1,663,744) carried 48 MiB of activations more than the graph holds: one step more now
        assert decided.settings.kv.n_ctx == row["chosen"] + 512 == 1_664_256
        assert (decided.settings.kv.type_k, decided.settings.kv.type_v) == ("q8_0", "q8_0")
        assert decided.settings.kv.n_ctx / truth[case] >= 0.97


@pytest.mark.parametrize("log", ["first-start-ngl99-c2M.log", "first-start-ngl99-margin5.log", "first-start-ngl0.log"])
def test_logged_buffers_are_the_predicted_ones(big: Path, log: str) -> None:
    text = (FIXTURES / log).read_text()
    kv_mib, cells = KV_LINE.findall(text)[-1]
    compute = {device: float(mib) * MIB for device, mib in COMPUTE.findall(text)}
    facts = load_model_facts(big)
    ngl = "0" if "ngl0" in log else "99"
    argv = ["-m", str(big), "-c", cells, "-ngl", ngl, "-ctk", "q8_0", "-ctv", "q8_0", "-fa", "on"]
    req = to_request(parse("server", argv, {})).kv
    kv = plan_kv(facts, req)
    assert f"{kv.total_bytes / MIB:.2f}" == kv_mib
    host = host_compute_estimate(facts, kv)
    assert compute["CUDA_Host"] <= host <= compute["CUDA_Host"] * 1.05
    # with -ngl 0 the KV is in host memory and the CUDA build still runs the attention on CUDA0 (op offload):
    # one layer's K and V are copied over in their cache type beside the f16 copies
    device = compute_estimate(facts, kv, req, kv_f16_copies=True, kv_on_host=ngl == "0")
    assert compute["CUDA0"] <= device <= compute["CUDA0"] * 1.01


def test_ngl0_places_the_copies_on_the_gpu(big: Path) -> None:
    """The plan's memory per place for the recorded -ngl 0 start: KV on the host, CUDA0's compute buffer with
    the copies, as llama.cpp logged them."""
    text = (FIXTURES / "first-start-ngl0.log").read_text()
    kv_mib, cells = KV_LINE.findall(text)[-1]
    compute = {device: float(mib) * MIB for device, mib in COMPUTE.findall(text)}
    argv = ["-m", str(big), "-c", cells, "-ngl", "0", "-ctk", "q8_0", "-ctv", "q8_0", "-fa", "on"]
    request = to_request(parse("server", argv, {}))
    places = memory_by_place(load_model_facts(big), LlamaSettings(kv=request.kv, n_gpu_layers=0), _h200())
    assert "kv" not in places["CUDA0"] and f"{places['host']['kv'] / MIB:.2f}" == kv_mib
    assert compute["CUDA0"] <= places["CUDA0"]["compute"] <= compute["CUDA0"] * 1.01
    nopo = to_request(parse("server", [*argv, "--no-op-offload"], {}))
    layout = nopo.layout
    without = memory_by_place(load_model_facts(big), LlamaSettings(kv=nopo.kv, n_gpu_layers=0, layout=layout), _h200())
    # by rule (not recorded): without op offload the host KV is not copied over
    copied = int(cells) * 2 * 4352 + 512 * 4 * 4096  # one layer's K and V, and the layer's input
    assert places["CUDA0"]["compute"] - without["CUDA0"]["compute"] == copied


@pytest.fixture(scope="module")
def moe(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The recorded MoE model's layout (the recording's experts were f16 zeros; here the file is sparse: the
    same header and size, 15 GB that take no disk): 32 experts of 2048 per layer, 12 GiB in all."""
    return write_tiny_gguf(tmp_path_factory.mktemp("gpu") / "moe.gguf", n_layer=8, n_head=16, n_head_kv=16,
                           head_dim=256, n_ff=2048, n_expert=32, n_expert_used=2, expert_zeros=True,
                           n_ctx_train=2_000_000, name="moe-12g", sparse=True)  # fmt: skip


def test_cpu_moe_on_the_h200_started_first_time_within_3_percent(moe: Path) -> None:
    cases = json.loads((FIXTURES / "first-start-cases.json").read_text())
    rows = {row["case"]: row for row in cases["run3_moe_cpumoe"]}
    truth = rows["moe-cpumoe-c2M"]["largest_that_starts"]
    facts = load_model_facts(moe)
    assert moe.stat().st_size == 15_042_229_088  # the recorded file's size: the same layout
    policy = load_policy(packaged_configs() / "planner.toml")
    for case, args in (("moe-cpumoe-c2M", ["-c", "2000000"]), ("moe-cpumoe-noc", [])):
        request = to_request(parse("server", ["-m", str(moe), *args, "-ngl", "99", "--cpu-moe"], {}))
        layout = request.layout
        decided = plan(facts, request.kv, _h200(), policy, user_ngl=99, layout=layout)
        row = rows[case]
        assert row["safe_llama"]["ready"] and row["safe_llama"]["attempts"] == 1
        assert decided.settings.kv.n_ctx == row["chosen"] + 512 == 1_664_512  # 48 MiB of activations less
        assert decided.settings.kv.n_ctx / truth >= 0.97
    # without --cpu-moe the 12 GiB of experts would sit on the GPU: a smaller context
    bare = plan(facts, to_request(parse("server", ["-m", str(moe), "-ngl", "99"], {})).kv, _h200(), policy, user_ngl=99)
    assert bare.settings.kv.n_ctx is not None and bare.settings.kv.n_ctx < 1_664_000 - 100_000


def test_cpu_moe_buffers_logged_on_the_h200_are_the_planned_ones(moe: Path) -> None:
    text = (FIXTURES / "first-start-moe-cpumoe-c2M.log").read_text()
    model = {d: float(m) * MIB for d, m in re.findall(r"load_tensors: +(\S+) model buffer size = +([\d.]+) MiB", text)}
    kv_mib, cells = KV_LINE.findall(text)[-1]
    compute = {device: float(mib) * MIB for device, mib in COMPUTE.findall(text)}
    facts = load_model_facts(moe)
    argv = ["-m", str(moe), "-c", cells, "-ngl", "99", "--cpu-moe", "-ctk", "q8_0", "-ctv", "q8_0", "-fa", "on"]
    request = to_request(parse("server", argv, {}))
    layout = request.layout
    kv = plan_kv(facts, request.kv)
    assert f"{kv.total_bytes / MIB:.2f}" == kv_mib
    settings = LlamaSettings(kv=request.kv, n_gpu_layers=99, layout=layout)
    places = memory_by_place(facts, settings, _h200())
    # the experts stay in the mapped file on the host; the attention weights and the output go to the GPU
    assert abs(places["CUDA0"]["weights"] - model["CUDA0"]) <= 0.001 * model["CUDA0"]
    assert places["host"]["weights"] >= 12 * (1 << 30)
    device = compute_estimate(facts, kv, request.kv, kv_f16_copies=True)
    assert compute["CUDA0"] <= device <= compute["CUDA0"] * 1.01
    assert compute["CUDA_Host"] <= host_compute_estimate(facts, kv) <= compute["CUDA_Host"] * 1.05
