"""plan.weights_off: weights leave a GPU that cannot hold them, MoE experts first (-ncmoe, the fewest layers'
experts that make it fit), then whole layers (-ngl, the most that stay), and -ngl in llama.cpp's count."""

from __future__ import annotations

from dataclasses import replace

import pytest

from safe_llama.cmdline.memory_flags import Layout, LlamaSettings, Override, argv_changes
from safe_llama.device.limits import Sourced
from safe_llama.model.facts import ModelFacts
from safe_llama.model.header_facts import load_model_facts
from safe_llama.model.kv import KvRequest
from safe_llama.paths import packaged_configs
from safe_llama.plan.memory import allocations
from safe_llama.plan.policy import Policy, load_policy
from safe_llama.plan.target import Target
from safe_llama.plan.weights_off import layers_words, weights_off
from tests.tiny_gguf import write_tiny_gguf

SETTINGS = LlamaSettings(kv=KvRequest(tool="completion", n_ctx=4096))


@pytest.fixture(scope="module")
def policy() -> Policy:
    return load_policy(packaged_configs() / "planner.toml")


@pytest.fixture(scope="module")
def moe(tmp_path_factory: pytest.TempPathFactory) -> ModelFacts:
    """4 layers of 8 f16 experts of n_ff 1024 (3 MiB of experts a layer) on an embedding of 64."""
    path = tmp_path_factory.mktemp("moe") / "moe.gguf"
    return load_model_facts(write_tiny_gguf(path, n_layer=4, n_ff=1024, n_expert=8, expert_zeros=True))


@pytest.fixture(scope="module")
def dense(tmp_path_factory: pytest.TempPathFactory) -> ModelFacts:
    path = tmp_path_factory.mktemp("dense") / "dense.gguf"
    return load_model_facts(write_tiny_gguf(path, n_layer=4, n_ff=4096))


def _gpu(memory: int) -> Target:
    """A GPU of exactly `memory` bytes, planned against all of it (margin_scale 0)."""
    return Target(
        backend="cuda",
        device="CUDA0",
        on_gpu=True,
        device_memory=Sourced(memory, "declared", "test"),
        host_budget=Sourced(64 << 30, "declared", "test"),
        margin_scale=0.0,
    )


def _on_gpu(facts: ModelFacts, settings: LlamaSettings, policy: Policy) -> int:
    """The device total at these settings (on a GPU large enough for anything)."""
    (device,) = (a for a in allocations(facts, settings, _gpu(1 << 40), policy) if a.place == "CUDA0")
    return device.bytes


def _ncmoe(settings: LlamaSettings, n: int) -> LlamaSettings:
    return replace(settings, layout=replace(settings.layout, n_cpu_moe=n))


@pytest.mark.parametrize(
    ("n", "expected"),
    [
        pytest.param(0, "no layer", id="none"),
        pytest.param(-1, "no layer", id="negative"),
        pytest.param(1, "0 of 32 layers and the output layer", id="output-layer-first"),
        pytest.param(20, "19 of 32 layers and the output layer", id="some"),
        pytest.param(32, "31 of 32 layers and the output layer", id="n_layer-leaves-one"),
        pytest.param(33, "all 32 layers and the output layer", id="all"),
        pytest.param(99, "all 32 layers and the output layer", id="model-card-99"),
    ],
)
def test_layers_words(n: int, expected: str) -> None:
    assert layers_words(n, 32) == expected


def test_it_fits_as_asked_and_says_every_layer_explicitly(moe: ModelFacts, policy: Policy) -> None:
    settings, decided, moved = weights_off(moe, SETTINGS, _gpu(1 << 30), policy)
    assert argv_changes(settings, decided) == {"--gpu-layers": "5"} and moved == ""
    assert settings.n_gpu_layers == 5 and settings.layout.rules == ()
    kept = replace(SETTINGS, n_gpu_layers=3)
    assert weights_off(moe, kept, _gpu(1 << 30), policy) == (kept, (), "")  # the user's -ngl, when it fits


