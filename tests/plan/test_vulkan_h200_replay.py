"""Replays the Vulkan recordings on the H200 (tests/fixtures/nvidia-h200-vulkan/: the pinned llama.cpp built with
Vulkan against NVIDIA's driver, benchmarks/bench_vulkan_h200.sh and bench_shared_gpu.py there). From the probes as
they were recorded (llama-server --list-devices, the Vulkan report, OpenCL, NVML's free memory), the device is
mapped and planned as a launch plans it: the KV planned is the one llama.cpp logged on the first spawn, within
2% of the largest context that started (bisected there), while the bare binary aborted on the same words."""

from __future__ import annotations

import json
import re
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from safe_llama.cmdline.llama_args import parse
from safe_llama.cmdline.request import to_request
from safe_llama.device.llama_listing import DeviceRequest, parse_list_devices
from safe_llama.device.probe_free import reading_from_dict
from safe_llama.device.probe_opencl import report_from_dict as opencl_from_dict
from safe_llama.device.probe_sysfs import SysfsReport
from safe_llama.device.probe_vulkan import report_from_dict as vulkan_from_dict
from safe_llama.device.target_device import resolve_target
from safe_llama.diagnosis.signatures import classify, load_table, scan_text
from safe_llama.model.header_facts import load_model_facts
from safe_llama.model.kv import plan_kv
from safe_llama.paths import packaged_configs
from safe_llama.plan.compute import compute_estimate
from safe_llama.plan.planner import plan
from safe_llama.plan.policy import load_policy
from safe_llama.plan.target import Target, target_from
from tests import FIXTURES as TEST_FIXTURES
from tests.h200_vulkan import recorded_probes, replayed
from tests.tiny_gguf import write_tiny_gguf

FIXTURES = TEST_FIXTURES / "nvidia-h200-vulkan"
MIB = 1 << 20
KV_LINE = re.compile(r"llama_kv_cache: size = +([\d.]+) MiB \( *(\d+) cells")
COMPUTE = re.compile(r"sched_reserve: +(\S+) compute buffer size = +([\d.]+) MiB")
HELD_FREE = 63_559_565_312  # NVML's free bytes with 80 GiB held (59.19 GiB, as the held start's first line says)


