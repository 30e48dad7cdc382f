"""Real llama.cpp command lines (tests/corpus/command_lines.toml) through `safe-llama plan --json`: the
model file the pinned source loads, where each part of the memory goes, the argv launched; confirmed
against the real CPU build's log lines where this machine can run the line."""

from __future__ import annotations

import json
import os
import re
import subprocess
import tomllib
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from safe_llama.cmdline.llama_args import parse
from safe_llama.commands.plan import plan_command
from safe_llama.pipeline.options import plan_options
from tests import TESTS
from tests.tiny_gguf import write_tiny_gguf

CORPUS = TESTS / "corpus" / "command_lines.toml"
CASES: list[dict[str, Any]] = tomllib.loads(CORPUS.read_text())["case"]
COMMIT = "c" * 40
EXPERTS = re.compile(r"blk\.(\d+)\.ffn_(up|down|gate)_exps")

HF: dict[str, list[str]] = {
    "ggml-org/gemma-3-4b-it-GGUF": ["gemma-3-4b-it-Q4_K_M.gguf", "gemma-3-4b-it-Q8_0.gguf", "gemma-3-4b-it-f16.gguf",
                                    "mmproj-model-f16.gguf"],
    "ggml-org/Qwen3-8B-GGUF": ["Qwen3-8B-Q4_K_M.gguf", "Qwen3-8B-Q8_0.gguf"],
    "ggml-org/Qwen3-8B-Base-GGUF": ["Qwen3-8B-Base-Q4_K_M.gguf", "Qwen3-8B-Base-Q8_0.gguf"],
    "ggml-org/Qwen3-0.6B-Base-GGUF": ["Qwen3-0.6B-Base-Q8_0.gguf"],
    "bartowski/Qwen2.5-7B-Instruct-GGUF": ["Qwen2.5-7B-Instruct-Q4_K_M.gguf", "Qwen2.5-7B-Instruct-Q6_K_L.gguf",
                                           "Qwen2.5-7B-Instruct-Q8_0.gguf"],
    "bartowski/firefunction-v2-GGUF": ["firefunction-v2-IQ1_M.gguf", "firefunction-v2-Q4_K_M.gguf"],
    "ggml-org/gpt-oss-20b-GGUF": ["gpt-oss-20b-mxfp4.gguf"],
    "unsloth/Qwen3-30B-A3B-GGUF": ["Qwen3-30B-A3B-Q4_K_M.gguf", "Qwen3-30B-A3B-Q8_0.gguf"],
}  # fmt: skip
MOE = {"gpt-oss-20b.auto.gguf", "Qwen3-30B-A3B-Q4_K_M.gguf", "qwen_3-30b3a-f16.gguf", "gpt-oss-20b-mxfp4.gguf"}
LOCAL = ["model.gguf", "gemma-3-4b-it-Q4_K_M.gguf", "Qwen3-4B.gguf", "Qwen3-4B-eagle3.gguf", "path_to_model",
         "gpt-oss-20b.auto.gguf", "models/7B/ggml-model.gguf", "models/gemma-1.1-7b-it.Q4_K_M.gguf",
         "models/qwen2.5-72b-iq4xs.gguf", "models/qwen2.5-0.5b-iq4xs.gguf",
         "models/Llama-3.2-1B-Instruct-Q4_K_M.gguf", "opt/models/qwen_3-30b3a-f16.gguf",
         ".cache/llama.cpp/gemma-1.1-7b-it.Q4_K_M.gguf", ".cache/llama.cpp/ai_smollm2_135M-Q4_0.gguf"]  # fmt: skip


