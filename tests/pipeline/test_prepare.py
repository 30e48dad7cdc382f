"""Tests for safe_llama/pipeline/prepare.py: what each step hands the next (the model's file, the request's layout,
the prepared launch, a plan again with a lesson, the free memory read again, the final argv, the context note).

Tiny models from tests/tiny_gguf.py; no llama.cpp binary (SAFE_LLAMA_BIN_DIR names an empty folder, so the
plan is made from the declared host budget alone), but for the one test marked slow that runs the pinned CPU build.
"""

from __future__ import annotations

import os
import shlex
import subprocess
from dataclasses import replace
from pathlib import Path
from typing import NoReturn

import pytest

from safe_llama.cmdline.llama_args import parse
from safe_llama.cmdline.memory_flags import DEFAULT_CTX_CHECKPOINTS
from safe_llama.cmdline.model_source import ModelSource
from safe_llama.cmdline.request import to_request
from safe_llama.device.limits import DeclaredLimits, Sourced
from safe_llama.errors import ExitStatus, SafeLlamaError
from safe_llama.model.kv import plan_kv
from safe_llama.pipeline import prepare as prepare_module
from safe_llama.pipeline.prepare import (
    PlanOptions,
    Prepared,
    context_note,
    final_argv,
    free_again,
    layout_for,
    model_path_for,
    prepare,
    replan,
)
from safe_llama.plan.lessons import Lessons
from tests.tiny_gguf import write_tiny_gguf

GIB = 1 << 30
MIB = 1 << 20
HOST_4G = PlanOptions(declared=DeclaredLimits(host_memory_bytes=4 * GIB))


@pytest.fixture
def env(tmp_path: Path) -> dict[str, str]:
    """A private home, cache and config; no llama.cpp binary (an explicit folder without one)."""
    return {
        "PATH": "/usr/bin:/bin", "HOME": str(tmp_path / "home"), "XDG_CACHE_HOME": str(tmp_path / "cache"),
        "XDG_CONFIG_HOME": str(tmp_path / "config"), "SAFE_LLAMA_BIN_DIR": str(tmp_path / "no-bin"),
    }  # fmt: skip


@pytest.fixture
def model(tmp_path: Path) -> Path:
    """2 layers, 2 KV heads of 16: 256 bytes of f16 KV a token (16 MiB at -c 65536); trained context 2048."""
    return write_tiny_gguf(tmp_path / "tiny.gguf", n_ctx_train=2048)


def test_the_model_path_is_the_sources_or_the_bundled_model() -> None:
    on_disk = ModelSource("model", "m.gguf", "/models/m.gguf", "-m")
    assert model_path_for(on_disk, {}) == "/models/m.gguf"
    assert model_path_for(None, {"SAFE_LLAMA_PREFIX": "/somewhere"}).startswith("/somewhere/")


def test_the_layout_reads_the_files_the_request_names(tmp_path: Path, model: Path, env: dict[str, str]) -> None:
    projector = tmp_path / "mmproj.gguf"
    projector.write_bytes(b"\0" * 12345)
    args = ["-m", str(model), "--mmproj", str(projector), "--spec-draft-model", str(model), "--spec-draft-ngl", "1"]
    layout, notes = layout_for(to_request(parse("server", args, env)), None, env)
    assert layout.mmproj_bytes == 12345 and notes == ()
    assert layout.ctx_checkpoints == DEFAULT_CTX_CHECKPOINTS and not layout.ctx_checkpoints_set  # a server's default
    assert layout.draft is not None and layout.draft.options.n_gpu_layers == 1
    assert (layout.draft.facts.block_count, layout.draft.facts.context_length) == (2, 2048)
    completion, _ = layout_for(to_request(parse("completion", ["-m", str(model)], env)), None, env)
    assert (completion.ctx_checkpoints, completion.mmproj_bytes, completion.draft) == (0, 0, None)
    given, _ = layout_for(to_request(parse("server", ["--ctx-checkpoints", "3"], env)), None, env)
    assert (given.ctx_checkpoints, given.ctx_checkpoints_set) == (3, True)


def test_a_draft_not_downloaded_is_planned_without(model: Path, env: dict[str, str]) -> None:
    request = to_request(parse("server", ["-m", str(model), "--spec-draft-hf", "org/draft"], env))
    layout, notes = layout_for(request, None, env)
    assert layout.draft is None
    assert notes == ("draft model org/draft is not downloaded yet: planned without it",)


def test_a_projector_beside_an_hf_model_counts(tmp_path: Path, env: dict[str, str]) -> None:
    projector = tmp_path / "beside.gguf"
    projector.write_bytes(b"\0" * 999)
    source = ModelSource("hf", "org/repo", "/x.gguf", "cache", mmproj=str(projector))
    layout, _ = layout_for(to_request(parse("server", ["-hf", "org/repo"], env)), source, env)
    assert layout.mmproj_bytes == 999
    gone = replace(source, mmproj=str(tmp_path / "gone.gguf"))  # a file that went away: nothing, not an error
    assert layout_for(to_request(parse("server", [], env)), gone, env)[0].mmproj_bytes == 0


