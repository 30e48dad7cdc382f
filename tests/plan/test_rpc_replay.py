"""Replays the H200 recordings with RPC workers (tests/fixtures/nvidia-h200-cuda/rpc, README there): the plan
for the recorded devices sets the split that was launched, and puts on each device the weights and KV that
llama.cpp logged there, and compute buffers at or above the logged ones (CUDA, pipelined)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from safe_llama.device.limits import Sourced
from safe_llama.device.llama_listing import parse_list_devices
from safe_llama.model.header_facts import load_model_facts
from safe_llama.model.kv import KvRequest
from safe_llama.paths import packaged_configs
from safe_llama.plan.memory import memory_by_place
from safe_llama.plan.planner import plan
from safe_llama.plan.policy import load_policy
from safe_llama.plan.target import Target, remote_devices
from tests import FIXTURES
from tests.tiny_gguf import write_tiny_gguf

RPC = FIXTURES / "nvidia-h200-cuda" / "rpc"
MIB = 1 << 20
BUFFER = re.compile(
    r"(?:load_tensors|llama_kv_cache|sched_reserve): +(?P<dev>\S+) (?P<what>model|KV|compute) buffer size"
    r" = +(?P<mib>[\d.]+) MiB"
)


@pytest.fixture(scope="module")
def spread(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_tiny_gguf(
        tmp_path_factory.mktemp("rpc") / "m12.gguf", n_layer=12, n_head=8, n_head_kv=8, head_dim=64, n_ff=4096,
        n_ctx_train=65536, sparse=True,
    )  # fmt: skip


def _logged(name: str) -> dict[str, dict[str, float]]:
    out: dict[str, dict[str, float]] = {}
    for line in (RPC / name).read_text(errors="replace").splitlines():
        if found := BUFFER.search(line):
            dev = found.group("dev")
            dev = dev[dev.index("[") + 1 : -1] if "[" in dev else dev  # RPC0[host:port] -> host:port
            out.setdefault(dev, {})[found.group("what")] = float(found.group("mib"))
    return out


def _h200_with(endpoints: list[str], declared: tuple[tuple[str, int], ...] = ()) -> Target:
    policy = load_policy(packaged_configs() / "planner.toml")
    listed = parse_list_devices((RPC / "list-devices-rpc.txt").read_text())
    workers = [d for d in listed.devices if d.backend == "rpc" and d.description in endpoints]
    cuda = next(d for d in listed.devices if d.name == "CUDA0")
    return Target(
        backend="cuda", device="CUDA0", on_gpu=True, kv_f16_copies=True,
        device_memory=Sourced(cuda.total_bytes, "probed", "llama.cpp --list-devices total of CUDA0"),
        host_budget=Sourced(120 << 30, "probed", "test"), remote=remote_devices(workers, declared),
        worker_overhead=policy.rpc_worker_overhead, pipeline_copies=policy.pipeline_copies,
        compute_costs=policy.compute,
    )  # fmt: skip


@pytest.mark.parametrize(
    ("log", "endpoints", "declared", "split"),
    [
        ("gpu-worker-and-cuda0.log", ["127.0.0.1:50053"], (), "6,7"),
        ("cpu-worker-and-cuda0.log", ["127.0.0.1:50052"], (("127.0.0.1:50052", 300 * MIB),), "0,13"),
        (
            "cpu-worker-gpu-worker-and-cuda0.log",
            ["127.0.0.1:50052", "127.0.0.1:50053"],
            (("127.0.0.1:50052", 300 * MIB),),
            "0,6,7",
        ),
    ],
)
def test_the_recorded_split_and_each_devices_buffers(
    spread: Path, log: str, endpoints: list[str], declared: tuple[tuple[str, int], ...], split: str
) -> None:
    facts = load_model_facts(spread)
    target = _h200_with(endpoints, declared)
    decided = plan(
        facts, KvRequest(tool="server", n_ctx=16384), target, load_policy(packaged_configs() / "planner.toml")
    )
    assert decided.argv_changes["--tensor-split"] == split
    places = memory_by_place(facts, decided.settings, target)
    names = {r.endpoint: r.name for r in target.remote}
    for device, real in _logged(log).items():
        if device in ("CPU", "CPU_Mapped"):
            continue
        planned = places.get(names.get(device, device), {})
        assert real.get("model", 0) == pytest.approx(planned.get("weights", 0) / MIB, abs=0.01), device
        assert real.get("KV", 0) == pytest.approx(planned.get("kv", 0) / MIB, abs=0.01), device
        if "compute" in real and real["compute"] > 1:
            assert planned["compute"] / MIB >= real["compute"] * 0.99, device
            assert planned["compute"] / MIB <= real["compute"] * 1.15, device
