"""Each host limit counts what it really limits: free RAM the weights kept on the host, a cgroup only what the
kernel charges and cannot reclaim (not the page cache of mapped weights), RLIMIT_AS every mapping (the whole
file). Pure: plain values, no processes."""

from __future__ import annotations

from dataclasses import replace

import pytest

from safe_llama.cmdline.memory_flags import Layout, LlamaSettings
from safe_llama.device.host_budget import HostLimit, host_budget
from safe_llama.device.limits import Sourced
from safe_llama.device.probe_host import CgroupMemory, HostMemory
from safe_llama.errors import ExitStatus, SafeLlamaError
from safe_llama.model.facts import ModelFacts
from safe_llama.model.gguf_header import GGUFHeader, TensorInfo
from safe_llama.model.header_facts import model_facts
from safe_llama.model.kv import KvRequest
from safe_llama.paths import packaged_configs
from safe_llama.plan.memory import allocations
from safe_llama.plan.planner import plan
from safe_llama.plan.policy import Policy, load_policy
from safe_llama.plan.target import Target

GIB = 1 << 30
MIB = 1 << 20


@pytest.fixture(scope="module")
def policy() -> Policy:
    return load_policy(packaged_configs() / "planner.toml")


def model(layer_bytes: int, n_layer: int = 8, file_extra: int = 16 * MIB, vocab: int = 1000) -> ModelFacts:
    tensors = [TensorInfo(f"blk.{il}.ffn_up.weight", (layer_bytes // 4,), 0, 0, layer_bytes) for il in range(n_layer)]
    tensors.append(TensorInfo("token_embd.weight", (MIB // 4,), 0, 0, MIB))
    meta = {"general.architecture": "llama", "llama.block_count": n_layer, "llama.context_length": 1 << 20,
            "llama.embedding_length": 1024, "llama.attention.head_count": 8, "llama.attention.head_count_kv": 8,
            "llama.feed_forward_length": 4096, "llama.vocab_size": vocab}  # fmt: skip
    weights = n_layer * layer_bytes + MIB
    header = GGUFHeader(path="/m.gguf", metadata=meta, tensors=tuple(tensors), file_size=weights + file_extra)  # type: ignore[arg-type]
    return model_facts(header)


def host_charge(facts: ModelFacts, kind: str, load_mode: str, policy: Policy) -> int:
    target = Target(backend="cpu", host_budget=Sourced(64 * GIB, "declared", "t"),
                    host_limits=(HostLimit(kind, Sourced(64 * GIB, "declared", "t")),))  # fmt: skip
    settings = LlamaSettings(kv=KvRequest(tool="completion", n_ctx=8192), layout=Layout(load_mode=load_mode))
    (host,) = [a for a in allocations(facts, settings, target, policy) if a.name.startswith("host")]
    return host.bytes


@pytest.mark.parametrize(
    ("kind", "load_mode", "counted"),
    [
        pytest.param("ram", "auto", "weights", id="ram-mmap: must stay resident to run"),
        pytest.param("ram", "none", "weights", id="ram-read"),
        pytest.param("cgroup", "auto", "nothing", id="cgroup-mmap: reclaimable page cache"),
        pytest.param("cgroup", "mmap", "nothing", id="cgroup-mmap-explicit"),
        pytest.param("cgroup", "none", "weights", id="cgroup-read: anonymous"),
        pytest.param("cgroup", "mlock", "weights", id="cgroup-mlock: locked"),
        pytest.param("address space", "auto", "file", id="as-mmap: the whole file is mapped"),
        pytest.param("address space", "none", "weights", id="as-read"),
    ],
)
def test_what_each_limit_counts_of_the_weights(kind: str, load_mode: str, counted: str, policy: Policy) -> None:
    small, large = model(MIB), model(101 * MIB)
    grown = host_charge(large, kind, load_mode, policy) - host_charge(small, kind, load_mode, policy)
    expected = {"weights": 800 * MIB, "file": 800 * MIB, "nothing": 0}[counted]
    assert grown == expected
    if counted == "file":  # the file's metadata is mapped too
        baseline = host_charge(small, "address space", "none", policy)
        assert host_charge(small, kind, load_mode, policy) - baseline == 16 * MIB


def test_address_space_counts_the_tokenizer(policy: Policy) -> None:
    few, many = model(MIB, vocab=1000), model(MIB, vocab=101_000)
    in_space = host_charge(many, "address space", "auto", policy) - host_charge(few, "address space", "auto", policy)
    charged = host_charge(many, "cgroup", "auto", policy) - host_charge(few, "cgroup", "auto", policy)
    # both count the tokenizer's tables, each by its own measure; the logits are the same in both
    per_token = policy.address_space_per_vocab_token - policy.process_per_vocab_token
    assert in_space - charged == 100_000 * per_token
    assert policy.address_space_per_vocab_token > policy.process_per_vocab_token > 0


def test_discrete_gpu_model_larger_than_host_ram(policy: Policy) -> None:
    """100 GiB of weights for a 141 GiB GPU with 64 GiB of free RAM: only the layers kept on the host count."""
    facts = model(12800 * MIB)  # 8 layers of 12.5 GiB
    ram = Sourced(64 * GIB, "probed", "psutil: MemAvailable")
    target = Target(backend="cuda", device="CUDA0", on_gpu=True, device_memory=Sourced(141 * GIB, "declared", "t"),
                    host_budget=ram, host_limits=(HostLimit("ram", ram),))  # fmt: skip
    request = KvRequest(tool="server", n_ctx=32768, n_parallel=1)
    p = plan(facts, request, target, policy)
    assert p.fits and "--gpu-layers" not in p.argv_changes
    (host,) = [a for a in p.allocations if a.name.startswith("host")]
    assert host.bytes < 2 * GIB
    with pytest.raises(SafeLlamaError) as err:  # all on the host: 100 GiB of weights do not fit 64 GiB
        plan(facts, request, target, policy, user_ngl=0, ladder=[])
    assert err.value.status == ExitStatus.NOTHING_FITS
    # under RLIMIT_AS the whole mapped file counts, however many layers are offloaded
    limited = replace(target, host_limits=(HostLimit("ram", ram), HostLimit("address space", ram)))
    with pytest.raises(SafeLlamaError):
        plan(facts, request, limited, policy, ladder=[])


def test_every_limit_is_checked_on_its_own(policy: Policy) -> None:
    """A cgroup that excludes the mapped weights and a tighter-looking RLIMIT_AS that counts them: both apply."""
    facts = model(32 * MIB)  # 257 MiB of weights
    cgroup = HostLimit("cgroup", Sourced(GIB, "probed", "cgroup v1 headroom"))
    space = HostLimit("address space", Sourced(GIB, "probed", "RLIMIT_AS"))
    request = KvRequest(tool="completion", n_ctx=1 << 20)
    only_cgroup = plan(facts, request, Target(backend="cpu", host_budget=cgroup.budget, host_limits=(cgroup,)), policy)
    both = plan(facts, request, Target(backend="cpu", host_budget=cgroup.budget, host_limits=(cgroup, space)), policy)
    assert only_cgroup.kv.context.n_ctx > both.kv.context.n_ctx >= 4096
    assert {a.name.split(" (")[0] for a in both.allocations} == {"host cgroup charge", "host address space"}


def _host(cgroup: CgroupMemory | None, rlimit: int | None = None) -> HostMemory:
    return HostMemory(total_bytes=64 * GIB, available_bytes=32 * GIB, cgroup=cgroup, cgroup_note="t", rlimit_as=rlimit)


def _cgroup(**kw: object) -> CgroupMemory:
    base = CgroupMemory(version=2, limit_dir="/c", max_bytes=4 * GIB, current_bytes=GIB, inactive_file_bytes=512 * MIB,
                        current_dir="/c")  # fmt: skip
    return replace(base, **kw)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("cgroup", "rlimit", "kinds", "budget"),
    [
        pytest.param(None, None, ["ram"], 32 * GIB, id="no-limits"),
        pytest.param(_cgroup(), None, ["ram", "cgroup"], 4 * GIB - 512 * MIB, id="memory.max-less-unreclaimable"),
        pytest.param(_cgroup(high_bytes=3 * GIB), None, ["ram", "cgroup"], 3 * GIB - 512 * MIB, id="memory.high"),
        pytest.param(_cgroup(high_bytes=8 * GIB), None, ["ram", "cgroup"], 4 * GIB - 512 * MIB, id="high-above-max"),
        pytest.param(_cgroup(swap_bytes=8 * GIB), None, ["ram", "cgroup"], 4 * GIB - 512 * MIB, id="swap-not-counted"),
        pytest.param(_cgroup(), 2 * GIB, ["ram", "cgroup", "address space"], 2 * GIB, id="rlimit-too"),
    ],
)
def test_host_limits_probed(cgroup: CgroupMemory | None, rlimit: int | None, kinds: list[str], budget: int) -> None:
    result = host_budget(_host(cgroup, rlimit))
    assert [limit.kind for limit in result.limits] == kinds
    assert result.budget_bytes.value == budget