def test_prepare_hands_on_the_facts_the_target_and_the_plan(model: Path, env: dict[str, str]) -> None:
    prepared = prepare("completion", ["-m", str(model), "-c", "65536"], env, HOST_4G)
    assert prepared.model_path == str(model) and prepared.binary is None and prepared.error is None
    assert prepared.source is not None and prepared.source.kind == "model"
    assert prepared.facts.block_count == 2 and prepared.request.kv.n_ctx == 65536
    assert prepared.target.backend == "cpu" and prepared.target.host_budget == Sourced(4 * GIB, "declared",
                                                                                       "--host-memory")  # fmt: skip
    assert prepared.device is not None and prepared.device.listed is None  # no binary: no llama.cpp listing
    assert prepared.plan is not None and prepared.plan.kv.context.n_ctx == 65536  # 16 MiB of KV fits 4 GiB
    assert final_argv(prepared) == ["-m", str(model), "-c", "65536", "-fit", "off"]


def test_options_reach_the_target(model: Path, env: dict[str, str]) -> None:
    options = replace(HOST_4G, llama_version="0.4.1-dev", kv_split=True)
    target = prepare("completion", ["-m", str(model)], env, options).target
    assert (target.binary_version, target.kv_split) == ("0.4.1-dev", True)
    assert not target.malloc_arena_max_set
    assert prepare(
        "completion", ["-m", str(model)], {**env, "MALLOC_ARENA_MAX": "2"}, options
    ).target.malloc_arena_max_set


def test_a_tight_budget_gives_a_smaller_context_and_none_at_all_an_error(model: Path, env: dict[str, str]) -> None:
    tight = PlanOptions(declared=DeclaredLimits(host_memory_bytes=64 * MIB))
    smaller = prepare("completion", ["-m", str(model), "-c", "65536"], env, tight)
    assert smaller.plan is not None and smaller.error is None
    assert 4096 <= int(smaller.plan.argv_changes["--ctx-size"]) < 65536
    nothing = prepare(
        "completion", ["-m", str(model)], env, PlanOptions(declared=DeclaredLimits(host_memory_bytes=MIB))
    )
    assert nothing.plan is None and nothing.error is not None and nothing.error.status == ExitStatus.NOTHING_FITS
    assert final_argv(nothing) == ["-m", str(model)]  # no plan: the command line as given


def test_an_explicit_binary_that_is_missing_is_an_error(model: Path, env: dict[str, str], tmp_path: Path) -> None:
    with pytest.raises(SafeLlamaError) as err:
        prepare("completion", ["-m", str(model)], env, replace(HOST_4G, llama_bin=str(tmp_path / "nowhere")))
    assert err.value.status == ExitStatus.NOT_FOUND


def test_rpc_without_a_binary_is_a_usage_error(model: Path, env: dict[str, str]) -> None:
    with pytest.raises(SafeLlamaError) as err:
        prepare("server", ["-m", str(model), "--rpc", "10.0.0.2:50052"], env, HOST_4G)
    assert err.value.status == ExitStatus.USAGE
    assert err.value.message == ("safe-llama: --rpc 10.0.0.2:50052: no llama.cpp binary to list the workers' devices")


def test_the_bundled_chat_is_announced_and_named(env: dict[str, str]) -> None:
    prepared = prepare("cli", [], env, HOST_4G)
    assert prepared.source is None and len(prepared.announce) == 1
    argv = final_argv(prepared)
    assert argv[-2:] == ["--model", prepared.model_path] or argv[-2:] == ["-m", prepared.model_path]
    assert "-n" in argv and prepared.announce[0].startswith(shlex.join(argv[: argv.index("-n") + 2]) + ": ")


def test_the_bundled_model_named_by_a_path_gets_the_chat_options(
    tmp_path: Path, env: dict[str, str], bundled_model: Path
) -> None:
    """-m with the bundled model's file under another name (issue 38: it answered forever): the same options
    and line as without -m; a model of its own gets none."""
    renamed = tmp_path / "gemma.gguf"
    renamed.symlink_to(bundled_model)
    named = prepare("cli", ["-m", str(renamed)], env, HOST_4G)
    unnamed = prepare("cli", [], env, HOST_4G)
    assert named.bundled and named.announce == unnamed.announce and len(named.announce) == 1
    assert final_argv(named)[final_argv(named).index("-r") :][:2] == ["-r", "USER:"]
    other = prepare("cli", ["-m", str(write_tiny_gguf(tmp_path / "tiny.gguf"))], env, HOST_4G)
    assert not other.bundled and other.announce == () and "-r" not in final_argv(other)


