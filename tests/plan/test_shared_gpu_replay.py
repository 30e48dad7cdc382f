"""Replays the H200 recordings of a GPU that another process shares (tests/fixtures/nvidia-h200-cuda/shared-gpu/,
the pinned llama.cpp built with CUDA, benchmarks/bench_shared_gpu.py there): the plan for the free memory that
was read reproduces the argv that started on the first spawn, and that argv is within 3% of the largest that
started (bisected there) and above llama.cpp's own fit; the weights placed on CUDA0 are the logged model
buffer; a failed start of the weights teaches a device cap and leaves the KV alone."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from safe_llama.attempts.retry import Attempt, named_lesson
from safe_llama.cmdline.llama_args import parse
from safe_llama.cmdline.memory_flags import LlamaSettings
from safe_llama.cmdline.request import to_request
from safe_llama.device.limits import Sourced
from safe_llama.diagnosis.signatures import classify, load_table, scan_text
from safe_llama.errors import ExitStatus, SafeLlamaError
from safe_llama.model.header_facts import load_model_facts
from safe_llama.paths import packaged_configs
from safe_llama.plan.lessons import Lessons
from safe_llama.plan.memory import memory_by_place
from safe_llama.plan.planner import Plan, plan
from safe_llama.plan.policy import Policy, load_policy
from safe_llama.plan.target import Target
from tests import FIXTURES as TEST_FIXTURES
from tests.tiny_gguf import write_tiny_gguf

FIXTURES = TEST_FIXTURES / "nvidia-h200-cuda" / "shared-gpu"
MIB = 1 << 20
DEVICE_MIB = 143155  # llama-server --list-devices there
HOST = 134_463_045_632


@pytest.fixture(scope="module")
def models(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """The recorded models, written the same way as there (sparse: the sizes without the bytes)."""
    d = tmp_path_factory.mktemp("shared-gpu")
    return {
        "big": write_tiny_gguf(d / "big.gguf", n_layer=8, n_head=16, n_head_kv=16, head_dim=256, n_ff=64,
                               n_ctx_train=2_000_000, sparse=True),
        "dense": write_tiny_gguf(d / "dense.gguf", n_layer=24, n_head=32, n_head_kv=8, head_dim=128, n_ff=4096,
                                 n_ctx_train=8192, sparse=True),
        "moe": write_tiny_gguf(d / "moe.gguf", n_layer=8, n_head=16, n_head_kv=8, head_dim=128, n_ff=2048,
                               n_expert=16, n_expert_used=2, n_ctx_train=32768, sparse=True),
    }  # fmt: skip


@pytest.fixture(scope="module")
def policy() -> Policy:
    return load_policy(packaged_configs() / "planner.toml")


def _h200(free: int, policy: Policy) -> Target:
    return Target(
        backend="cuda", device="CUDA0", on_gpu=True, kv_f16_copies=True, compute_costs=policy.compute,
        device_memory=Sourced(DEVICE_MIB * MIB, "probed", "llama.cpp --list-devices total of CUDA0"),
        device_free=Sourced(free, "probed", "free now (nvml, 0000:00:06.0)"),
        device_runtime=policy.device_runtime["cuda"],
        host_budget=Sourced(HOST, "probed", "psutil: MemAvailable"),
    )  # fmt: skip


def _rows(name: str) -> dict[str, dict[str, object]]:
    rows = json.loads((FIXTURES / name).read_text())
    return {str(r["case"]): r for r in rows if "case" in r}


def _free_at_plan(row: dict[str, object], policy: Policy) -> int:
    """The free memory the recorded plan read: its device budget is that less the CUDA runtime's part."""
    budget = row["device_budget"]
    assert isinstance(budget, dict)
    return int(budget["bytes"]) + policy.device_runtime["cuda"]


def _plan(model: Path, args: list[str], target: Target, policy: Policy) -> tuple[list[str], Plan]:
    req = to_request(parse("server", ["-m", str(model), *args], {}))
    ngl = int(req.n_gpu_layers) if req.n_gpu_layers is not None else None
    layout = req.layout
    decided = plan(load_model_facts(model), req.kv, target, policy, user_ngl=ngl, layout=layout)
    return [f"{k} {v}" for k, v in decided.argv_changes.items()], decided


