"""Tests for safe_llama/commands/explain.py: the explanation of a read log (the failure in words, the remedies
chosen), its rendering, and the command.

Logs come from tests/fixtures/logs/ (real output of the pinned llama.cpp, CPU and OpenVINO builds, and the
seed report's text); the slow tests make fresh ones with the real binaries and explain them.
"""

from __future__ import annotations

import io
import json
import os
import shlex
import subprocess
import sys
from collections.abc import Mapping
from pathlib import Path

import pytest

from safe_llama.commands import explain
from safe_llama.commands.explain import Explanation, render_text, run_explain, stage_of, to_json
from safe_llama.diagnosis.explain_words import load_words
from safe_llama.diagnosis.failed_run import failed_run
from safe_llama.diagnosis.log_reading import read_log
from safe_llama.diagnosis.own_lines import load_own_table
from safe_llama.diagnosis.remedies import Remedy
from safe_llama.diagnosis.signatures import load_table
from safe_llama.errors import SafeLlamaError
from safe_llama.paths import packaged_configs
from safe_llama.plan.policy import load_policy
from tests import FIXTURES
from tests.tiny_gguf import LLAMA_3B, write_metadata_gguf

LOGS = FIXTURES / "logs"
TABLE = load_table()
OWN = load_own_table(packaged_configs() / "own-lines.toml")
WORDS = load_words(packaged_configs() / "explain.toml")
POLICY = load_policy(packaged_configs() / "planner.toml")
SEED_MODEL = "/home/lucasso/models/Llama-3.2-3B-Instruct-Q4_K_M.gguf"

# The error text of the seed report (seed/000_af8630c3d7ac02a3.txt, "报错原文"), as a user would paste it:
# no header comment, no context size anywhere.
SEED_TEXT = (LOGS / "openvino-seed.log").read_text().split("\n", 1)[1]


def explained(text: str, *, args: tuple[str, ...] = (), model: str | None = None) -> Explanation:
    """explain's pure path on a log's text: the numbers only (no prepared plan)."""
    reading = read_log(text, TABLE, OWN)
    run = failed_run(reading.facts, args=args, model=model, tool=None)
    return explain.explain(reading, run, WORDS, POLICY, source="test", own_words=explain.own_words(OWN))


def log(name: str) -> str:
    return (LOGS / name).read_text()


def remedy(expl: Explanation, step: str) -> Remedy:
    return next(r for r in expl.remedies if r.step == step)


# ---------------------------------------------------------------------------------------------------
# The seed: stateful execution, -c 37376, a quantized cache
# ---------------------------------------------------------------------------------------------------


def test_seed_names_the_allocation_the_limit_and_the_three_remedies() -> None:
    expl = explained(log("openvino-seed.log"))  # its header comment quotes `llama-completion -c 65536`
    assert expl.status == "explained" and expl.exit_code == 0
    assert "one allocation of 7,516,192,768 bytes" in expl.what
    assert "4,294,959,104 bytes" in expl.what
    assert expl.stage == "kv" and expl.basis == "numbers"
    assert [r.step for r in expl.remedies] == ["stateful", "ctx", "kv-q4", "safe-llama"]
    stateful = remedy(expl, "stateful")
    assert stateful.env == {"GGML_OPENVINO_STATEFUL_EXECUTION": "1"}
    assert stateful.command == f"GGML_OPENVINO_STATEFUL_EXECUTION=1 llama-completion -m {SEED_MODEL} -c 65536"
    assert remedy(expl, "ctx").command == f"llama-completion -m {SEED_MODEL} -c 37376"
    quantized = remedy(expl, "kv-q4")
    assert quantized.command == f"llama-completion -m {SEED_MODEL} -c 65536 -ctk q4_0 -ctv q4_0 -fa on"
    assert any("q8_0 was never verified on OpenVINO" in n for n in quantized.notes)
    assert any("114,688 bytes per token" in w for w in expl.why)


def test_seed_text_without_a_context_gives_the_proportion_honestly() -> None:
    expl = explained(SEED_TEXT)
    ctx = remedy(expl, "ctx")
    assert ctx.command is None
    assert "57.09%" in ctx.summary
    assert any("context the failed run asked for is not in the log" in n for n in expl.notes)
    assert remedy(expl, "kv-q4").command == f"llama-completion -m {SEED_MODEL} -ctk q4_0 -ctv q4_0 -fa on"


