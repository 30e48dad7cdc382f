"""Tests for safe_llama/diagnosis/own_outcome.py: what safe-llama's own lines say happened to a launch (one of its
exits, or a start its retry recovered), from plain readings, lines and words (no log file, no config file)."""

from __future__ import annotations

from collections.abc import Mapping

from safe_llama.diagnosis.explain_words import Words
from safe_llama.diagnosis.failed_run import FailedRun
from safe_llama.diagnosis.log_reading import LogFacts, LogReading
from safe_llama.diagnosis.own_lines import OwnLine
from safe_llama.diagnosis.own_outcome import failure_what, own_exit, recovered, where_words
from safe_llama.diagnosis.remedies import Remedy
from safe_llama.diagnosis.signatures import Failure

WORDS = Words(
    signatures={"cpu-aligned-malloc": {"what": "{tool} could not get {requested} of {where}"}},
    categories={"alloc": {"what": "an allocation of {requested} in {buffer} failed"}},
    stages={},
    special={},
)
OWN_WORDS: Mapping[str, Mapping[str, str]] = {
    "nothing-fits": {
        "what": "safe-llama did not start {tool}: nothing fits at {ctx}",
        "why": "the smallest plan needs {need}",
        "fix": "give {tool} more memory",
    },
    "said-exit": {"what": "stopped (exit 68) by itself"},
}


def reading(*own: OwnLine, failure: Failure | None = None, backend: str | None = None) -> LogReading:
    return LogReading(
        facts=LogFacts(backend=backend), matches=(), failure=failure, stage=None, abort=None, refused_device=None,
        available_devices=(), error_lines=(), own=own,
    )  # fmt: skip


def run(tool: str = "completion", tool_from: str = "the log's lines") -> FailedRun:
    return FailedRun(
        tool=tool, tool_from=tool_from, args=(), args_from="", env={}, model_path=None, model_from="", n_ctx=None,
        n_ctx_from="",
    )  # fmt: skip


def retry(attempt: str, reason: str | None = None, number: int = 3) -> OwnLine:
    groups = {"attempt": attempt, **({"reason": reason} if reason is not None else {})}
    return OwnLine(f"attempt {attempt} failed", number, "retry", "retry", None, groups)


def ending(pattern: str = "nothing-fits", code: int | None = 67, **groups: str) -> OwnLine:
    return OwnLine("nothing fits: 1.5 GiB needed", 9, pattern, "exit", code, groups)


ALLOC = Failure(kind="alloc", memory=True, signature_id="cpu-aligned-malloc", line="failed to allocate",
                requested_bytes=1 << 30, buffer="CPU")  # fmt: skip


def test_where_words_tell_host_memory_from_a_device_limit() -> None:
    assert where_words(Failure("alloc", True, buffer="CPU"), "cpu").startswith("host memory (RAM")
    assert where_words(Failure("alloc", True), None).startswith("host memory")
    assert where_words(Failure("alloc", True, buffer="CPU", limit_bytes=4096), "openvino") == "the device"
    assert where_words(Failure("alloc", True, buffer="CUDA0"), "cuda") == "CUDA0's memory"
    assert where_words(Failure("alloc", True), "cuda") == "the device's memory"


def test_failure_what_fills_the_signatures_words_over_its_categorys() -> None:
    said = failure_what(ALLOC, WORDS, "cpu", "llama-completion")
    assert said == "llama-completion could not get 1,073,741,824 bytes (1.00 GiB) of host memory (RAM, a cgroup " \
        "memory limit, or ulimit -v)"  # fmt: skip
    unsigned = Failure(kind="alloc", memory=True, buffer="Vulkan0")
    assert failure_what(unsigned, WORDS, "vulkan", "llama-server") == (
        "an allocation of an unknown amount in Vulkan0 failed"
    )
    killed = Failure(kind="oom_killed", memory=True)  # read as an allocation failure
    assert failure_what(killed, WORDS, None, "x") == "an allocation of an unknown amount in device failed"
    assert failure_what(Failure(kind="not_memory", memory=False), WORDS, None, "x") == "it stopped"