@pytest.mark.parametrize("case", ["ngl99-c2M", "ngl99-noc"])
def test_80_gib_held_plans_the_context_that_started(models: dict[str, Path], policy: Policy, case: str) -> None:
    row = _rows("runs-held80.json")[case]
    args = [str(a) for a in row["args"]]  # type: ignore[attr-defined]
    _, decided = _plan(models["big"], args, _h200(_free_at_plan(row, policy), policy), policy)
    kv = decided.settings.kv
    safe = row["safe_llama"]
    bare = row["bare"]
    assert isinstance(safe, dict) and isinstance(bare, dict)
    assert safe["ready"] and safe["attempts"] == 1
    # the recording's plan carried 48 MiB of activations more than the graph holds: one 512-cell step more now
    assert kv.n_ctx == int(str(row["chosen"])) + 512 == 682_240 and (kv.type_k, kv.type_v) == ("q8_0", "q8_0")
    assert kv.n_ctx / int(str(row["largest_that_starts"])) >= 0.97
    # llama.cpp's own fit, beside it: f16 at 451,840 cells (with no -c); -c 2000000 -ngl 99 did not start
    assert bare["ready"] == (case == "ngl99-noc")
    assert kv.n_ctx > 451_840


@pytest.mark.parametrize("case", ["dense-ngl99", "dense-c8k"])
def test_5_gib_free_keeps_the_layers_that_fit_and_the_context(
    models: dict[str, Path], policy: Policy, case: str
) -> None:
    row = _rows("runs-free5.json")[case]
    args = [str(a) for a in row["args"]]  # type: ignore[attr-defined]
    free = _free_at_plan(row, policy)
    changes, decided = _plan(models["dense"], args, _h200(free, policy), policy)
    recorded = [str(a) for a in row["plan_argv"]]  # type: ignore[attr-defined]
    assert changes == ["--gpu-layers 10", "--fit off"]
    assert recorded[recorded.index("-ngl") + 1] == "10" and recorded[recorded.index("-fit") + 1] == "off"
    assert row["chosen_ngl"] == row["largest_ngl_that_starts"] == 10  # -ngl 11 did not start there
    assert decided.settings.kv.n_ctx == 8192 and decided.settings.kv.type_k == "f16"
    # the weights on CUDA0 at -ngl 10 are the model buffer llama.cpp logged
    log = (FIXTURES / "free5-dense-c8k-ngl99-safe-llama.log").read_text()
    logged = float(log.split("CUDA0 model buffer size =")[1].split("MiB")[0]) * MIB
    places = memory_by_place(
        load_model_facts(models["dense"]),
        decided.settings,
        _h200(free, policy),
    )
    assert abs(places["CUDA0"]["weights"] - logged) < 0.01 * MIB
    reason = decided.steps[0].reason
    assert (
        "-ngl 10, 9 of 24 layers and the output layer on the GPU" in reason
        and "free now (nvml, 0000:00:06.0)" in reason
    )
    assert ("your -ngl 99" in reason) == ("-ngl" in args)


def test_the_moe_compute_buffer_that_failed_is_planned_now(models: dict[str, Path], policy: Policy) -> None:
    """There -ncmoe 4 was planned (the experts' activations not yet in the compute estimate): CUDA0's weights and
    KV were as planned, its compute buffer (296.01 MiB) did not fit. The estimate now holds it, and the plan
    moves one more layer's experts to the host."""
    log = (FIXTURES / "free5-moe-c8k-ngl99-ncmoe4.log").read_text()
    failed = int(log.split("failed to allocate CUDA0 buffer of size ")[1].split()[0])
    facts = load_model_facts(models["moe"])
    row = _rows("runs-free5.json")["moe-ngl99"]
    free = _free_at_plan(row, policy)
    req = to_request(parse("server", ["-m", str(models["moe"]), "-c", "8192", "-ngl", "99", "-ncmoe", "4"], {}))
    layout = req.layout
    places = memory_by_place(facts, LlamaSettings(kv=req.kv, n_gpu_layers=99, layout=layout), _h200(free, policy))
    assert abs(places["CUDA0"]["weights"] - 3459.69 * MIB) < 0.01 * MIB
    assert places["CUDA0"]["compute"] >= failed - 0.05 * MIB
    changes, _ = _plan(models["moe"], ["-c", "8192", "-ngl", "99"], _h200(free, policy), policy)
    assert "--n-cpu-moe 5" in changes and not any(c.startswith("--gpu-layers") for c in changes)