def test_seed_text_with_the_context_given() -> None:
    expl = explained(SEED_TEXT, args=("-c", "65536"))
    assert remedy(expl, "ctx").argv_changes == {"--ctx-size": "37376"}


def test_a_host_allocation_failure_without_a_limit_takes_the_retry_step() -> None:
    expl = explained(log("completion-kv-oom.log"), model="/absent.gguf")
    ctx = remedy(expl, "ctx")
    # 3/4 of 6,144,393,216 bytes at 3,072 bytes per token, on the 256 grid
    assert ctx.argv_changes == {"--ctx-size": str(6144393216 * 3 // 4 // 3072 // 256 * 256)}
    assert "3/4 of the allocation that failed" in ctx.detail
    assert [r.step for r in expl.remedies] == ["ctx", "kv-q8", "kv-q4", "safe-llama"]


@pytest.mark.parametrize(
    ("name", "kind", "fix_words"),
    [
        pytest.param("server-bad-argument.log", "not_memory", "--help", id="bad-argument"),
        pytest.param("server-truncated-data.log", "not_memory", "download it again", id="truncated"),
        pytest.param("server-port-in-use.log", "not_memory", "--port", id="port"),
        pytest.param("completion-quantized-v-no-fa.log", "not_memory", "-fa on", id="quantized-v"),
        pytest.param("openvino-device-refused.log", "not_memory", "GGML_OPENVINO_DEVICE", id="ov-device"),
    ],
)
def test_not_memory_failures_get_a_fix_not_a_plan(name: str, kind: str, fix_words: str) -> None:
    expl = explained(log(name))
    assert expl.status == "explained" and expl.kind == kind and not expl.memory
    assert fix_words in expl.remedies[0].summary
    assert all(r.step in ("fix", "device") for r in expl.remedies)


def test_openvino_device_refused_offers_the_devices_it_has() -> None:
    expl = explained(log("openvino-device-refused.log"))
    device = remedy(expl, "device")
    assert device.command == "GGML_OPENVINO_DEVICE=CPU llama-server -m MODEL -c 4096 --port 0"


def test_compute_buffer_failure_points_at_the_batches() -> None:
    expl = explained(log("completion-compute-oom.log"), model="/absent.gguf")
    assert expl.stage == "compute"
    assert remedy(expl, "batch").argv_changes == {"--ubatch-size": "512"}  # the failed run's was -b 8192 -ub 8192


def test_no_failure_and_unrecognised_errors_exit_1() -> None:
    assert explained(log("completion-ready.log")).exit_code == 1
    unknown = explained("0.00.001.000 E something odd happened\n")
    assert (unknown.status, unknown.exit_code, unknown.line) == ("unrecognised", 1, "something odd happened")


def test_the_phase_names_an_allocation_without_a_stage_of_its_own() -> None:
    expl = explained(log("completion-bad-alloc.log"), model="/absent.gguf")  # std::bad_alloc loading the vocabulary
    assert expl.stage == "weights"
    assert [r.step for r in expl.remedies] == ["weights", "safe-llama"]


def test_llama_cli_stdout_points_at_its_stderr() -> None:
    expl = explained(log("cli-kv-oom.stdout.log"))
    assert (expl.status, expl.line) == ("unrecognised", "Error: the server exited before becoming ready")
    assert any("prints the cause on stderr" in n for n in expl.notes)


def test_stage_comes_from_the_words_table() -> None:
    assert stage_of(read_log(log("server-kv-oom.log"), TABLE), WORDS) == "kv"  # cache-buffer line
    assert stage_of(read_log(log("openvino-cpu-kv-oom.log"), TABLE), WORDS) == "context"  # by the log's phase


def test_rendering_text_and_json_from_the_same_value() -> None:
    expl = explained(log("openvino-seed.log"))
    text = render_text(expl)
    assert text.startswith("What   llama-completion failed to start:")
    assert f"$ llama-completion -m {SEED_MODEL} -c 37376" in text
    data = json.loads(to_json(expl))
    assert data["exit_code"] == 0 and data["requested_bytes"] == 7516192768 and data["limit_bytes"] == 4294959104


# ---------------------------------------------------------------------------------------------------
# The command's shell: input, exit codes, the exact plan
# ---------------------------------------------------------------------------------------------------


def test_run_explain_reads_stdin(clean_env: dict[str, str]) -> None:
    out = io.StringIO()
    code = run_explain(file="-", stdin=io.BytesIO(log("completion-ready.log").encode()), env=clean_env, out=out)
    assert code == 1 and out.getvalue().startswith("What   no failure found")


def test_a_model_the_log_names_but_this_machine_lacks(clean_env: dict[str, str]) -> None:
    out = io.StringIO()
    assert run_explain(file=str(LOGS / "openvino-seed.log"), json_out=True, env=clean_env, out=out) == 0
    data = json.loads(out.getvalue())
    assert data["basis"] == "numbers"
    assert any(f"names the model {SEED_MODEL}, which is not on this machine" in n for n in data["notes"])


def test_unreadable_log_is_a_bad_argument_not_a_bad_model(tmp_path: Path, clean_env: dict[str, str]) -> None:
    with pytest.raises(SafeLlamaError) as err:
        run_explain(file=str(tmp_path / "absent.log"), env=clean_env, out=io.StringIO())
    assert int(err.value.status) == 2
    assert err.value.message == f"safe-llama: explain: {tmp_path / 'absent.log'}: No such file or directory"


@pytest.mark.slow
def test_exact_plan_for_the_seed_with_its_model(tmp_path: Path, clean_env: dict[str, str]) -> None:
    """With the model (its metadata suffices), every remedy is planned: the seed's -c 37376 again."""
    model = write_metadata_gguf(tmp_path / "llama-3b.gguf", "llama", LLAMA_3B)
    out = io.StringIO()
    code = run_explain(file=str(LOGS / "openvino-seed.log"), model=str(model), json_out=True, env=clean_env, out=out)
    data = json.loads(out.getvalue())
    assert code == 0 and data["basis"] == "plan"
    steps = {r["step"]: r for r in data["remedies"]}
    assert list(steps) == ["stateful", "ctx", "kv-q4", "safe-llama"]
    assert steps["ctx"]["argv_changes"]["--ctx-size"] == "37376"
    assert steps["stateful"]["env"] == {"GGML_OPENVINO_STATEFUL_EXECUTION": "1"}
    # the tool named so that it runs when pasted: its full path here (or the safe-llama door without a binary)
    tool, _, rest = steps["kv-q4"]["command"].partition(" ")
    assert rest == f"-m {model} -c 65536 -ctk q4_0 -ctv q4_0 -fa on"
    assert tool == "safe-llama-completion" or (tool.endswith("/llama-completion") and os.access(tool, os.X_OK))
    assert any("exactly this model's KV cache" in w and "114,688 bytes per token" in w for w in data["why"])


# ---------------------------------------------------------------------------------------------------
# Fresh logs from the real pinned binaries
# ---------------------------------------------------------------------------------------------------


def _stderr(argv: list[str], env: Mapping[str, str], limit_kib: int | None = None) -> tuple[int, str]:
    command = " ".join(f"'{a}'" for a in argv)
    script = f"ulimit -v {limit_kib}; exec {command}" if limit_kib else f"exec {command}"
    done = subprocess.run(
        ["bash", "-c", script], env=dict(env), capture_output=True, timeout=180, stdin=subprocess.DEVNULL
    )
    return done.returncode, done.stderr.decode(errors="replace")


@pytest.mark.slow
def test_real_cpu_allocation_failure_under_ulimit(
    llama_bin: Path, bundled_model: Path, clean_env: dict[str, str], tmp_path: Path
) -> None:
    argv = [str(llama_bin / "llama-completion"), "-m", str(bundled_model), "-c", "2000000", "-p", "hi", "-n", "1"]
    code, err = _stderr(argv, clean_env, limit_kib=3000000)
    assert code == 1
    (tmp_path / "run.log").write_text(err)
    out = io.StringIO()
    assert run_explain(file=str(tmp_path / "run.log"), json_out=True, env=clean_env, out=out) == 0
    data = json.loads(out.getvalue())
    assert (data["memory"], data["stage"], data["basis"]) == (True, "kv", "plan")
    assert data["requested_bytes"] == 6144393216
    ctx = next(r for r in data["remedies"] if r["step"] == "ctx")
    assert int(ctx["argv_changes"]["--ctx-size"]) < 2000000


@pytest.mark.slow
def test_real_truncated_model(llama_bin: Path, bundled_model: Path, clean_env: dict[str, str], tmp_path: Path) -> None:
    truncated = tmp_path / "truncated.gguf"
    with bundled_model.open("rb") as src, truncated.open("wb") as dst:
        dst.write(src.read(100_000_000))
    code, err = _stderr([str(llama_bin / "llama-completion"), "-m", str(truncated), "-p", "hi", "-n", "1"], clean_env)
    assert code == 1
    expl = explained(err)
    assert (expl.kind, expl.memory, expl.run.model_path) == ("not_memory", False, str(truncated))
    assert "corrupted or incomplete" in expl.what


@pytest.mark.slow
def test_real_bad_argument(llama_bin: Path, clean_env: dict[str, str]) -> None:
    code, err = _stderr([str(llama_bin / "llama-server"), "--bogus"], clean_env)
    assert code == 1
    expl = explained(err)
    assert (expl.signature_id, expl.line) == ("invalid-argument", "error: invalid argument: --bogus")


@pytest.mark.slow
def test_real_openvino_build_refusing_a_gpu(openvino_bin: Path, bundled_model: Path, clean_env: dict[str, str]) -> None:
    env = {**clean_env, "GGML_OPENVINO_DEVICE": "GPU", "GGML_NO_BACKTRACE": "1"}
    code, err = _stderr([str(openvino_bin / "llama-completion"), "-m", str(bundled_model), "-p", "hi"], env)
    assert code == -6  # SIGABRT
    expl = explained(err)
    assert expl.kind == "not_memory" and "refused GGML_OPENVINO_DEVICE=GPU" in expl.what
    assert remedy(expl, "device").env == {"GGML_OPENVINO_DEVICE": "CPU"}


@pytest.mark.slow
def test_the_command_line_end_to_end(clean_env: dict[str, str]) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "safe_llama", "explain", str(LOGS / "openvino-seed.log"), "--json"],
        env=clean_env,
        capture_output=True,
        timeout=60,
    )
    data = json.loads(done.stdout)
    assert data["status"] == "explained" and done.returncode == 0