@pytest.mark.parametrize("fewest", [1, 2, 3, 4])
def test_the_fewest_layers_experts_that_make_it_fit(moe: ModelFacts, policy: Policy, fewest: int) -> None:
    sizes = [_on_gpu(moe, _ncmoe(SETTINGS, n), policy) for n in range(5)]
    assert sizes == sorted(sizes, reverse=True) and len(set(sizes)) == 5  # each layer's experts weigh
    settings, decided, moved = weights_off(moe, SETTINGS, _gpu(sizes[fewest]), policy)
    # every layer stays, said explicitly
    assert argv_changes(settings, decided) == {"--n-cpu-moe": str(fewest), "--gpu-layers": "5"}
    assert moved == f"-ncmoe {fewest}: the experts of {fewest} of 4 layers in host memory"
    assert len(settings.layout.rules) == fewest and settings.layout.rules[-1].buffer_type == "CPU"
    assert all(rule.pattern.startswith(rf"blk\.{il}\.") for il, rule in enumerate(settings.layout.rules))
    assert settings.n_gpu_layers == 5  # layers move only once every expert is off


def test_the_users_tensor_rules_come_first(moe: ModelFacts, policy: Policy) -> None:
    mine = Override("token_embd", "CPU")
    asked = replace(SETTINGS, layout=Layout(overrides=(mine,)))
    budget = _on_gpu(moe, _ncmoe(asked, 2), policy)
    settings, decided, _ = weights_off(moe, asked, _gpu(budget), policy)
    assert settings.layout.rules[0] == mine and len(settings.layout.rules) == 3
    assert argv_changes(settings, decided) == {"--n-cpu-moe": "2", "--gpu-layers": "5"}


def test_experts_before_layers_then_the_most_layers_that_stay(moe: ModelFacts, policy: Policy) -> None:
    all_off = _ncmoe(SETTINGS, 4)
    sizes = [_on_gpu(moe, replace(all_off, n_gpu_layers=n), policy) for n in range(6)]
    assert sizes == sorted(sizes)
    settings, decided, moved = weights_off(moe, SETTINGS, _gpu(sizes[3]), policy)
    assert argv_changes(settings, decided) == {"--n-cpu-moe": "4", "--gpu-layers": "3"}
    assert moved == (
        "-ncmoe 4: the experts of 4 of 4 layers in host memory"
        " and -ngl 3, 2 of 4 layers and the output layer on the GPU"
    )
    assert settings.n_gpu_layers == 3 and len(settings.layout.rules) == 4


def test_a_dense_model_moves_layers_only(dense: ModelFacts, policy: Policy) -> None:
    sizes = [_on_gpu(dense, replace(SETTINGS, n_gpu_layers=n), policy) for n in range(6)]
    settings, decided, moved = weights_off(dense, SETTINGS, _gpu(sizes[2] + (sizes[3] - sizes[2]) // 2), policy)
    assert (
        argv_changes(settings, decided) == {"--gpu-layers": "2"}
        and moved == "-ngl 2, 1 of 4 layers and the output layer on the GPU"
    )
    assert settings.layout.rules == ()


def test_nothing_on_the_gpu_when_no_layer_fits(dense: ModelFacts, policy: Policy) -> None:
    settings, decided, moved = weights_off(dense, SETTINGS, _gpu(1 << 20), policy)
    assert settings.n_gpu_layers == 0 and argv_changes(settings, decided) == {"--gpu-layers": "0"}
    assert moved == "-ngl 0, no layer on the GPU"


def test_a_users_ngl_is_lowered_from_where_it_was(dense: ModelFacts, policy: Policy) -> None:
    asked = replace(SETTINGS, n_gpu_layers=99)  # "as many as fit": all 5 slots
    sizes = [_on_gpu(dense, replace(SETTINGS, n_gpu_layers=n), policy) for n in range(6)]
    settings, decided, _ = weights_off(dense, asked, _gpu(sizes[4]), policy)
    assert settings.n_gpu_layers == 4 and argv_changes(settings, decided) == {"--gpu-layers": "4"}