def test_the_moe_plan_started_first_time_with_the_fewest_experts_moved(models: dict[str, Path], policy: Policy) -> None:
    """The fixed plan, run there (run3-moe-shrink.json, all but 4,500 MiB held): -ncmoe 5 started on the first
    spawn, -ncmoe 4 did not start with its argv (the fewest that starts is the one planned), bare -ngl 99 failed."""
    row = _rows("run3-moe-shrink.json")["moe-ngl99"]
    changes, _ = _plan(models["moe"], ["-c", "8192", "-ngl", "99"], _h200(_free_at_plan(row, policy), policy), policy)
    recorded = [str(a) for a in row["plan_argv"]]  # type: ignore[attr-defined]
    assert "--n-cpu-moe 5" in changes and recorded[recorded.index("-ncmoe") + 1] == "5"
    safe, bare = row["safe_llama"], row["bare"]
    assert isinstance(safe, dict) and isinstance(bare, dict)
    assert safe["ready"] and safe["attempts"] == 1 and not bare["ready"]
    assert row["chosen_ncmoe"] == row["fewest_ncmoe_that_starts"] == 5
    log = (FIXTURES / "free5-moe-c8k-ngl99-safe-llama.log").read_text()
    assert "-ncmoe 5: the experts of 5 of 8 layers in host memory" in log and "failed" not in log.split("ready")[0]


def test_memory_taken_between_plan_and_start_is_read_again_on_the_retry() -> None:
    """There 30 GiB more were taken after the plan (80 GiB held, then 110): attempt 1's KV failed on CUDA0,
    the retry named the device and the allocation, read the free memory again and the second spawn served."""
    row = _rows("run3-moe-shrink.json")["shrink"]
    assert row["ready"] and row["attempts"] == 2
    lines = [str(x) for x in row["lines"]]  # type: ignore[attr-defined]
    failed = next(x for x in lines if x.startswith("safe-llama: attempt 1 failed"))
    assert "allocating 44795.00 MiB on device 0" in failed and "did not fit on CUDA0" in failed
    assert "safe-llama: CUDA0: 28.59 GiB free now, 58.59 GiB when planned: planning with it" in lines
    log = (FIXTURES / "shrink-held80-then-30-safe-llama.log").read_text()
    cells = [int(c) for c in re.findall(r"llama_kv_cache: size = +[\d.]+ MiB \( *(\d+) cells", log)]
    assert len(cells) >= 1 and cells[-1] < 674_560  # the second plan's smaller context is the one that started


def test_keep_user_ngl_keeps_it_and_says_nothing_fits(models: dict[str, Path], policy: Policy) -> None:
    from dataclasses import replace

    row = _rows("runs-free5.json")["dense-ngl99"]
    strict = replace(policy, keep_user_ngl=True)
    with pytest.raises(SafeLlamaError) as failed:
        _plan(models["dense"], ["-c", "8192", "-ngl", "99"], _h200(_free_at_plan(row, policy), strict), strict)
    assert failed.value.status == ExitStatus.NOTHING_FITS


def test_weights_that_failed_cap_the_device_and_keep_the_kv() -> None:
    """bare llama-server -c 8192 -ngl 99 with 4.4 GiB free: the CUDA0 model buffer (8,864,530,432 bytes)."""
    data = (FIXTURES / "bare5-dense-c8k-ngl99.log").read_bytes()
    failure = classify(scan_text(load_table(), data), 1)
    assert failure is not None and failure.stage == "weights" and failure.buffer == "CUDA0"
    assert failure.requested_bytes == 8_864_530_432
    lesson = named_lesson(Attempt(kv_bytes=805_306_368, compute_estimate=1, device="CUDA0"), failure, Lessons())
    assert lesson is not None and lesson.lessons.device_cap == 8_864_530_431
    assert lesson.lessons.kv_cap is None
    assert "did not fit on CUDA0" in lesson.reason and "the KV kept" in lesson.reason


def test_a_device_cap_lowers_the_budget_below_free_memory(policy: Policy) -> None:
    from dataclasses import replace

    target = replace(_h200(60 * 1024 * MIB, policy), device_cap=10 * 1024 * MIB)
    budget = target.device_budget
    assert budget is not None and budget.value == 10 * 1024 * MIB and budget.source == "learned"
    declared = replace(target, device_memory=Sourced(100 * 1024 * MIB, "declared", "--device-memory"), device_cap=None)
    assert declared.device_budget is not None and declared.device_budget.value == 100 * 1024 * MIB
