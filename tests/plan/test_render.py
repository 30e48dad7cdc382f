"""plan.render: a plan as a JSON-ready dict and as text for people, from the same values, with every secret
(an option's value, an environment variable) redacted before it is shown."""

from __future__ import annotations

import json
from dataclasses import replace
from typing import Any

import pytest

from safe_llama.cmdline.llama_args import REDACTED
from safe_llama.device.limits import Sourced
from safe_llama.errors import ExitStatus, SafeLlamaError
from safe_llama.model.facts import ModelFacts
from safe_llama.model.header_facts import load_model_facts
from safe_llama.model.kv import KvPlan, KvRequest, plan_kv
from safe_llama.paths import packaged_configs
from safe_llama.plan.planner import Plan, plan
from safe_llama.plan.policy import load_policy
from safe_llama.plan.render import bar, decision_result, decision_text, plan_result, plan_text
from safe_llama.plan.steps import Step
from safe_llama.plan.target import Target
from tests.tiny_gguf import write_tiny_gguf

MIB = 1 << 20
TARGET = Target(backend="cpu", host_budget=Sourced(8 << 30, "declared", "--host-memory"), binary_version="b1234")


@pytest.fixture(scope="module")
def facts(tmp_path_factory: pytest.TempPathFactory) -> ModelFacts:
    return load_model_facts(write_tiny_gguf(tmp_path_factory.mktemp("m") / "tiny.gguf"))


@pytest.fixture(scope="module")
def kv(facts: ModelFacts) -> KvPlan:
    return plan_kv(facts, KvRequest(tool="server", n_ctx=4096, n_parallel=2))


@pytest.fixture(scope="module")
def decided(facts: ModelFacts) -> Plan:
    policy = load_policy(packaged_configs() / "planner.toml")
    return plan(facts, KvRequest(tool="server", n_ctx=4096, n_parallel=2), TARGET, policy)


def test_plan_result_holds_the_model_and_its_kv(facts: ModelFacts, kv: KvPlan) -> None:
    result = plan_result(tool="server", model_path="/m/tiny.gguf", facts=facts, kv=kv, bundled=False)
    assert result["tool"] == "server"
    assert result["model"] == {
        "path": "/m/tiny.gguf",
        "bundled": False,
        "architecture": "llama",
        "known_architecture": True,
        "block_count": 2,
        "context_length": 2048,
        "weight_bytes": facts.total_weight_bytes,
    }
    assert (result["kv"]["n_ctx"], result["kv"]["n_seq_max"], result["kv"]["total_bytes"]) == (4096, 2, kv.total_bytes)
    (cache,) = result["kv"]["caches"]
    assert cache["kind"] == "full" and cache["k_bytes"] + cache["v_bytes"] == kv.total_bytes
    assert set(cache["log_mib"]) == {"total", "k", "v"}
    assert result["notes"] == list(facts.notes) + list(kv.notes) and result["notes"]
    assert json.loads(json.dumps(result)) == result  # JSON-ready as it is


def test_plan_text_says_the_same_values(facts: ModelFacts, kv: KvPlan) -> None:
    result = plan_result(tool="server", model_path="/m/tiny.gguf", facts=facts, kv=kv, bundled=True)
    result["memory"] = {"host": {"kv": 2 * MIB, "compute": MIB}, "CUDA0": {}}
    lines = plan_text(result).splitlines()
    assert lines[0] == "model   /m/tiny.gguf (bundled)"
    assert lines[1].startswith("        llama, 2 layers, trained context 2048, weights ")
    assert lines[2] == "context n_ctx 4096 (2048 per sequence), 2 sequence(s), 2 stream(s)"
    result["kv"]["unified"] = True
    assert plan_text(result).splitlines()[2].endswith(", unified")
    (row,) = (line for line in lines if line.startswith("full "))
    assert row.split()[:5] == ["full", str(kv.caches[0].cells), "2", "f16", "f16"]
    assert f"{kv.caches[0].k_bytes:,}" in row
    assert any(line.startswith("total ") and f"{kv.total_bytes:,}" in line for line in lines)
    assert [line for line in lines if line.startswith("note: ")] == [f"note: {n}" for n in result["notes"]]
    assert "memory  host: kv 2.00 MiB, compute 1.00 MiB (total 3.00 MiB)" in lines
    assert "memory  CUDA0: nothing (total 0 B)" in lines
    assert not any(line.startswith("target") for line in lines)  # no decision asked for: none shown


def test_decision_result_of_a_plan(decided: Plan) -> None:
    argv = ["llama-server", "-m", "/m/tiny.gguf", "-c", "4096"]
    result = decision_result(TARGET, decided, argv, None)
    assert result["fits"] is True
    assert result["target"]["backend"] == "cpu" and result["target"]["on_gpu"] is False
    assert result["target"]["host_budget"] == {"bytes": 8 << 30, "source": "declared", "detail": "--host-memory"}
    assert result["target"]["max_alloc"] is None and result["target"]["rpc"] == []
    assert result["decision"]["argv"] == argv
    assert result["decision"]["steps"] == [s.name for s in decided.steps]
    assert [a["name"] for a in result["allocations"]] == [a.name for a in decided.allocations]
    assert all(a["fits"] and a["bytes"] <= a["limit"] for a in result["allocations"])
    assert json.loads(json.dumps(result)) == result


