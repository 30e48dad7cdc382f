"""Tests for safe_llama/run/footprint.py: an attempt's size as the retry compares them, on a real prepared launch
(a 3B model's header, the pinned CPU build, a declared 4 GiB host budget, which holds less KV than -c 65536)."""

from __future__ import annotations

import os
from dataclasses import replace
from pathlib import Path

import pytest

from safe_llama.pipeline.options import launch_options
from safe_llama.pipeline.prepare import PlanOptions, Prepared, prepare, replan
from safe_llama.run import footprint
from tests.tiny_gguf import LLAMA_3B, write_metadata_gguf

Launch = tuple[Prepared, PlanOptions, dict[str, str]]


@pytest.fixture(scope="module")
def launch(tmp_path_factory: pytest.TempPathFactory, llama_bin: Path) -> Launch:
    tmp = tmp_path_factory.mktemp("footprint")
    model = write_metadata_gguf(tmp / "Llama-3.2-3B-Instruct-Q4_K_M.gguf", "llama", LLAMA_3B)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("LLAMA_ARG_", "SAFE_LLAMA_", "GGML_"))}
    env.update(XDG_CACHE_HOME=str(tmp / "cache"), XDG_CONFIG_HOME=str(tmp / "config"))
    env["SAFE_LLAMA_BIN_DIR"] = str(llama_bin)
    options = launch_options({"host_memory": "4G"}).plan
    prepared = prepare("completion", ["-m", str(model), "-c", "65536"], env, options)
    assert prepared.plan is not None and not prepared.target.on_gpu
    return prepared, options, env


def test_footprints_on_the_cpu(launch: Launch) -> None:
    prepared, _, _ = launch
    assert prepared.plan is not None
    planned = footprint.planned_footprint(prepared)
    unplanned = footprint.unplanned_footprint(prepared)
    assert planned == (0, 0, prepared.plan.kv.total_bytes)  # nothing on a device: the KV in all is the size
    assert unplanned[:2] == (0, 0) and unplanned[2] > planned[2]  # -c 65536 as asked is more than the plan


def test_the_failed_attempt_as_the_retry_sees_it(launch: Launch) -> None:
    prepared, _, _ = launch
    assert prepared.plan is not None
    planned = footprint.attempted(prepared, None, planned=True, stepped=False)
    assert (planned.kv_bytes, planned.stepped, planned.device) == (prepared.plan.kv.total_bytes, False, None)
    as_asked = footprint.attempted(prepared, footprint.unplanned_footprint(prepared), planned=False, stepped=True)
    assert as_asked.kv_bytes == footprint.unplanned_footprint(prepared)[2] and as_asked.stepped
    assert as_asked.compute_estimate > planned.compute_estimate  # the compute estimate at the larger KV


def test_a_cap_binds_only_below_what_the_limits_allow(launch: Launch) -> None:
    prepared, options, env = launch
    assert prepared.plan is not None
    assert not footprint.cap_binds(prepared, options, env)  # no cap at all
    below = replace(options, kv_cap=prepared.plan.kv.total_bytes // 4)
    assert footprint.cap_binds(replan(prepared, below, env), below, env)
    above = replace(options, kv_cap=prepared.plan.kv.total_bytes * 2)
    assert not footprint.cap_binds(replan(prepared, above, env), above, env)
