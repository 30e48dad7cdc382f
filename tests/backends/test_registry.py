"""backends.registry: one list of backends, and the questions every other module asks of it."""

from __future__ import annotations

import re
import tomllib

import pytest

from safe_llama.backends.backend import AllocRule
from safe_llama.backends.registry import (
    ALLOC_RULES,
    BACKENDS,
    RENUMBERING_ENV,
    backend_named,
    backend_of,
    gpu_marks,
    log_marks,
    rule_for,
)
from safe_llama.paths import packaged_configs


@pytest.mark.parametrize(
    ("name", "backend"),
    [
        pytest.param("OPENVINO3", "openvino", id="openvino"),
        pytest.param("CUDA1", "cuda", id="cuda"),
        pytest.param("ROCm0", "hip", id="rocm"),
        pytest.param("Vulkan0", "vulkan", id="vulkan"),
        pytest.param("SYCL0", "sycl", id="sycl"),
        pytest.param("MTL0", "metal", id="metal"),
        pytest.param("GPUOpenCL", "opencl", id="opencl"),
        pytest.param("RPC0", "rpc", id="rpc"),
        pytest.param("CPU", "cpu", id="cpu"),
        pytest.param("Frobnicator0", "other", id="unknown"),
    ],
)
def test_backend_of(name: str, backend: str) -> None:
    assert backend_of(name) == backend


def test_names_and_prefixes_are_each_one_backends() -> None:
    names = [b.name for b in BACKENDS]
    prefixes = [p for b in BACKENDS for p in b.prefixes]
    assert len(set(names)) == len(names) and len(set(prefixes)) == len(prefixes)
    assert BACKENDS[-1].name == "cpu"  # a log names the CPU beside every other backend: it is the last resort


def test_an_unknown_name_is_a_backend_without_rules_or_quirks() -> None:
    unknown = backend_named("frobnicator")
    assert (unknown.rules, unknown.stateful_env, unknown.q8_kv_verified) == ({}, None, True)


@pytest.mark.parametrize(
    ("backend", "device", "key"),
    [
        pytest.param("cuda", None, "cuda", id="one-kind"),
        pytest.param("openvino", None, "openvino:CPU", id="openvino-default"),
        pytest.param("openvino", "GPU.1", "openvino:GPU", id="openvino-gpu"),
        pytest.param("openvino", "NPU", "openvino:NPU", id="openvino-npu"),
    ],
)
def test_rule_for(backend: str, device: str | None, key: str) -> None:
    assert rule_for(ALLOC_RULES, backend, device) == ALLOC_RULES[key]


def test_a_user_rule_for_a_backend_safe_llama_does_not_know() -> None:
    mine = AllocRule((), "unprobed", "mine")
    assert rule_for({"frobnicator": mine}, "frobnicator", None) == mine
    assert rule_for(ALLOC_RULES, "cann", None) is None


def test_every_backends_renumbering_variable_is_listed() -> None:
    wanted = {"CUDA_VISIBLE_DEVICES", "HIP_VISIBLE_DEVICES", "GGML_VK_VISIBLE_DEVICES", "ZE_AFFINITY_MASK"}
    assert wanted <= set(RENUMBERING_ENV)


@pytest.mark.parametrize(
    ("line", "backend", "on_gpu"),
    [
        pytest.param("ggml_vulkan: Found 1 Vulkan devices:", "vulkan", False, id="vulkan-found"),
        pytest.param("load_tensors: offloaded 27/27 layers to GPU, CUDA0 model buffer", "cuda", True, id="cuda"),
        pytest.param("llama_kv_cache:      ROCm0 KV buffer size", "hip", True, id="rocm"),
        pytest.param("[GPU] Exceeded max size of memory object allocation", "openvino", True, id="openvino"),
        pytest.param("load_tensors:   CPU_Mapped model buffer size", None, False, id="cpu-mapped"),
        pytest.param("llama_kv_cache:        CPU buffer size", "cpu", False, id="cpu"),
    ],
)
def test_log_marks(line: str, backend: str | None, on_gpu: bool) -> None:
    found = [name for name, marks in log_marks() if re.search(marks, line)]
    assert (found[0] if found else None) == backend
    assert bool(re.search(gpu_marks(), line)) is on_gpu


def test_planner_tables_key_their_numbers_by_a_backends_name() -> None:
    """configs/planner.toml's per-backend tables name only registered backends (or "default")."""
    policy = tomllib.loads((packaged_configs() / "planner.toml").read_text())
    tables = (
        "max_alloc_margin_bytes",
        "memory_margin_fraction",
        "process_overhead_bytes",
        "address_space_overhead_bytes",
        "kv_split",
        "device_runtime_bytes",
        "device_context_bytes",
        "ladder",
    )
    keys = {key for table in tables for key in policy[table]} | set(policy["compute"]["kv_f16_copies"])
    assert keys - {b.name for b in BACKENDS} - {"default"} == set()


def test_the_quirks_device_asks_about_are_declared_by_one_backend_each() -> None:
    """device/ applies these by property: the backend that has the quirk is the only one that says so."""
    assert [b.name for b in BACKENDS if b.free_source == "nvml"] == ["cuda"]
    assert [b.name for b in BACKENDS if b.vulkan_limits] == ["vulkan"]
    assert [b.name for b in BACKENDS if b.own_device_env] == ["openvino"]
    assert [b.name for b in BACKENDS if b.igpu_first] == ["openvino"]
    assert [b.name for b in BACKENDS if not b.q8_kv_verified] == ["openvino"]


def test_openvino_reads_its_own_device_from_the_description() -> None:
    openvino = backend_named("openvino")
    assert openvino.own_device_in_description is not None and openvino.integrated_in_description is not None
    found = re.match(
        openvino.own_device_in_description, "GGML_OPENVINO_DEVICE=GPU.1 (selected) - Intel(R) Arc(TM) A770 (dGPU)"
    )
    assert found is not None
    assert (found.group("ov"), found.group("selected"), found.group("full")) == (
        "GPU.1",
        " (selected)",
        "Intel(R) Arc(TM) A770 (dGPU)",
    )
    kind = re.search(openvino.integrated_in_description, found.group("full"))
    assert kind is not None and kind.group("integrated") == "d"
