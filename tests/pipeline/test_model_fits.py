"""Each model's verdict is the launch's plan: its largest context per cache type is capped by the trained context,
and the held-out check against the real llama.cpp here: for 20+ real-shaped models (the bundled model, models of
several shapes written here, test-llama-archs' corpus) under a host budget that cuts each one's context, the
largest context reported starts in the real llama-completion (its n_ctx logged) and the next step above it does
not fit by the plan."""

from __future__ import annotations

import re
import subprocess
from dataclasses import replace
from pathlib import Path

import pytest

from safe_llama.device.limits import Sourced
from safe_llama.model.bundled import bundled_model_path
from safe_llama.model.facts import ModelFacts
from safe_llama.model.header_facts import load_model_facts
from safe_llama.model.kv import ctx_unit
from safe_llama.paths import packaged_configs
from safe_llama.pipeline.model_fits import Place, asked, places, verdict
from safe_llama.pipeline.prepare import PlanOptions
from safe_llama.plan.lessons import Lessons
from safe_llama.plan.policy import Policy, load_policy
from safe_llama.plan.target import Probed, Target, target_policy
from tests.arch_corpus import clean_env, generate_corpus
from tests.tiny_gguf import write_tiny_gguf

GIB = 1 << 30
# the context llama.cpp made (-v: logged during the start, so the lines after it flush it before the exit)
N_CTX = re.compile(r"llama_context: n_ctx += (\d+)")


@pytest.fixture(scope="module")
def policy() -> Policy:
    return load_policy(packaged_configs() / "planner.toml")


def _host(budget: int, policy: Policy) -> Place:
    probed = Probed(backend="cpu", host_budget=Sourced(budget, "declared", "--host-memory"), on_gpu=False)
    return Place("host", "test", Target.of(probed, target_policy(policy, probed), Lessons()))


def test_a_roomy_host_gets_the_trained_context_at_every_type(tmp_path: Path, policy: Policy) -> None:
    facts = load_model_facts(write_tiny_gguf(tmp_path / "m.gguf", head_dim=64, n_ctx_train=8192))
    v = verdict(facts, asked("completion", [], {}), _host(16 * GIB, policy), policy, PlanOptions())
    assert v.plan is not None and dict(v.plan.ctx_by_type) == {"f16": 8192, "q8_0": 8192, "q4_0": 8192}
    assert v.memory(facts, _host(16 * GIB, policy))["host"]["weights"] == facts.total_weight_bytes


def test_nothing_fits_is_a_verdict_not_an_error(tmp_path: Path, policy: Policy) -> None:
    facts = load_model_facts(write_tiny_gguf(tmp_path / "m.gguf", n_ctx_train=8192))
    v = verdict(facts, asked("completion", [], {}), _host(1 << 20, policy), policy, PlanOptions())
    assert v.plan is None and v.error is not None and "fit" in v.error