def test_secrets_are_redacted(decided: Plan) -> None:
    argv = ["llama-server", "--api-key", "sk-1", "--hf-token=hf_2", "-hft", "hf_3", "-a", "alias"]
    secret_env = {"HF_TOKEN": "hf_4", "MY_API_KEY_X": "sk-5", "MALLOC_ARENA_MAX": "2"}
    result = decision_result(TARGET, replace(decided, env_changes=secret_env), argv, None)
    assert result["decision"]["argv"] == [
        "llama-server", "--api-key", REDACTED, f"--hf-token={REDACTED}", "-hft", REDACTED, "-a", "alias",
    ]  # fmt: skip
    assert result["decision"]["env"] == {"HF_TOKEN": REDACTED, "MY_API_KEY_X": REDACTED, "MALLOC_ARENA_MAX": "2"}
    shown = json.dumps(result) + "\n".join(decision_text(result))
    assert not any(secret in shown for secret in ("sk-1", "hf_2", "hf_3", "hf_4", "sk-5"))
    assert "MALLOC_ARENA_MAX=2" in shown


def test_nothing_fits(decided: Plan) -> None:
    error = SafeLlamaError("safe-llama: nothing fits: -c 4096 needs 9 GiB", ExitStatus.NOTHING_FITS)
    result = decision_result(TARGET, None, ["llama-server"], error)
    assert (result["fits"], result["decision"], result["allocations"]) == (False, None, [])
    assert result["error"] == error.message
    assert decision_text(result)[-1] == f"decision: nothing fits. {error.message}"
    assert decision_result(TARGET, None, [], None)["error"] is None


def _text(decided: Plan, argv: list[str]) -> list[str]:
    return decision_text(decision_result(TARGET, decided, argv, None))


def test_decision_text(decided: Plan) -> None:
    result = decision_result(TARGET, decided, ["llama-server", "-a", "my model"], None)
    lines = decision_text(result)
    assert lines[1] == "target  cpu host CPU, llama.cpp b1234"
    (host,) = result["allocations"]
    row = lines.index(next(line for line in lines if line.startswith(host["name"])))
    assert lines[row].endswith(bar(host["bytes"], host["limit"]))
    assert lines[row + 1].strip() == f"limit: {host['limit_name']}"
    assert "largest context that fits: f16 4096" in lines
    assert [line for line in lines if line.startswith("change: ")] == [f"change: {s.reason}" for s in decided.steps]
    assert lines[-1] == "argv: llama-server -a 'my model'"  # quoted as a shell would need it
    stepped = replace(
        decided, steps=(Step("ctx", "-c 2048: the largest that fits"),), env_changes={"GGML_X": "a b"}, notes=("n1",)
    )
    lines = _text(stepped, ["llama-server"])
    assert [line for line in lines if line.startswith("change: ")] == ["change: -c 2048: the largest that fits"]
    assert "note: n1" in lines and lines[-1] == "env:  GGML_X='a b'"
    assert "change: none: it fits as asked" in _text(replace(decided, steps=()), ["llama-server"])


def test_a_gpu_target_names_its_device(decided: Plan) -> None:
    gpu = Target(backend="vulkan", device="Vulkan0", on_gpu=True, integrated=True, host_budget=TARGET.host_budget)
    assert decision_text(decision_result(gpu, decided, [], None))[1] == "target  vulkan Vulkan0 (integrated)"
    unnamed = replace(gpu, device="", integrated=False)
    assert decision_text(decision_result(unnamed, decided, [], None))[1] == "target  vulkan GPU"


@pytest.mark.parametrize(
    ("used", "limit", "expected"),
    [
        pytest.param(0, 10, "[..........]   0%", id="empty"),
        pytest.param(5, 10, "[#####.....]  50%", id="half"),
        pytest.param(10, 10, "[##########] 100%", id="full"),
        pytest.param(25, 10, "[##########] OVER", id="over"),
        pytest.param(1, 0, "[##########] OVER", id="no-room"),
        pytest.param(1, -5, "[##########] OVER", id="a-margin-above-the-limit"),
    ],
)
def test_bar(used: int, limit: int, expected: str) -> None:
    assert bar(used, limit, width=10) == expected


def test_text_and_json_come_from_one_result(facts: ModelFacts, kv: KvPlan, decided: Plan) -> None:
    result: dict[str, Any] = plan_result(tool="server", model_path="/m/x.gguf", facts=facts, kv=kv, bundled=False)
    result.update(decision_result(TARGET, decided, ["llama-server"], None))
    text = plan_text(result)
    assert "\ntarget  cpu host CPU" in text and text.endswith("argv: llama-server\n")
    assert plan_text(json.loads(json.dumps(result))) == text
