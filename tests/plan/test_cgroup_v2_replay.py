"""The wide-KV model under a real 256 MiB cgroup v2 group (tests/fixtures/cgroup-v2, measured on the device
tool's machine with the pinned llama-server): planned here under the headroom recorded there, the plan is the
one that ran, and it is within 5% of the largest context that served a request filling it."""

from __future__ import annotations

import json
import re

import pytest

from safe_llama.cmdline.memory_flags import Layout
from safe_llama.device.host_budget import HostLimit
from safe_llama.device.limits import Sourced
from safe_llama.model.facts import ModelFacts
from safe_llama.model.header_facts import load_model_facts
from safe_llama.model.kv import KvRequest
from safe_llama.paths import packaged_configs
from safe_llama.plan.planner import Plan, plan
from safe_llama.plan.policy import load_policy
from safe_llama.plan.target import Target
from tests import ROOT
from tests.tiny_gguf import write_wide_kv_gguf

FIXTURES = ROOT / "tests" / "fixtures" / "cgroup-v2"
MIB = 1 << 20


@pytest.fixture(scope="module")
def wide(tmp_path_factory: pytest.TempPathFactory) -> ModelFacts:
    path = write_wide_kv_gguf(tmp_path_factory.mktemp("m"))
    return load_model_facts(path)


def _replan(wide: ModelFacts, name: str, n_parallel: int | None) -> tuple[Plan, dict[str, object]]:
    recorded = json.loads((FIXTURES / f"plan-{name}.json").read_text())
    budget = recorded["target"]["host_budget"]
    assert budget["detail"].startswith("cgroup v2 headroom")
    limit = HostLimit("cgroup", Sourced(int(budget["bytes"]), "probed", str(budget["detail"])))
    target = Target(backend="cpu", host_budget=limit.budget, host_limits=(limit,))
    policy = load_policy(packaged_configs() / "planner.toml")
    request = KvRequest(tool="server", n_parallel=n_parallel)
    return plan(wide, request, target, policy, layout=Layout(cache_ram_mib=8192, ctx_checkpoints=32)), recorded


def _table(name: str) -> list[list[str]]:
    lines = (FIXTURES / name).read_text().splitlines()
    return [[cell.strip() for cell in line.strip("|").split("|")] for line in lines if line.startswith("| ")]


def test_the_plan_serves_a_full_context_and_is_within_5_percent_of_the_largest_that_does(wide: ModelFacts) -> None:
    decided, recorded = _replan(wide, "fill", None)
    argv = recorded["decision"]["argv"]  # type: ignore[index]
    assert decided.argv_changes["--ctx-size"] == argv[argv.index("-c") + 1]
    header, *rows = _table("fill-wide-256.md")
    (row,) = [dict(zip(header, cells, strict=True)) for cells in rows if cells[1] == "wide"]
    chosen = int(row["chosen -c"])
    served = int(re.match(r"\d+", row["largest that serves a full context"]).group())  # type: ignore[union-attr]
    assert chosen == int(str(decided.argv_changes["--ctx-size"])) and row["first start"] == "yes"
    assert chosen <= served  # the chosen context itself served a request that filled it (bisection's floor)
    assert chosen / served >= 0.95


def test_the_soak_answered_every_request_where_bare_llama_server_was_killed(wide: ModelFacts) -> None:
    decided, _ = _replan(wide, "soak", 4)
    header, *rows = _table("soak-wide-256.md")
    by_server = {cells[0]: dict(zip(header, cells, strict=True)) for cells in rows}
    ours = by_server["safe-llama server"]
    bare = by_server[f"bare llama-server -c {decided.argv_changes['--ctx-size']}"]  # the same context
    assert (ours["answered"], ours["failed"], ours["OOM kills"]) == ("200", "0", "0")
    peak = float(ours["peak charge"].removesuffix(" MiB"))
    assert peak * MIB <= 256 * MIB * (1 - 0.02) and ours["under limit less margin"] == "yes"
    assert int(bare["OOM kills"]) >= 1 and int(bare["answered"]) < 200
    # the difference is what the plan set: the prompt cache sized to what the limit leaves
    assert int(str(decided.argv_changes["--cache-ram"])) < 8192