@pytest.fixture(scope="module")
def big(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The recorded model: 8 layers x 16 KV heads x 256, 2,000,000 trained cells (sparse: the sizes only)."""
    return write_tiny_gguf(tmp_path_factory.mktemp("vk") / "big.gguf", n_layer=8, n_head=16, n_head_kv=16,
                           head_dim=256, n_ff=64, n_ctx_train=2_000_000, sparse=True)  # fmt: skip


@pytest.fixture(scope="module")
def recorded() -> dict[str, Any]:
    return recorded_probes()


def _target(recorded: dict[str, Any], free_bytes: int | None = None) -> Target:
    """The device as a launch maps it from the recorded probes (free memory replaced when given)."""
    free = None
    if free_bytes is not None:
        free = [reading_from_dict({**recorded["free"]["readings"][0], "free_bytes": free_bytes})]
    device, host = replayed(recorded, free)
    target = target_from(device, host, binary_version="0.6.0-dev")
    policy = load_policy(packaged_configs() / "planner.toml")
    # the policy's parts of the target, as pipeline/prepare.replan sets them
    runtime = int(policy.per_backend(policy.device_runtime, "vulkan") or 0)
    return replace(target, kv_f16_copies="vulkan" in policy.kv_f16_copy_backends, compute_costs=policy.compute,
                   device_runtime=runtime)  # fmt: skip


def test_the_recorded_probes_map_to_vulkan0_with_its_limits(recorded: dict[str, Any]) -> None:
    t = _target(recorded)
    assert (t.backend, t.device, t.on_gpu, t.integrated) == ("vulkan", "Vulkan0", True, False)
    assert t.max_alloc is not None and t.max_alloc.value == 4_292_870_144  # maxMemoryAllocationSize
    assert t.max_tensor is not None and t.max_tensor.value == 4_294_967_295  # maxStorageBufferRange
    assert t.alloc_block == 1 << 30
    assert t.device_free is not None and t.device_free.value == 150_109_880_320  # NVML by PCI 0000:00:06.0


@pytest.mark.parametrize("case", ["ngl99-c2M", "ngl99"])
def test_the_plan_is_the_context_that_started_first_time(big: Path, recorded: dict[str, Any], case: str) -> None:
    rows = {row["case"]: row for row in json.loads((FIXTURES / "first-start-cases.json").read_text())}
    row = rows[case]
    req = to_request(parse("server", ["-m", str(big), *row["args"]], {})).kv
    decided = plan(load_model_facts(big), req, _target(recorded), load_policy(packaged_configs() / "planner.toml"),
                   user_ngl=99)  # fmt: skip
    kv = decided.settings.kv
    assert row["safe_llama"]["ready"] and row["safe_llama"]["attempts"] == 1
    assert (kv.n_ctx, kv.type_k, kv.type_v) == (row["chosen"], "q8_0", "q8_0") == (970_752, "q8_0", "q8_0")
    assert row["chosen"] / row["largest_that_starts"] >= 0.98
    # one layer's K of the chosen context stays under maxStorageBufferRange; the next 1% would not
    assert kv.n_ctx is not None
    assert kv.n_ctx * 16 * 256 * 34 // 32 <= 4_294_967_295 < int(kv.n_ctx * 1.02) * 16 * 256 * 34 // 32


def test_logged_kv_and_compute_are_the_planned_ones(big: Path) -> None:
    text = (FIXTURES / "first-start-ngl99-c2M.log").read_text()
    kv_mib, cells = KV_LINE.findall(text)[-1]
    compute = {device: float(mib) * MIB for device, mib in COMPUTE.findall(text)}
    argv = ["-m", str(big), "-c", cells, "-ngl", "99", "-ctk", "q8_0", "-ctv", "q8_0", "-fa", "on"]
    req = to_request(parse("server", argv, {})).kv
    decided_kv = plan(load_model_facts(big), req, _target_fixed(), load_policy(packaged_configs() / "planner.toml"),
                      user_ngl=99).settings.kv  # fmt: skip
    assert decided_kv.n_ctx == int(cells)
    estimate = compute_estimate(load_model_facts(big), plan_kv(load_model_facts(big), decided_kv), decided_kv)
    assert compute["Vulkan0"] <= estimate <= compute["Vulkan0"] * 1.05
    assert float(kv_mib) == 64464.00


def _target_fixed() -> Target:
    return _target(json.loads((FIXTURES / "safe-llama-devices.json").read_text()))


def test_a_gpu_with_80_gib_held_plans_by_its_free_memory(big: Path, recorded: dict[str, Any]) -> None:
    """Another process held 80 GiB: the plan reads NVML's free memory for Vulkan0 and sizes the context by it;
    that context started on the first spawn and llama.cpp logged it."""
    rows = json.loads((FIXTURES / "held80-cases.json").read_text())
    row = next(r for r in rows if r.get("case") == "vk-ngl99-c2M")
    req = to_request(parse("server", ["-m", str(big), "-c", "2000000", "-ngl", "99"], {})).kv
    policy = load_policy(packaged_configs() / "planner.toml")
    decided = plan(load_model_facts(big), req, _target(recorded, HELD_FREE), policy, user_ngl=99)
    _, cells = KV_LINE.findall((FIXTURES / "held80-c2M-ngl99-safe-llama.log").read_text())[-1]
    assert row["chosen"] == int(cells) == 815_104 and row["chosen"] / row["largest_that_starts"] >= 0.94
    assert row["safe_llama"]["ready"] and row["safe_llama"]["attempts"] == 1
    # since: the runtime's measured 64 MiB and a 2% margin (not 512 MiB and 5%), the compute as its graph holds it:
    # 0.98 of the largest that started (by this replay; the H200 run of benchmarks/gpu_layouts_first_start.sh checks it)
    assert decided.settings.kv.n_ctx == 848_896 and 0.97 <= decided.settings.kv.n_ctx / row["largest_that_starts"] < 1
    assert not row["bare"]["ready"]


def test_the_bare_abort_is_recognised() -> None:
    """The bare binary's abort (one layer's K over maxStorageBufferRange) is read as a per-tensor limit."""
    text = (FIXTURES / "bare-c2M-ngl99.log").read_text()
    assert "cannot run the operation" in text and text.rstrip().endswith("rc=134")
    failure = classify(scan_text(load_table(), text.encode()), -6)
    assert failure is not None and failure.memory and failure.signature_id == "kv-tensor-unsupported"


@pytest.mark.parametrize("now", [True, False])
def test_without_nvml_the_free_figure_is_vk_memory_budget_read_now(recorded: dict[str, Any], now: bool) -> None:
    """No vendor reading (NVML absent): the Vulkan probe's VK_EXT_memory_budget (heapBudget - heapUsage of the
    device-local heap) is the free figure when that probe ran now; a cached probe's is not, and the listing's
    figure (llama.cpp run again at launch) is taken instead."""
    listed = parse_list_devices((FIXTURES / "list-devices.txt").read_text())
    device = resolve_target(
        request=DeviceRequest(None, "default", None), listed=listed,
        opencl=opencl_from_dict(recorded["opencl"]), sysfs=SysfsReport((), (), "not replayed"),
        host_total=recorded["host"]["total"]["value"], env={}, free_now=(),
        vulkan=vulkan_from_dict(recorded["vulkan"]), vulkan_now=now,
    )  # fmt: skip
    free = device.memory_free_bytes
    assert free is not None and device.vulkan is not None
    if now:
        assert (free.value, free.detail) == (150_092_709_888, "free now (VK_EXT_memory_budget)")
        assert device.free_is_vendor  # no listing is run again for it
    else:
        assert "--list-devices" in free.detail and not device.free_is_vendor