def _cut_budget(facts: ModelFacts, policy: Policy, ceiling: int) -> int:
    """A host budget at which the plan's f16 context is about half the trained one: the plan's host bytes at half
    the trained context, scaled by the share of a budget the policy lets it use."""
    roomy = 64 * GIB
    half = ceiling // 2
    v = verdict(facts, asked("completion", ["-c", str(half)], {}), _host(roomy, policy), policy, PlanOptions())
    assert v.plan is not None
    host = next(a for a in v.plan.allocations if a.host_kind == "ram")
    return -(-host.bytes * roomy // host.limit)


def _models(tmp: Path, llama_bin: Path) -> list[Path]:
    shapes = [
        dict(arch="llama", n_layer=4, n_head=8, n_head_kv=2, head_dim=64, n_ctx_train=32768),
        dict(arch="llama", n_layer=2, n_head=4, n_head_kv=4, head_dim=32, n_ctx_train=65536),
        dict(arch="qwen2", n_layer=6, n_head=8, n_head_kv=2, head_dim=64, n_ctx_train=32768),
        dict(arch="gemma3", n_layer=6, n_head=4, n_head_kv=1, head_dim=128, n_ctx_train=32768, sliding_window=512),
        dict(arch="deci", n_layer=4, n_head=8, n_head_kv=2, head_dim=64, n_ctx_train=16384,
             head_count_kv_per_layer=[2, 1, 4, 1]),
        dict(arch="llama", n_layer=4, n_head=8, n_head_kv=2, head_dim=64, n_ctx_train=32768, n_expert=8),
        dict(arch="llama", n_layer=8, n_head=16, n_head_kv=8, head_dim=128, n_ctx_train=131072),
    ]  # fmt: skip
    written = [write_tiny_gguf(tmp / f"shape{i}.gguf", **shape) for i, shape in enumerate(shapes)]  # type: ignore[arg-type]
    (tmp / "archs").mkdir()
    corpus = generate_corpus(llama_bin, tmp / "archs")
    wanted = ("llama", "qwen2", "qwen3", "gemma2", "gemma3", "phi3", "mistral3", "granite", "olmo2", "starcoder2",
              "exaone", "cohere2", "falcon", "gpt2")  # fmt: skip
    picked = [p for p in corpus if p.stem.endswith("-dense") and p.stem.removesuffix("-dense") in wanted]
    return [bundled_model_path({}), *written, *picked]


@pytest.mark.slow
def test_the_largest_context_starts_for_real_and_the_next_step_does_not_fit(
    tmp_path: Path, llama_bin: Path, policy: Policy
) -> None:
    models = _models(tmp_path, llama_bin)
    checked = 0
    problems = []
    for model in models:
        facts = load_model_facts(model)
        if facts.is_recurrent or facts.sparse is not None:
            continue
        # test-llama-archs' models are trained on 256 cells: they are asked for more, as -c may
        args = [] if facts.context_length >= 8192 else ["-c", "65536"]
        ceiling = facts.context_length if not args else 65536
        place = _host(_cut_budget(facts, policy, ceiling), policy)
        v = verdict(facts, asked("completion", args, {}), place, policy, PlanOptions())
        assert v.plan is not None, model
        best = v.plan.ctx_by_type["f16"]
        if not 0 < best < ceiling:
            problems.append(f"{model.name}: {best} of {ceiling}")
            continue
        step = ctx_unit(replace(v.plan.settings.kv, n_ctx=best))
        above = verdict(facts, asked("completion", ["-c", str(best + step)], {}), place, policy,
                        PlanOptions(ladder=()))  # fmt: skip
        if above.plan is not None:
            problems.append(f"{model.name}: -c {best + step} fits too")
        run = subprocess.run(
            [str(llama_bin / "llama-completion"), "-m", str(model), "-c", str(best), "-n", "1", "-p", "hi",
             "--no-warmup", "-no-cnv", "-t", "1", "-v"],
            env=clean_env(), capture_output=True, text=True, errors="replace", timeout=120, stdin=subprocess.DEVNULL,
        )  # fmt: skip
        logged = N_CTX.findall(run.stdout + run.stderr)
        if run.returncode != 0 or not logged or int(logged[-1]) != best:
            problems.append(f"{model.name}: -c {best} exit {run.returncode}, n_ctx {logged}")
        checked += 1
    assert not problems, problems
    assert checked >= 20


@pytest.mark.slow
def test_on_lavapipe_the_largest_context_starts_for_real(tmp_path: Path, vulkan_bin: Path, policy: Policy) -> None:
    """The same on the Vulkan build's lavapipe device, probed as a launch probes it (its maxStorageBufferRange, 128
    MiB, caps one layer's K): the f16 context reported for Vulkan0 starts there with every layer on it, and the
    next step above does not fit by the plan."""
    env = {**clean_env(), "GGML_VK_VISIBLE_DEVICES": "0"}
    options = PlanOptions(llama_bin=str(vulkan_bin))
    place = next(p for p in places("completion", [], env, options, policy) if p.name == "Vulkan0")
    shapes = [(16, 256, 131072), (8, 256, 131072), (32, 128, 65536), (8, 128, 1_000_000), (4, 256, 262144)]
    checked = []
    for i, (kv_heads, head_dim, trained) in enumerate(shapes):
        model = write_tiny_gguf(tmp_path / f"wide{i}.gguf", n_layer=2, n_head=kv_heads, n_head_kv=kv_heads,
                                head_dim=head_dim, n_ff=64, n_ctx_train=trained)  # fmt: skip
        facts = load_model_facts(model)
        v = verdict(facts, asked("completion", [], env), place, policy, options)
        assert v.plan is not None
        best = v.plan.ctx_by_type["f16"]
        assert 0 < best < trained, (model.name, best)
        step = ctx_unit(replace(v.plan.settings.kv, n_ctx=best))
        above = verdict(facts, asked("completion", ["-c", str(best + step)], env), place, policy,
                        replace(options, ladder=()))  # fmt: skip
        assert above.plan is None, (model.name, best + step)
        run = subprocess.run(
            [str(vulkan_bin / "llama-completion"), "-m", str(model), "-c", str(best), "-ngl", "99", "-n", "1",
             "-p", "hi", "--no-warmup", "-no-cnv", "-t", "1", "-v"],
            env=env, capture_output=True, text=True, errors="replace", timeout=300, stdin=subprocess.DEVNULL,
        )  # fmt: skip
        logged = N_CTX.findall(run.stdout + run.stderr)
        assert run.returncode == 0 and logged and int(logged[-1]) == best, (model.name, best, run.stderr[-2000:])
        checked.append(best)
    assert len(checked) == len(shapes)
