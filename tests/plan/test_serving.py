"""llama-server's prompt cache and context checkpoints under a cgroup limit: the size of one checkpoint, the
values chosen from what the plan leaves, a user's value kept and counted, and the planner's step."""

from __future__ import annotations

from pathlib import Path

import pytest

from safe_llama.cmdline.memory_flags import Layout
from safe_llama.device.host_budget import HostLimit
from safe_llama.device.limits import Sourced
from safe_llama.errors import SafeLlamaError
from safe_llama.model.facts import ModelFacts
from safe_llama.model.header_facts import load_model_facts
from safe_llama.model.kv import KvRequest, plan_kv
from safe_llama.paths import packaged_configs
from safe_llama.plan.memory import memory_by_place
from safe_llama.plan.planner import plan
from safe_llama.plan.policy import Policy, load_policy
from safe_llama.plan.serving import checkpoint_bytes, size_serving
from safe_llama.plan.target import Target
from tests.tiny_gguf import write_tiny_gguf

MIB = 1 << 20


@pytest.fixture(scope="module")
def policy() -> Policy:
    return load_policy(packaged_configs() / "planner.toml")


@pytest.fixture(scope="module")
def wide(tmp_path_factory: pytest.TempPathFactory) -> ModelFacts:
    """16 KiB of f16 KV per cell (2 layers x 4 KV heads of 512), tiny weights: the issue's model."""
    path = write_tiny_gguf(tmp_path_factory.mktemp("m") / "wide.gguf", n_layer=2, n_head=4, n_head_kv=4,
                           head_dim=512, n_embd=64, n_ff=128, n_ctx_train=1 << 20)  # fmt: skip
    return load_model_facts(path)


@pytest.fixture(scope="module")
def swa(tmp_path_factory: pytest.TempPathFactory) -> ModelFacts:
    path = write_tiny_gguf(Path(tmp_path_factory.mktemp("m")) / "swa.gguf", arch="gemma3", n_layer=6, n_head=4,
                           n_head_kv=1, head_dim=256, n_ctx_train=1 << 17, sliding_window=512)  # fmt: skip
    return load_model_facts(path)


def _cgroup(mib: int) -> Target:
    limit = HostLimit("cgroup", Sourced(mib * MIB, "probed", "cgroup v2 headroom"))
    return Target(backend="cpu", host_budget=limit.budget, host_limits=(limit,))


def test_full_attention_makes_no_checkpoints(wide: ModelFacts) -> None:
    kv = plan_kv(wide, KvRequest(tool="server", n_ctx=8192))
    assert checkpoint_bytes(wide, kv) == 0


def test_a_checkpoint_is_the_slots_window(swa: ModelFacts) -> None:
    """The sliding-window layers' cells of one slot: the window and one ubatch, not the whole context."""
    kv = plan_kv(swa, KvRequest(tool="server", n_ctx=32768, n_parallel=4))
    (window,) = [c for c in kv.caches if c.kind == "swa"]
    per_cell = window.total_bytes // (window.cells * window.n_stream)
    assert checkpoint_bytes(swa, kv) == per_cell * (512 + 512)
    assert 0 < checkpoint_bytes(swa, kv) < window.total_bytes


def test_the_cache_is_sized_by_its_charge() -> None:
    chosen = size_serving(100 * MIB, 4, 0, user_cache_ram_mib=None, user_ctx_checkpoints=None,
                          default_cache_ram_mib=8192, default_ctx_checkpoints=32, cache_charge=2.0)  # fmt: skip
    assert chosen.cache_ram_mib == 50


@pytest.mark.parametrize(
    ("leftover", "one", "user_cram", "user_ckpt", "cram", "ckpt"),
    [
        pytest.param(100 * MIB + 5, 0, None, None, 100, None, id="full attention: the cache gets it all"),
        pytest.param(1 << 40, 0, None, None, 8192, None, id="never above llama.cpp's default"),
        pytest.param(MIB - 1, 0, None, None, 0, None, id="less than a MiB: the cache off"),
        pytest.param(-5, 0, None, None, 0, None, id="nothing left"),
        pytest.param(40 * MIB, MIB, None, None, 0, 10, id="checkpoints first: 10 x 4 slots x 1 MiB, no cache"),
        pytest.param(200 * MIB, MIB, None, None, 72, 32, id="32 checkpoints, the rest to the cache"),
        pytest.param(400 * MIB, MIB, None, None, 272, 32, id="checkpoints up to 32"),
        pytest.param(40 * MIB, MIB, 16, None, None, 10, id="the user's -cram kept"),
        pytest.param(40 * MIB, MIB, None, 2, 40, None, id="the user's -ctxcp kept"),
    ],
)
def test_size_serving(
    leftover: int, one: int, user_cram: int | None, user_ckpt: int | None, cram: int | None, ckpt: int | None
) -> None:
    chosen = size_serving(leftover, 4, one, user_cache_ram_mib=user_cram, user_ctx_checkpoints=user_ckpt,
                          default_cache_ram_mib=8192, default_ctx_checkpoints=32)  # fmt: skip
    assert (chosen.cache_ram_mib, chosen.ctx_checkpoints) == (cram, ckpt)