def write_moe(path: Path, n_layer: int = 4) -> Path:
    """A MoE-shaped llama GGUF (expert tensors named as llama.cpp's LLM_FFN_EXPS_REGEX expects): enough to
    plan placement; llama.cpp does not load it."""
    import gguf

    writer = gguf.GGUFWriter(str(path), "llama")
    meta = {"block_count": n_layer, "context_length": 4096, "embedding_length": 64, "feed_forward_length": 128,
            "attention.head_count": 4, "attention.head_count_kv": 2}  # fmt: skip
    for key, value in meta.items():
        writer.add_uint32(f"llama.{key}", value)
    writer.add_tensor("token_embd.weight", np.zeros((32, 64), dtype=np.float32))
    for il in range(n_layer):
        writer.add_tensor(f"blk.{il}.attn_q.weight", np.zeros((64, 64), dtype=np.float32))
        for part in ("up", "down", "gate"):
            writer.add_tensor(f"blk.{il}.ffn_{part}_exps.weight", np.zeros((4, 64, 128), dtype=np.float32))
    writer.add_tensor("output.weight", np.zeros((32, 64), dtype=np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """HOME for the corpus: local model files under the names the lines use, and an HF hub cache."""
    home = tmp_path_factory.mktemp("corpus")
    dense = write_tiny_gguf(home / "dense.src", n_ctx_train=4096)
    moe = write_moe(home / "moe.src")

    def place(target: Path, name: str | None = None) -> None:
        name = name or target.name
        target.parent.mkdir(parents=True, exist_ok=True)
        if "mmproj" in name:
            target.write_bytes(b"\0" * 65536)
        else:
            target.write_bytes((moe if name in MOE else dense).read_bytes())

    for name in LOCAL:
        place(home / name)
    place(home / "mmproj-gemma-3-4b-it-Q4_K_M.gguf")
    hub = home / ".cache" / "huggingface" / "hub"
    for repo, files in HF.items():
        root = hub / ("models--" + repo.replace("/", "--"))
        (root / "refs").mkdir(parents=True)
        (root / "refs" / "main").write_text(COMMIT)
        for i, name in enumerate(files):
            blob = root / "blobs" / f"{i:064x}"
            place(blob, name)
            link = root / "snapshots" / COMMIT / name
            link.parent.mkdir(parents=True, exist_ok=True)
            link.symlink_to(Path("../../blobs") / blob.name)
    (home / "work").mkdir()
    return home


def _env(world: Path, case: dict[str, Any]) -> dict[str, str]:
    return {"HOME": str(world), "PATH": "/usr/bin:/bin", "XDG_CONFIG_HOME": str(world / "config"),
            "SAFE_LLAMA_CACHE_TEST": "1", **case.get("env", {})}  # fmt: skip


def _args(world: Path, case: dict[str, Any]) -> list[str]:
    return [a.replace("~/", f"{world}/").replace("/opt/models/", f"{world}/opt/models/") for a in case["args"]]


def run_plan(world: Path, case: dict[str, Any], capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch,
             bin_dir: Path) -> tuple[int, dict[str, Any]]:  # fmt: skip
    monkeypatch.chdir(world / "work" if any(a.startswith("../") for a in case["args"]) else world)
    # no network: a model not downloaded yet gets no time to have its header read over HTTP
    monkeypatch.setattr("safe_llama.pipeline.remote_header.DEADLINE", 0.0)
    options = plan_options(
        ladder=None, min_ctx=None, profile="nvidia-h200" if case.get("target") == "h200" else None, max_alloc=None,
        device_memory=None, integrated=None, host_memory="64G", llama_bin=str(bin_dir), llama_version=None,
        kv_split=None,
    )  # fmt: skip
    env = _env(world, case)
    code = plan_command(tool=case.get("tool", "server"), args=_args(world, case), json_out=True, options=options,
                        env=env)  # fmt: skip
    return code, json.loads(capsys.readouterr().out)


def _expected_path(world: Path, model: str) -> str:
    kind, _, rest = model.partition(":")
    if kind == "hf":
        repo, _, name = rest.rpartition("/")
        return str(
            world / ".cache/huggingface/hub" / ("models--" + repo.replace("/", "--")) / "snapshots" / COMMIT / name
        )
    if kind == "cache":
        return str(world / ".cache/llama.cpp" / rest)
    return str(world / rest)


def _devices(memory: dict[str, dict[str, int]]) -> list[str]:
    return [p for p in memory if p != "host"]


def test_corpus_size_and_sources() -> None:
    assert len(CASES) >= 40
    assert len({c["id"] for c in CASES}) == len(CASES)
    flags = " ".join(" ".join(c["args"]) + " " + " ".join(c.get("env", {})) for c in CASES)
    for flag in ["-hf", "-hff", "-mu", "-dr", "-nkvo", "-md", "-ngld", "-ctkd", "-ctvd", "--mmproj", "-ot", "-cmoe",
                 "-ncmoe", "-ts", "-sm", "-mg", "-dev", "--no-mmap", "--mlock", "-cram", "-hfd", "-cd",
                 "LLAMA_ARG_HF_REPO", "GGML_OPENVINO_STATEFUL_EXECUTION"]:  # fmt: skip
        assert re.search(rf"(^| ){re.escape(flag)}( |$)", flags), flag


@pytest.mark.slow
@pytest.mark.parametrize("case", CASES, ids=[c["id"] for c in CASES])
def test_corpus(
    case: dict[str, Any], world: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch,
    llama_bin: Path,
) -> None:  # fmt: skip
    model = case["model"]
    tool = case.get("tool", "server")
    if model == "pass-through":
        cmd = parse(tool, _args(world, case), _env(world, case))
        assert cmd.loads_no_model
        done = subprocess.run([str(llama_bin / f"llama-{tool}"), *_args(world, case)], capture_output=True,
                              timeout=60, check=False, cwd=world, env=_env(world, case))  # fmt: skip
        assert done.returncode in (0, 1)  # llama.cpp answered from its parser: help/list (0) or usage (1)
        assert b"llama_model_load" not in done.stderr
        return
    code, result = run_plan(world, case, capsys, monkeypatch, llama_bin)
    assert code == 0
    if model == "not-downloaded":
        assert result["model"]["path"] is None and result["model"]["bundled"] is False
        assert result["decision"]["argv"] == _args(world, case)  # llama.cpp's own fitting stays on
        return
    if model == "bundled":
        assert result["model"]["bundled"] is True
    else:
        assert os.path.abspath(result["model"]["path"]) == _expected_path(world, model)
        assert result["model"]["bundled"] is False
    if "mmproj" in case:
        assert result["model"]["source"]["mmproj"].endswith("/" + case["mmproj"])
    memory: dict[str, dict[str, int]] = result["memory"]
    devices = _devices(memory)
    for item in case.get("host", []):
        assert memory["host"].get(item, 0) > 0, (item, memory)
    for item in case.get("not_host", []):
        assert item not in memory["host"], (item, memory)
    for item in case.get("device", []):
        assert devices and memory[devices[0]].get(item, 0) > 0, (item, memory)
    for item in case.get("not_device", []):
        assert all(item not in memory[d] for d in devices), (item, memory)
    if "places" in case:
        assert sorted(memory) == sorted(case["places"])
    if "split_places" in case:
        assert all(memory[d].get("weights", 0) > 0 for d in case["split_places"])
        assert memory[case["split_places"][0]]["weights"] > memory[case["split_places"][1]]["weights"]
    if "experts_on" in case or "experts_in_host_layers" in case:
        _check_experts(world, case, memory)
    if case.get("prompt_cache_is_kv"):
        assert memory["host"]["prompt_cache"] == result["kv"]["total_bytes"]
    if case.get("n_ctx_is_trained"):
        assert result["kv"]["n_ctx"] == result["model"]["context_length"]
    argv = result["decision"]["argv"]
    for word in case.get("argv_has", []):
        assert word in argv
    for word in case.get("argv_lacks", []):
        assert word not in argv
    for name in case.get("env_lacks", []):
        assert name not in result["decision"]["env"]
    if case.get("confirm"):
        _confirm(world, case, result, llama_bin)


def _check_experts(world: Path, case: dict[str, Any], memory: dict[str, dict[str, int]]) -> None:
    """Expert bytes counted from the file's own tensor table, by the rule the flag states."""
    from safe_llama.model.gguf_header import read_header

    path = world / "moe.src"
    tensors = read_header(path).tensors
    n_host_layers = case.get("experts_in_host_layers")
    on_host = 0
    for t in tensors:
        found = EXPERTS.search(t.name)
        if found and (n_host_layers is None or int(found.group(1)) < n_host_layers):
            on_host += t.n_bytes
    embd = sum(t.n_bytes for t in tensors if t.name.startswith("token_embd"))
    assert memory["host"]["weights"] == on_host + embd


def _confirm(world: Path, case: dict[str, Any], result: dict[str, Any], llama_bin: Path) -> None:
    """Run the planned argv with the real CPU build; its buffers must be the plan's (to the logged 0.01 MiB)."""
    from tests.llama_run import run_server_until_ready

    argv = [*result["decision"]["argv"], "-lv", "4"]  # info level: the buffer lines
    code, log = run_server_until_ready(llama_bin, argv, _env(world, case) | {"LLAMA_CACHE": ""})
    assert code is None, log[-2000:]
    kv = sum(float(m) for m in re.findall(r"CPU KV buffer size = +([\d.]+) MiB", log))
    weights = sum(float(m) for m in re.findall(r"CPU(?:_Mapped)? model buffer size = +([\d.]+) MiB", log))
    host = result["memory"]["host"]
    planned_kv = (host["kv"] + host.get("draft_kv", 0)) / 2**20  # a draft model logs its own KV lines
    planned_weights = (host["weights"] + host.get("draft_weights", 0)) / 2**20
    assert abs(kv - planned_kv) < 0.02, (kv, planned_kv)
    assert weights > 0 and abs(weights - planned_weights) < 0.02 + 0.01 * weights, (weights, planned_weights)