def test_replan_with_a_lesson_is_smaller_and_reads_nothing_again(
    model: Path, env: dict[str, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    first = prepare("completion", ["-m", str(model), "-c", "65536"], env, HOST_4G)
    assert first.plan is not None

    def no_reading(*args: object, **kwargs: object) -> NoReturn:
        raise AssertionError("replan read the model or the device again")

    model.unlink()
    monkeypatch.setattr(prepare_module, "facts_for", no_reading)
    monkeypatch.setattr("safe_llama.device.probing.probe_devices", no_reading)
    monkeypatch.setattr("safe_llama.device.binaries.find_binary", no_reading)
    cap = first.plan.kv.total_bytes // 4
    again = replan(first, HOST_4G, Lessons(kv_cap=cap), env)
    assert again.plan is not None and again.plan.kv.total_bytes <= cap
    assert again.plan.kv.context.n_ctx < first.plan.kv.context.n_ctx
    assert again.target.kv_cap == cap and first.target.kv_cap is None  # the lesson is in the new target only
    assert (again.facts, again.cmd, again.layout, again.device) == (first.facts, first.cmd, first.layout, first.device)
    unchanged = replan(first, HOST_4G, Lessons(), env)
    assert unchanged.plan is not None and final_argv(unchanged) == final_argv(first)


def test_replan_hands_every_lesson_to_the_target(model: Path, env: dict[str, str]) -> None:
    first = prepare("completion", ["-m", str(model), "-c", "65536"], env, HOST_4G)
    lessons = Lessons(
        learned_max_alloc=64 * MIB, kv_cap=8 * MIB, compute_extra=3 * MIB, margin_scale=0.5, device_cap=GIB
    )
    again = replan(first, HOST_4G, lessons, env)
    assert again.target.lessons == lessons and first.target.lessons == Lessons()
    assert again.target.max_alloc == Sourced(64 * MIB, "learned", "from the device's own error message")


def test_replan_with_compute_missed_plans_a_smaller_context(model: Path, env: dict[str, str]) -> None:
    tight = PlanOptions(declared=DeclaredLimits(host_memory_bytes=64 * MIB))
    first = prepare("completion", ["-m", str(model), "-c", "65536"], env, tight)
    again = replan(first, tight, Lessons(compute_extra=8 * MIB), env)
    assert first.plan is not None and again.plan is not None
    assert again.plan.kv.context.n_ctx < first.plan.kv.context.n_ctx


def test_replan_below_the_floor_is_nothing_fits(model: Path, env: dict[str, str]) -> None:
    first = prepare("completion", ["-m", str(model), "-c", "65536"], env, HOST_4G)
    again = replan(first, replace(HOST_4G, min_ctx=4096), Lessons(kv_cap=1024), env)
    assert again.plan is None and again.error is not None and again.error.status == ExitStatus.NOTHING_FITS


def _on_a_gpu(prepared: Prepared, free: int) -> Prepared:
    assert prepared.device is not None
    target = replace(prepared.target, device="CUDA0", device_free=Sourced(free, "probed", "free (NVML)"))
    return replace(prepared, target=target)


def test_free_again_says_so_when_free_memory_moved(
    model: Path, env: dict[str, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    planned = _on_a_gpu(prepare("completion", ["-m", str(model)], env, HOST_4G), 10 * GIB)
    asked: list[tuple[object, ...]] = []

    def read_again(device: object, binary: object, env: object) -> tuple[Sourced[int], bool]:
        asked.append((device, binary, env))
        return Sourced(8 * GIB, "probed", "listed"), True

    monkeypatch.setattr("safe_llama.device.probing.free_again", read_again)
    after, line = free_again(planned, env)
    assert asked == [(planned.device, planned.binary, env)]
    assert line == "CUDA0: 8.00 GiB free now, 10.00 GiB when planned: planning with it"
    assert after.target.device_free == Sourced(8 * GIB, "probed", "listed") and after.target.device_free_listed
    assert planned.target.device_free is not None and planned.target.device_free.value == 10 * GIB  # not changed


@pytest.mark.parametrize(("now", "said"), [(10 * GIB - 10 * GIB // 100, False), (10 * GIB - 10 * GIB // 100 - 1, True),
                                           (11 * GIB, True)])  # fmt: skip
def test_free_again_is_quiet_within_one_percent(
    model: Path, env: dict[str, str], monkeypatch: pytest.MonkeyPatch, now: int, said: bool
) -> None:
    planned = _on_a_gpu(prepare("completion", ["-m", str(model)], env, HOST_4G), 10 * GIB)
    monkeypatch.setattr("safe_llama.device.probing.free_again", lambda *a: (Sourced(now, "probed", "NVML"), False))
    after, line = free_again(planned, env)
    assert (line is not None) == said
    assert after.target.device_free is not None and after.target.device_free.value == now  # planned with it anyway


def test_free_again_without_a_figure_changes_nothing(
    model: Path, env: dict[str, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    prepared = prepare("completion", ["-m", str(model)], env, HOST_4G)
    monkeypatch.setattr("safe_llama.device.probing.free_again", lambda *a: (Sourced(1, "probed", "x"), False))
    assert free_again(prepared, env) == (prepared, None)  # the CPU: no free figure to read again
    assert free_again(replace(_on_a_gpu(prepared, GIB), device=None), env)[1] is None  # no probed device
    monkeypatch.setattr("safe_llama.device.probing.free_again", lambda *a: None)
    on_gpu = _on_a_gpu(prepared, GIB)
    assert free_again(on_gpu, env) == (on_gpu, None)  # nothing answered
    monkeypatch.setattr("safe_llama.device.probing.free_again", lambda *a: (Sourced(GIB // 2, "probed", "x"), False))
    assert free_again(replace(on_gpu, target=replace(on_gpu.target, device=None)), env)[1] == (
        "the GPU: 512.00 MiB free now, 1.00 GiB when planned: planning with it"
    )


def test_the_context_note_is_for_a_context_above_the_trained_one(model: Path, env: dict[str, str]) -> None:
    prepared = prepare("server", ["-m", str(model)], env, HOST_4G)
    facts = prepared.facts

    def note(tool: str, *args: str) -> str | None:
        return context_note(facts, plan_kv(facts, to_request(parse(tool, list(args), env)).kv), tool)

    assert note("completion", "-c", "2048") is None
    assert note("completion", "-c", "3072") == (
        "context 3072 per sequence is above the model's trained context 2048: llama.cpp warns of a training "
        "context overflow past 2048 tokens; the 1024 extra cells cost about 256.00 KiB of KV"
    )
    server = note("server", "-c", "16384", "-np", "4")  # 4096 a slot
    assert server is not None and server.startswith("context 4096 per sequence is above the model's trained context")
    assert "llama-server caps each slot at 2048 tokens; the 2048 extra cells" in server
    assert note("server", "-c", "8192", "-np", "4") is None  # 2048 a slot


@pytest.mark.slow
def test_prepare_with_the_pinned_build_lists_its_devices(model: Path, env: dict[str, str], llama_bin: Path) -> None:
    prepared = prepare("completion", ["-m", str(model)], {**env, "SAFE_LLAMA_BIN_DIR": str(llama_bin)}, HOST_4G)
    assert prepared.binary == llama_bin / "llama-completion"
    assert prepared.target.backend == "cpu" and prepared.target.binary_version is not None
    found = prepare("completion", ["-m", str(model)], env, HOST_4G, binary=llama_bin / "llama-completion")
    assert found.binary == llama_bin / "llama-completion"  # the caller's binary, not looked up again
    assert os.path.samefile(str(found.binary), str(prepared.binary))


def test_prepare_plans_beside_the_launches_in_the_ledger(model: Path, env: dict[str, str], tmp_path: Path) -> None:
    """A live launch in the ledger (a child of this test stands in for its launcher) that reserved 1 GiB on the
    host and holds none of it yet: the plan's RAM budget is 1 GiB less, said in its detail, and the launch is
    listed; with --share 0.5 the budget is at most half the RAM's total."""
    from safe_llama.device import ledger
    from safe_llama.device.reservations import PLANNED, Launch

    runtime = tmp_path / "run"
    runtime.mkdir(mode=0o700)
    env = env | {"XDG_RUNTIME_DIR": str(runtime)}
    folder = ledger.own_folder(env)
    assert folder is not None
    folder.mkdir(parents=True, mode=0o700)
    other = subprocess.Popen(["sleep", "30"])
    try:
        start = ledger.start_time(other.pid)
        assert start is not None
        entry = Launch(other.pid, start, "server", "profile chat", PLANNED, "", "", 0, GIB, "")
        ledger.Entry(folder, other.pid).write(entry)
        prepared = prepare("server", ["-m", str(model)], env, PlanOptions())
        assert prepared.others.held_lines() == (
            f"host: 1.00 GiB held by safe-llama server pid {other.pid} (profile chat)",
        )
        assert prepared.others.host_ram == GIB  # its launcher has no child: nothing of it is resident yet
        (ram,) = [limit for limit in prepared.target.limits_on_host if limit.kind == "ram"]
        assert "less 1.00 GiB other safe-llama launches reserved and do not hold yet" in ram.budget.detail
        shared = prepare("server", ["-m", str(model)], env, PlanOptions(share=0.5))
        assert shared.target.host_budget.value <= os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE") // 2
        assert "share 0.5 of" in shared.target.host_budget.detail
    finally:
        other.kill()
        other.wait()