def test_the_plan_sets_both_under_a_cgroup_and_stays_under_it(swa: ModelFacts, policy: Policy) -> None:
    decided = plan(swa, KvRequest(tool="server", n_ctx=8192, n_parallel=4), _cgroup(512), policy,
                   layout=Layout(cache_ram_mib=8192, ctx_checkpoints=32))  # fmt: skip
    changes = decided.argv_changes
    assert int(str(changes["--cache-ram"])) < 8192 and 0 < int(str(changes["--ctx-checkpoints"])) <= 32
    assert any(step.name == "serving" for step in decided.steps)
    (cgroup,) = [a for a in decided.allocations if a.host_kind == "cgroup"]
    assert "prompt cache and checkpoints" in cgroup.name and cgroup.fits
    # what was left went to the cache, to the MiB of cache (charged policy.prompt_cache_charge MiB each)
    assert cgroup.limit - cgroup.bytes < MIB * policy.prompt_cache_charge
    host = memory_by_place(swa, decided.settings, _cgroup(512))["host"]
    assert host["prompt_cache"] == int(str(changes["--cache-ram"])) * MIB


def test_no_cgroup_no_change(wide: ModelFacts, policy: Policy) -> None:
    ram = HostLimit("ram", Sourced(512 * MIB, "probed", "MemAvailable"))
    target = Target(backend="cpu", host_budget=ram.budget, host_limits=(ram,))
    decided = plan(wide, KvRequest(tool="server", n_ctx=8192), target, policy, layout=Layout(cache_ram_mib=8192))
    assert "--cache-ram" not in decided.argv_changes
    completion = plan(wide, KvRequest(tool="completion", n_ctx=8192), _cgroup(512), policy)
    assert "--cache-ram" not in completion.argv_changes


def test_a_users_cache_is_counted_against_the_cgroup(wide: ModelFacts, policy: Policy) -> None:
    """-cram 64 under 256 MiB: the context shrinks to leave it room; -cram 8192 fits nowhere."""
    request = KvRequest(tool="server", n_ctx=1 << 20)
    without = plan(wide, request, _cgroup(256), policy, layout=Layout(cache_ram_mib=8192))
    kept = plan(wide, request, _cgroup(256), policy, layout=Layout(cache_ram_mib=64, cache_ram_set=True))
    assert "--cache-ram" not in kept.argv_changes
    assert without.kv.total_bytes - kept.kv.total_bytes >= 64 * MIB - 16 * 1024 * 256
    with pytest.raises(SafeLlamaError, match="prompt cache"):
        plan(wide, request, _cgroup(256), policy, layout=Layout(cache_ram_mib=8192, cache_ram_set=True))


def _declared(mib: int) -> Target:
    limit = HostLimit("ram", Sourced(mib * MIB, "declared", "--host-memory"))
    return Target(backend="cpu", host_budget=limit.budget, host_limits=(limit,))


def test_a_declared_host_budget_sizes_both_as_a_cgroup_does(swa: ModelFacts, policy: Policy) -> None:
    """--host-memory is the server's for good, as a cgroup's limit: the cache and checkpoints are sized into it
    and counted in its total (free RAM alone sizes neither: test_no_cgroup_no_change)."""
    request = KvRequest(tool="server", n_ctx=8192, n_parallel=4)
    decided = plan(swa, request, _declared(512), policy, layout=Layout(cache_ram_mib=8192, ctx_checkpoints=32))
    changes = decided.argv_changes
    assert int(str(changes["--cache-ram"])) < 8192 and 0 < int(str(changes["--ctx-checkpoints"])) <= 32
    (step,) = [step for step in decided.steps if step.name == "serving"]
    assert "what the declared host memory leaves" in step.reason
    (total,) = [a for a in decided.allocations if a.buffer == "host total"]
    assert "prompt cache and checkpoints" in total.name and total.fits
    assert total.limit - total.bytes < MIB * policy.prompt_cache_charge


def test_a_users_cache_is_counted_against_a_declared_budget(wide: ModelFacts, policy: Policy) -> None:
    request = KvRequest(tool="server", n_ctx=8192)
    with pytest.raises(SafeLlamaError, match="prompt cache"):
        plan(wide, request, _declared(512), policy, layout=Layout(cache_ram_mib=8192, cache_ram_set=True))
    kept = plan(wide, request, _declared(512), policy, layout=Layout(cache_ram_mib=64, cache_ram_set=True))
    assert "--cache-ram" not in kept.argv_changes and kept.fits
