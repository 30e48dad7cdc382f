"""Tests for safe_llama/diagnosis/remedies.py: commands to paste, and the machine a log describes as a planner
target. The remedies planned from a model run through `safe-llama explain` (tests/commands/test_explain.py)."""

from __future__ import annotations

import pytest

from safe_llama.diagnosis.failed_run import failed_run
from safe_llama.diagnosis.log_reading import LogFacts, read_log
from safe_llama.diagnosis.remedies import UNKNOWN_HOST, log_target, ready_command, stage_remedies
from safe_llama.diagnosis.signatures import Failure, load_table
from safe_llama.paths import packaged_configs
from safe_llama.plan.policy import load_policy

TABLE = load_table()
POLICY = load_policy(packaged_configs() / "planner.toml")


def test_ready_command_quotes_and_redacts() -> None:
    run = failed_run(
        read_log("", TABLE).facts, args=("-m", "a b.gguf", "--api-key", "s3cret"), model=None, tool="server"
    )
    command = ready_command(run, {"--ctx-size": "512"}, {"GGML_OPENVINO_STATEFUL_EXECUTION": "1"})
    assert command == ("GGML_OPENVINO_STATEFUL_EXECUTION=1 llama-server -m 'a b.gguf' --api-key '<redacted>' -c 512")


def test_the_logs_machine_is_the_target() -> None:
    """A GPU's limit named by its own error is learned; a quoted `ulimit -v` is the host's budget."""
    facts = LogFacts(
        backend="openvino", on_gpu=True, device="GPU.0", address_space_limit=3 << 30, address_space_from="ulimit -v"
    )
    failure = Failure("alloc", True, requested_bytes=7 << 30, limit_bytes=4 << 30)
    target, note = log_target(facts, failure, POLICY)
    assert (target.backend, target.on_gpu, target.device, target.address_space_budget) == (
        "openvino", True, "GPU.0", True,
    )  # fmt: skip
    assert target.max_alloc is not None and target.max_alloc.value == 4 << 30
    assert target.host_budget.value == 3 << 30
    assert note == "whether that GPU is integrated is not in the log: planned as a discrete one"


def test_a_log_that_names_no_limit_is_planned_without_one() -> None:
    target, note = log_target(LogFacts(), Failure("alloc", True, requested_bytes=1 << 30), POLICY)
    assert (target.backend, target.on_gpu, target.max_alloc, note) == ("cpu", False, None, None)
    assert target.host_budget.value == UNKNOWN_HOST and not target.address_space_budget


@pytest.mark.parametrize(
    ("args", "micro_batch", "remedy_ub"),
    [
        pytest.param((), 512, "256", id="llama.cpp's defaults (-b 2048 -ub 512)"),
        pytest.param(("-ub", "512", "-b", "2048"), 512, "256", id="the defaults given"),
        pytest.param(("-b", "8192", "-ub", "8192"), 8192, "512", id="large: back to the default"),
        pytest.param(("-ub", "1024"), 1024, "512", id="above the default"),
        pytest.param(("-b", "256"), 256, "128", id="-b caps -ub"),
        pytest.param(("-c", "128"), 128, "64", id="the context caps -b"),
        pytest.param(("-ub", "2"), 2, "1", id="down to one token"),
    ],
)
def test_the_batch_remedy_is_smaller_than_the_failed_runs(
    args: tuple[str, ...], micro_batch: int, remedy_ub: str
) -> None:
    run = failed_run(read_log("", TABLE).facts, args=("-m", "m.gguf", *args), model=None, tool="completion")
    (remedy,) = stage_remedies("compute", run)
    assert remedy.argv_changes == {"--ubatch-size": remedy_ub}
    assert int(remedy_ub) < micro_batch
    assert f"{micro_batch} tokens" in remedy.detail
    words = (remedy.command or "").split()
    assert words[words.index("-ub") + 1] == remedy_ub and words.count("-ub") == 1


def test_no_batch_remedy_below_one_token() -> None:
    run = failed_run(read_log("", TABLE).facts, args=("-m", "m.gguf", "-ub", "1"), model=None, tool="completion")
    assert stage_remedies("compute", run) == []