def test_an_exit_is_explained_in_its_own_words_with_its_fix() -> None:
    line = ending(ctx="4096", need="1.5 GiB")
    out = own_exit(reading(line), line, run(), WORDS, OWN_WORDS)
    assert out.status == "explained" and out.exit == 67 and out.memory
    assert out.what == "safe-llama did not start llama-completion: nothing fits at 4096 (exit 67)"
    assert out.why == ("the smallest plan needs 1.5 GiB",)
    assert out.remedies == (Remedy("fix", "give llama-completion more memory", "", None),)
    assert out.line == "safe-llama: nothing fits: 1.5 GiB needed" and out.notes == ()


def test_an_exit_names_llama_cpp_when_the_log_does_not_name_the_tool() -> None:
    line = ending(ctx="4096", need="1 GiB")
    out = own_exit(reading(line), line, run(tool="server", tool_from="not in the log: llama-server assumed"), WORDS,
                   OWN_WORDS)  # fmt: skip
    assert out.what.startswith("safe-llama did not start llama.cpp:")
    assert out.remedies[0].summary == "give llama.cpp more memory"


def test_llama_cpps_failure_comes_second_and_the_retries_third() -> None:
    line = ending(ctx="4096", need="1 GiB")
    seen = reading(retry("1"), retry("2"), line, failure=ALLOC, backend="cpu")
    out = own_exit(seen, line, run(), WORDS, OWN_WORDS)
    assert len(out.why) == 3 and out.why[0] == "the smallest plan needs 1 GiB"
    assert out.why[1].startswith("the first failed start (llama.cpp's line): llama-completion could not get 1,073")
    assert out.why[2] == "retried after attempt(s) 1, 2, each time with a smaller plan"
    not_memory = reading(line, failure=Failure(kind="not_memory", memory=False))
    assert len(own_exit(not_memory, line, run(), WORDS, OWN_WORDS).why) == 1  # a failure not of memory: not named


def test_an_exit_without_words_or_a_memory_code() -> None:
    line = OwnLine("no llama-server found", 4, "no-binary", "exit", 127, {})
    out = own_exit(reading(line), line, run(), WORDS, OWN_WORDS)
    assert out.what == "safe-llama stopped (exit 127)" and out.why == () and out.remedies == ()
    assert not out.memory and out.exit == 127
    said = ending("said-exit", 68)
    assert own_exit(reading(said), said, run(), WORDS, OWN_WORDS).what == "stopped (exit 68) by itself"  # not twice


def test_a_retried_start_is_recovered_at_the_attempt_after_the_last_retry() -> None:
    seen = reading(retry("1", "the KV cache did not fit"), retry("2"), failure=ALLOC, backend="cpu")
    out = recovered(seen, run(), WORDS)
    assert out.status == "recovered" and out.exit is None and out.remedies == () and out.memory
    assert out.what == "llama-completion failed to start, and safe-llama's retry started it (attempt 3)"
    assert out.why[0].startswith("the first start failed: llama-completion could not get 1,073,741,824 bytes")
    assert out.why[1:] == (
        "attempt 1 failed, then retried: the KV cache did not fit",
        "attempt 2 failed, then retried: attempt 2 failed",  # no reason group: the line itself
    )
    assert out.line == "failed to allocate" and "safe-llama forget" in out.notes[0]


def test_a_recovered_start_without_a_failure_line() -> None:
    out = recovered(reading(retry("1")), run(tool="server"), WORDS)
    assert out.what.endswith("(attempt 2)") and out.what.startswith("llama-server failed")
    assert out.why == ("attempt 1 failed, then retried: attempt 1 failed",)
    assert out.line is None and not out.memory