def test_the_command_line_exit_code_when_nothing_failed(clean_env: dict[str, str]) -> None:
    from safe_llama.entry import run

    assert run(["explain", str(LOGS / "completion-ready.log")]) == 1


def test_explain_probes_nothing_and_sizes_remedies_under_the_logs_limit(
    tmp_path: Path, clean_env: dict[str, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """explain reads the log and the model's GGUF header only: no subprocess (llama.cpp --list-devices), no
    OpenCL or sysfs probe. Each planned remedy states its own size, under the `ulimit -v` the log quotes."""
    import os as os_module

    from safe_llama.device import probe_opencl, probe_sysfs, probing, proc

    def probed(*_: object, **__: object) -> None:
        raise AssertionError("explain probed this machine")

    monkeypatch.setattr(subprocess, "Popen", probed)
    monkeypatch.setattr(os_module, "posix_spawn", probed)
    for module, name in (
        (proc, "run_capture"), (probing, "probe_devices"), (probe_opencl, "probe_opencl_isolated"),
        (probe_sysfs, "probe_sysfs"),
    ):  # fmt: skip
        monkeypatch.setattr(module, name, probed)
    model = write_metadata_gguf(tmp_path / "llama-3b.gguf", "llama", LLAMA_3B)
    out = io.StringIO()
    code = run_explain(file=str(LOGS / "server-kv-oom.log"), model=str(model), json_out=True, env=clean_env, out=out)
    data = json.loads(out.getvalue())
    assert code == 0 and data["basis"] == "plan"
    ctx = next(r for r in data["remedies"] if r["step"] == "ctx")
    cells = int(ctx["argv_changes"]["--ctx-size"])
    assert 0 < cells < 2000128
    # "... 2.85 GiB at -c 23552 is within its 2.85 GiB usable (2.86 GiB declared: ulimit -v 3000000 ..., less ...)"
    assert f"at -c {cells} is within its " in ctx["detail"]
    assert "ulimit -v 3000000" in ctx["detail"] and "215.97 GiB" not in ctx["detail"]
    size = ctx["detail"].split(" GiB at -c")[0].rsplit(" ", 1)[1]
    assert float(size) * 2**30 <= 3000000 * 1024


def test_a_remedys_size_is_its_own_and_under_the_logs_limit(tmp_path: Path, clean_env: dict[str, str]) -> None:
    """The seed with its model: -c 37376's KV is stated (3.99 GiB), not the 7.00 GiB that failed, and it is
    under the 4.00 GiB the log names."""
    model = write_metadata_gguf(tmp_path / "llama-3b.gguf", "llama", LLAMA_3B)
    out = io.StringIO()
    run_explain(file=str(LOGS / "openvino-seed.log"), model=str(model), json_out=True, env=clean_env, out=out)
    data = json.loads(out.getvalue())
    steps = {r["step"]: r for r in data["remedies"]}
    assert steps["ctx"]["detail"] == (
        "KV cache (one allocation) 3.99 GiB at -c 37376 is within the GPU's 4.00 GiB limit per allocation "
        "(learned, less a 4.00 MiB margin)"
    )
    assert data["limit_bytes"] - 4 * 2**20 > 114688 * 37376
    assert steps["kv-q4"]["detail"].startswith("KV cache (one allocation) 1.97 GiB at -c 65536 is within")
    assert "7.00 GiB" not in steps["ctx"]["detail"] + steps["kv-q4"]["detail"]


# ---------------------------------------------------------------------------------------------------
# safe-llama's own failures (real logs of its exits and of a retried start, tests/fixtures/logs/safe-llama-*)
# ---------------------------------------------------------------------------------------------------


def _explain_json(name: str) -> tuple[int, dict[str, object]]:
    out = io.StringIO()
    code = run_explain(file=str(LOGS / name), json_out=True, out=out)
    return code, json.loads(out.getvalue())


@pytest.mark.parametrize(
    ("name", "exit_code", "what", "fix"),
    [
        pytest.param(
            "safe-llama-exit65-missing-model.log", 65, "the model file /root/nonexistent.gguf does not exist",
            "check the path", id="65",
        ),
        pytest.param(
            "safe-llama-exit67-nothing-fits.log", 67, "nothing fits, even at its smallest context", "more memory",
            id="67",
        ),
        pytest.param(
            "safe-llama-exit68-nothing-fits-after-retry.log", 68, "gave up after 1 failed start(s) of llama-completion",
            "more memory", id="68-after-retry",
        ),
        pytest.param(
            "safe-llama-exit68-no-attempts-left.log", 68, "every one of its 1 start(s) of llama-completion failed",
            "--attempts N", id="68-no-attempts-left",
        ),
    ],
)  # fmt: skip
def test_safe_llamas_own_exits_are_explained(name: str, exit_code: int, what: str, fix: str) -> None:
    code, data = _explain_json(name)
    assert (code, data["status"], data["kind"], data["safe_llama_exit"]) == (0, "explained", "safe-llama", exit_code)
    assert what in str(data["what"]) and f"(exit {exit_code})" in str(data["what"])
    remedies = data["remedies"]
    assert isinstance(remedies, list) and fix in remedies[0]["summary"]


def test_an_exit_68_names_llama_cpps_failure_second_and_reads_the_retry_line_as_safe_llamas() -> None:
    reading = read_log(log("safe-llama-exit68-nothing-fits-after-retry.log"), TABLE, OWN)
    # the retry line quotes llama.cpp's ggml_aligned_malloc line: it is safe-llama's, not a second failure
    assert [m.signature_id for m in reading.matches].count("cpu-aligned-malloc") == 1
    assert [o.pattern_id for o in reading.own] == ["retry", "nothing-fits-after-retries"]
    _, data = _explain_json("safe-llama-exit68-nothing-fits-after-retry.log")
    why = data["why"]
    assert isinstance(why, list) and "less 8.00 MiB" in why[0]  # the retry's plan keeps the margin (--no-predict)
    assert "551.28 MiB" in why[1] and "retried after attempt(s) 1" in why[2]


def test_a_missing_model_does_not_assume_a_tool() -> None:
    out = io.StringIO()
    run_explain(file=str(LOGS / "safe-llama-exit65-missing-model.log"), out=out)
    text = out.getvalue()
    assert "assumed" not in text and "no failure found" not in text
    assert text.startswith("What   safe-llama did not start llama-completion: the model file")  # the header's command
    bare = render_text(explained((LOGS / "safe-llama-exit65-missing-model.log").read_text().split("\n", 1)[1]))
    assert bare.startswith("What   safe-llama did not start llama.cpp: the model file") and "assumed" not in bare


def test_a_start_safe_llama_retried_is_recovered() -> None:
    code, data = _explain_json("safe-llama-retried-started.log")
    assert (code, data["status"], data["remedies"]) == (0, "recovered", [])
    assert data["what"] == "llama-completion failed to start, and safe-llama's retry started it (attempt 2)"
    why = data["why"]
    assert isinstance(why, list) and "678,721,536 bytes" in why[0] and "retried: the compute buffers" in why[1]


def test_the_compute_remedy_at_llama_cpps_defaults_halves_the_micro_batch() -> None:
    """The issue's case: a bare llama-completion under ulimit -v 700000 at -b 2048 -ub 512."""
    expl = explained(log("completion-compute-oom-defaults.log"), model="/absent.gguf")
    batch = remedy(expl, "batch")
    assert expl.stage == "compute" and batch.argv_changes == {"--ubatch-size": "256"}
    assert batch.command == "llama-completion -m /absent.gguf -ub 256"


def test_a_build_without_https_is_named_and_so_is_the_tool(clean_env: dict[str, str]) -> None:
    """A launch of `safe-llama completion -mu https://...` on a build without OpenSSL: the signature says so, and
    the tool is llama-completion (safe-llama's line names the binary that downloads), not llama-server."""
    out = io.StringIO()
    code = run_explain(file=str(LOGS / "completion-https-unsupported.log"), env=clean_env, out=out)
    text = out.getvalue()
    assert code == 0, text
    assert text.startswith("What   llama-completion failed to start: this llama.cpp build cannot download models")
    assert "Log    tool llama-completion (the log's lines)" in text
    assert "apt-get install libssl-dev, then scripts/build-llama.sh" in text


def test_an_hf_model_llama_cpp_found_no_file_for_points_at_safe_llamas_line(clean_env: dict[str, str]) -> None:
    """The same build with -hf: llama.cpp says only `--model is required` (it could not list the repository)."""
    out = io.StringIO()
    code = run_explain(file=str(LOGS / "completion-hf-no-model.log"), env=clean_env, out=out)
    text = out.getvalue()
    assert code == 0, text
    assert text.startswith("What   llama-completion failed to start: llama.cpp had no model to load")
    assert "safe-llama's line before it says why the model's header could not be read" in text


def _under_ulimit_v(kib: int) -> None:
    import resource

    resource.setrlimit(resource.RLIMIT_AS, (kib * 1024, kib * 1024))


@pytest.mark.slow
@pytest.mark.parametrize("kib", [pytest.param(400000, id="kv failed"), pytest.param(800000, id="compute failed")])
def test_remedies_work_when_copied(
    tmp_path: Path, llama_bin: Path, bundled_model: Path, clean_env: dict[str, str], kib: int
) -> None:
    """issue 38's case: bare llama-completion -c 100000 under ulimit -v 400000 (the KV cache's allocation
    fails; at 800000 the compute buffers'), a log that names no limit. explain under the same limit plans
    against this machine's (said), offers no command (nothing fits: at least 1 GiB of address space,
    llama-completion's 262,144-token logits included) and says how much would; without the limit, each
    command names the binary by its full path and the first one, pasted, starts."""
    log = tmp_path / "c100k.log"
    argv = [str(llama_bin / "llama-completion"), "-m", str(bundled_model), "-c", "100000", "-p", "Hi", "-n", "1",
            "-no-cnv"]  # fmt: skip
    with log.open("wb") as out:
        failed = subprocess.run(argv, stdout=out, stderr=subprocess.STDOUT, env=clean_env, timeout=120,
                                preexec_fn=lambda: _under_ulimit_v(kib), check=False)  # fmt: skip
    assert failed.returncode == 1
    env = {**clean_env, "SAFE_LLAMA_BIN_DIR": str(llama_bin), "XDG_CACHE_HOME": str(tmp_path / "cache")}
    explain_argv = [sys.executable, "-m", "safe_llama", "explain", str(log)]
    limited = subprocess.run(explain_argv, capture_output=True, text=True, env=env, timeout=120,
                             preexec_fn=lambda: _under_ulimit_v(kib), check=False)  # fmt: skip
    assert "$ " not in limited.stdout
    assert "note: the log names no memory limit: planned against this machine's, " in limited.stdout
    assert "(RLIMIT_AS (ulimit -v) of the whole llama.cpp process)" in limited.stdout
    assert "note: nothing fits: even at -c 4096" in limited.stdout and "GiB at -c 4096 is above its" in limited.stdout
    free = subprocess.run(explain_argv, capture_output=True, text=True, env=env, timeout=120, check=False)
    commands = [line.strip()[2:] for line in free.stdout.splitlines() if line.strip().startswith("$ ")]
    assert commands and all(c.startswith((f"{llama_bin}/llama-completion ", "safe-llama ")) for c in commands)
    pasted = subprocess.run(
        [*shlex.split(commands[0]), "-p", "Hi", "-n", "1", "-no-cnv"], capture_output=True, env=clean_env,
        timeout=120, check=False,
    )  # fmt: skip
    assert pasted.returncode == 0, pasted.stderr[-400:]
