"""Tests for safe_llama/commands/plan.py: what `safe-llama plan` prints (text, --json's shape) and returns for a
tiny model without a llama.cpp binary (a prefix and PATH without one: the declared host budget plans alone), a
model not downloaded yet, nothing that fits, an unusable cache, and how run_plan resolves its options. One test,
marked slow, plans the bundled chat with the pinned CPU build."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest

from safe_llama import state
from safe_llama.cmdline.model_source import ModelSource
from safe_llama.commands import plan as plan_module
from safe_llama.commands.plan import not_on_disk_result, plan_command, run_plan
from safe_llama.device.limits import DeclaredLimits
from safe_llama.errors import ExitStatus, SafeLlamaError
from safe_llama.pipeline.prepare import PlanOptions
from tests.tiny_gguf import write_tiny_gguf

GIB = 1 << 30
HOST_4G = PlanOptions(declared=DeclaredLimits(host_memory_bytes=4 * GIB))
KEYS = ["tool", "model", "kv", "notes", "target", "fits", "decision", "allocations", "ctx_by_type", "memory"]


@pytest.fixture
def env(tmp_path: Path) -> dict[str, str]:
    """A private home, cache and config, and no llama.cpp anywhere (PATH has none, the prefix is empty)."""
    return {
        "PATH": "/usr/bin:/bin", "HOME": str(tmp_path / "home"), "XDG_CACHE_HOME": str(tmp_path / "cache"),
        "XDG_CONFIG_HOME": str(tmp_path / "config"), "SAFE_LLAMA_PREFIX": str(tmp_path / "prefix"),
    }  # fmt: skip


@pytest.fixture
def model(tmp_path: Path) -> Path:
    return write_tiny_gguf(tmp_path / "tiny.gguf", n_ctx_train=2048)


def planned(
    capsys: pytest.CaptureFixture[str], env: dict[str, str], args: list[str], *, json_out: bool = True,
    options: PlanOptions = HOST_4G, tool: str = "server",
) -> tuple[int, Any, str]:  # fmt: skip
    code = plan_command(tool=tool, args=args, json_out=json_out, options=options, env=env)
    out, err = capsys.readouterr()
    return code, json.loads(out) if json_out else out, err


def test_the_json_result(capsys: pytest.CaptureFixture[str], env: dict[str, str], model: Path) -> None:
    code, result, err = planned(capsys, env, ["-m", str(model), "-c", "8192"])
    assert (code, err) == (0, "") and list(result) == KEYS
    assert result["tool"] == "server" and result["fits"] is True
    assert result["model"]["path"] == str(model) and not result["model"]["bundled"] and result["model"]["downloaded"]
    assert result["model"]["source"] == {"kind": "model", "spec": str(model), "path": str(model), "where": "-m",
                                         "mmproj": None}  # fmt: skip
    # the declared 4 GiB is the server's for good: its prompt cache is sized into what the plan leaves of it
    argv = result["decision"]["argv"]
    assert argv[:6] == ["-m", str(model), "-c", "8192", "-fit", "off"] and argv[6] == "-cram"
    assert 0 < int(argv[7]) < 8192 and len(argv) == 8
    assert any("what the declared host memory leaves" in reason for reason in result["decision"]["reasons"])
    assert result["target"]["host_budget"] == {"bytes": 4 * GIB, "source": "declared", "detail": "--host-memory"}
    assert result["kv"]["n_ctx"] == 8192 and result["kv"]["total_bytes"] == 8192 * 256
    assert list(result["memory"]) == ["host"] and result["memory"]["host"]["kv"] == 8192 * 256
    # the context note comes after the render's own notes
    assert result["notes"][-1].startswith("context 8192 per sequence is above the model's trained context 2048")


def test_the_text_result(capsys: pytest.CaptureFixture[str], env: dict[str, str], model: Path) -> None:
    code, text, err = planned(capsys, env, ["-m", str(model), "-c", "1024"], json_out=False)
    assert (code, err) == (0, "")
    lines = text.splitlines()
    assert lines[0] == f"model   {model}" and lines[2].startswith("context n_ctx 1024 (1024 per sequence)")
    assert lines[-1].startswith(f"argv: -m {model} -c 1024 -fit off -cram ")  # the cache sized to --host-memory
    assert not any("per sequence is above" in line for line in lines)  # 1024 is within the trained 2048


def test_nothing_fits_prints_the_result_and_exits_67(
    capsys: pytest.CaptureFixture[str], env: dict[str, str], model: Path
) -> None:
    tiny = PlanOptions(declared=DeclaredLimits(host_memory_bytes=1 << 20))
    code, result, err = planned(capsys, env, ["-m", str(model)], options=tiny)
    assert code == ExitStatus.NOTHING_FITS and code == 67
    assert err.startswith("safe-llama: nothing fits") and err.count("\n") == 1
    assert result["fits"] is False and (result["decision"], result["allocations"]) == (None, [])
    assert result["error"] == err.rstrip("\n") and list(result["memory"]) == ["host"]
    code, text, err = planned(capsys, env, ["-m", str(model)], options=tiny, json_out=False)
    assert code == 67 and text.startswith(f"model   {model}") and err.startswith("safe-llama: nothing fits")


def test_a_model_not_downloaded_is_not_an_error(capsys: pytest.CaptureFixture[str], env: dict[str, str]) -> None:
    env["MODEL_ENDPOINT"] = "http://127.0.0.1:9"  # the discard port: nothing listens, its header cannot be read
    code, result, err = planned(capsys, env, ["-hf", "org/repo", "--api-key", "sesame"])
    assert (code, err) == (0, "")
    hub = Path(env["XDG_CACHE_HOME"]) / "huggingface" / "hub" / "models--org--repo"
    message = (
        f"org/repo is not downloaded yet (not in the HF cache {hub}) and its header could not be read "
        "(http://127.0.0.1:9/api/models/org/repo/refs: [Errno 111] Connection refused): llama-server downloads "
        "it and fits it itself on this start; the plan is exact from the next start"
    )
    assert result["model"] == {
        "path": None, "bundled": False, "downloaded": False,
        "source": {"kind": "hf", "spec": "org/repo", "path": None, "where": f"not in the HF cache {hub}",
                   "mmproj": None},
    }  # fmt: skip
    assert (result["fits"], result["memory"], result["notes"]) == (None, None, [message])
    assert result["decision"]["reasons"] == [message] and "sesame" not in json.dumps(result)  # the key is masked
    code, text, _ = planned(capsys, env, ["-hf", "org/repo"], json_out=False)
    assert (code, text) == (0, f"model   org/repo (not downloaded yet)\nnote: {message}\n")


def test_not_on_disk_result_masks_secrets_in_the_argv() -> None:
    source = ModelSource("url", "https://example.org/m.gguf", None, "not downloaded")
    result = not_on_disk_result("cli", ["-mu", source.spec, "--api-key", "sesame"], source, "not yet")
    decision = result["decision"]
    assert isinstance(decision, dict) and decision["argv"][:2] == ["-mu", source.spec]
    assert "sesame" not in decision["argv"] and len(decision["argv"]) == 4
    assert result["notes"] == ["not yet"] and result["tool"] == "cli"


def test_an_unusable_cache_is_one_warning(
    capsys: pytest.CaptureFixture[str], env: dict[str, str], model: Path, tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:  # fmt: skip
    monkeypatch.setattr(state, "_writes_off", [])  # what check_cache turns off, for this test only
    (tmp_path / "a-file").write_text("")
    code, result, err = planned(capsys, {**env, "XDG_CACHE_HOME": str(tmp_path / "a-file")}, ["-m", str(model)])
    assert code == 0 and result["fits"] is True
    first = err.splitlines()[0]
    assert first.startswith(f"safe-llama: warning: cache directory {tmp_path / 'a-file' / 'safe-llama'} is not usable")
    assert first.endswith(": nothing is cached")


def test_run_plan_resolves_its_options_as_a_launch_does(
    env: dict[str, str], monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    calls: list[dict[str, Any]] = []

    def plan_command(**call: Any) -> int:
        calls.append(call)
        return 0

    monkeypatch.setattr(plan_module, "plan_command", plan_command)
    variables = {**env, "SAFE_LLAMA_HOST_MEMORY": "4G", "SAFE_LLAMA_LADDER": "ctx", "SAFE_LLAMA_ATTEMPTS": "9"}
    given = {"host_memory": "1G", "json": "1", "kv_split": "1"}
    assert run_plan(tool="completion", args=["-m", "x.gguf"], given=given, env=variables) == 0
    call = calls.pop()
    options = call["options"]
    assert (call["tool"], call["args"], call["json_out"], call["env"]) == ("completion", ["-m", "x.gguf"], True,
                                                                           variables)  # fmt: skip
    assert options.declared.host_memory_bytes == GIB and options.ladder == ("ctx",) and options.kv_split is True
    assert run_plan(tool="server", args=[], given={}, env=variables) == 0
    options = calls.pop()["options"]
    assert options.declared.host_memory_bytes == 4 * GIB and options.kv_split is None
    assert dict(options.declared.origins)["host_memory"] == "SAFE_LLAMA_HOST_MEMORY"  # for the reasons' words
    with pytest.raises(SafeLlamaError) as err:
        run_plan(tool="server", args=[], given={"min_ctx": "lots"}, env=env)
    assert err.value.status == ExitStatus.USAGE and not calls


def test_run_plan_prints_the_plan(capsys: pytest.CaptureFixture[str], env: dict[str, str], model: Path) -> None:
    code = run_plan(tool="server", args=["-m", str(model)], given={"json": "1"}, env={**env, "SAFE_LLAMA_HOST_MEMORY":
                                                                                       "4G"})  # fmt: skip
    result = json.loads(capsys.readouterr().out)
    assert code == 0 and result["target"]["host_budget"]["detail"] == "SAFE_LLAMA_HOST_MEMORY"


@pytest.mark.slow
def test_the_bundled_chat_with_the_pinned_build(
    capsys: pytest.CaptureFixture[str], clean_env: dict[str, str], llama_bin: Path, tmp_path: Path
) -> None:
    env = {**clean_env, "SAFE_LLAMA_BIN_DIR": str(llama_bin), "XDG_CACHE_HOME": str(tmp_path / "cache"),
           "XDG_CONFIG_HOME": str(tmp_path / "config")}  # fmt: skip
    code, result, err = planned(capsys, env, [], tool="cli")
    assert (code, err) == (0, "") and result["model"]["bundled"] and result["model"]["source"] is None
    assert os.path.isfile(result["model"]["path"]) and result["decision"]["argv"][-2:] == [
        "-m",
        result["model"]["path"],
    ]
    assert "the bundled model" in result["notes"][-1] and result["target"]["binary_version"] is not None


@pytest.mark.parametrize(
    ("args", "said"),
    [
        pytest.param(["--bogus-flag"], "error: invalid argument: --bogus-flag", id="unknown option"),
        pytest.param(["-c"], "error: -c: expected a value", id="no value"),
    ],
)
def test_a_command_line_llama_cpp_refuses_is_refused(
    capsys: pytest.CaptureFixture[str], env: dict[str, str], model: Path, args: list[str], said: str
) -> None:
    """As llama.cpp's parser refuses it, before any plan (issue 38: `plan server --bogus-flag` printed a plan,
    rc 0, and the launch then failed)."""
    code = plan_command(tool="server", args=["-m", str(model), *args], json_out=True, options=HOST_4G, env=env)
    out, err = capsys.readouterr()
    assert (code, out) == (ExitStatus.USAGE, "")
    assert err == f"safe-llama: llama-server refuses this command line: {said}\n"


def test_a_number_llama_cpp_reads_otherwise_is_said(
    capsys: pytest.CaptureFixture[str], env: dict[str, str], model: Path
) -> None:
    code, result, _ = planned(capsys, env, ["-m", str(model), "-c", "4k"])
    assert code == 0 and "-c 4k is read by llama.cpp as 4" in result["notes"]


@pytest.mark.parametrize(
    ("given", "variables", "named"),
    [
        pytest.param({}, {"SAFE_LLAMA_BIN_DIR": "{tmp}"}, "SAFE_LLAMA_BIN_DIR", id="the variable"),
        pytest.param({"bin_dir": "{tmp}"}, {}, "--llama-bin", id="the option"),
    ],
)
def test_a_wrong_llama_bin_names_where_it_was_set(
    env: dict[str, str], model: Path, tmp_path: Path, given: dict[str, str], variables: dict[str, str], named: str
) -> None:
    """issue 38: SAFE_LLAMA_BIN_DIR=/tmp was said as `(--llama-bin)`."""
    folder = tmp_path / "empty"
    folder.mkdir()
    fill = {key: value.format(tmp=folder) for key, value in given.items()}
    with pytest.raises(SafeLlamaError) as err:
        run_plan(tool="completion", args=["-m", str(model)], given=fill,
                 env={**env, **{key: value.format(tmp=folder) for key, value in variables.items()}})  # fmt: skip
    assert err.value.message == f"safe-llama: {folder}/llama-completion ({named}): no such file"


def test_a_refused_command_line_does_not_repeat_a_secret(capsys: pytest.CaptureFixture[str]) -> None:
    """llama.cpp reads no --opt=VALUE: its refusal quotes the word, and the secret's value is masked in it."""
    code = plan_command(tool="server", args=["--api-key=SEKRIT1"], json_out=False, options=PlanOptions(), env={})
    err = capsys.readouterr().err
    assert code == 2 and "SEKRIT1" not in err
    assert err == "safe-llama: llama-server refuses this command line: error: invalid argument: --api-key=<redacted>\n"
