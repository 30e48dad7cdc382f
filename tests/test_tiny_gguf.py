"""Tests for tests/tiny_gguf.py: the generated models load and run in the real pinned llama.cpp, and the KV
cache it allocates for them is the one model_facts predicts."""

from __future__ import annotations

import json
import re
import socket
import subprocess
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import pytest

from safe_llama.model.facts import ModelFacts
from safe_llama.model.header_facts import load_model_facts
from tests.tiny_gguf import write_tiny_gguf

KV_LINE = re.compile(
    r"llama_kv_cache: size = +(?P<total>[\d.]+) MiB \( *(?P<cells>\d+) cells, +(?P<layers>\d+) layers, "
    r"+(?P<seqs>\d+/\d+) seqs\), K \(f16\): +(?P<k>[\d.]+) MiB, V \(f16\): +(?P<v>[\d.]+) MiB"
)

MODELS = [
    pytest.param(dict(arch="llama", n_layer=2, n_head=4, n_head_kv=2, head_dim=16), id="llama-gqa"),
    pytest.param(dict(arch="llama", n_layer=3, n_head=4, n_head_kv=1, head_dim=32, n_embd=48), id="llama-head-dim"),
    pytest.param(dict(arch="qwen2", n_layer=2, n_head=4, n_head_kv=2, head_dim=16), id="qwen2"),
    pytest.param(
        dict(arch="gemma3", n_layer=7, n_head=4, n_head_kv=1, head_dim=32, n_embd=64, sliding_window=128),
        id="gemma3-swa",
    ),
    pytest.param(
        dict(arch="deci", n_layer=3, n_head=4, head_count_kv_per_layer=[1, 2, 4], head_dim=24, n_embd=64),
        id="deci-per-layer-kv-heads",
    ),
]


def _mib(n_bytes: int) -> str:
    return f"{n_bytes / 1048576:.2f}"


def _expected_lines(facts: ModelFacts, cells_full: int, cells_swa: int, *, v_padded: bool) -> list[dict[str, str]]:
    """The llama_kv_cache lines model_facts predicts: full-attention cache first, then the SWA one."""
    lines = []
    for swa, cells in ((False, cells_full), (True, cells_swa)):
        layers = [layer for layer in facts.layers if layer.has_kv and layer.swa == swa]
        if not layers:
            continue
        k = sum(layer.n_embd_k_gqa for layer in layers) * cells * 2
        v_width = facts.n_embd_v_gqa_max if v_padded else None
        v = sum(v_width or layer.n_embd_v_gqa for layer in layers) * cells * 2
        lines.append(dict(cells=str(cells), layers=str(len(layers)), k=_mib(k), v=_mib(v)))
    return lines


def _kv_lines(log: str) -> list[dict[str, str]]:
    return [{key: m[key] for key in ("cells", "layers", "k", "v")} for m in KV_LINE.finditer(log)]


def test_writes_what_it_was_asked(tmp_path: Path) -> None:
    path = write_tiny_gguf(
        tmp_path / "m.gguf",
        arch="deci",
        n_layer=3,
        n_head=8,
        head_count_kv_per_layer=[1, 2, 8],
        head_dim=8,
        n_embd=48,
        n_ctx_train=4096,
    )
    facts = load_model_facts(path)
    assert (facts.architecture, facts.block_count, facts.context_length) == ("deci", 3, 4096)
    assert facts.head_count_kv == (1, 2, 8)
    assert [layer.n_embd_k_gqa for layer in facts.layers] == [8, 16, 64]
    assert path.stat().st_size < 1 << 20


@pytest.mark.parametrize(
    ("kwargs", "problem"),
    [
        pytest.param(dict(arch="bert"), "arch must be one of", id="arch"),
        pytest.param(dict(n_head=4, n_head_kv=3), "dividing n_head", id="kv-heads-divide"),
        pytest.param(dict(head_count_kv_per_layer=[1, 2]), "need arch='deci'", id="kv-heads-vary-on-llama"),
        pytest.param(dict(arch="qwen2", head_dim=8, n_embd=64), "qwen2 needs", id="qwen2-head-dim"),
        pytest.param(dict(vocab=("a", "a")), "duplicate tokens", id="duplicate-tokens"),
    ],
)
def test_refuses_models_llama_cpp_would_not_load(tmp_path: Path, kwargs: dict[str, Any], problem: str) -> None:
    with pytest.raises(ValueError, match=problem):
        write_tiny_gguf(tmp_path / "m.gguf", **kwargs)


@pytest.mark.slow
@pytest.mark.parametrize("flash_attn", ["on", "off"])
@pytest.mark.parametrize("model", MODELS)
def test_llama_completion_runs_it(tmp_path: Path, llama_bin: Path, model: dict[str, Any], flash_attn: str) -> None:
    path = write_tiny_gguf(tmp_path / "m.gguf", **model)
    argv = [
        str(llama_bin / "llama-completion"),
        "-m",
        str(path),
        "-p",
        "hi",
        "-n",
        "4",
        "-no-cnv",
        "--temp",
        "0",
        "-c",
        "1024",
        "-fa",
        flash_attn,
        "-lv",
        "4",
    ]
    # llama-completion never flushes its (leaked, asynchronous) logger at exit (common/log.cpp
    # common_log_main), so on a model this fast its log is sometimes cut short, cache lines included;
    # the run itself succeeded. Try again for the lines rather than accept a log without them.
    for _ in range(5):
        run = subprocess.run(
            argv, stdin=subprocess.DEVNULL, capture_output=True, text=True, errors="replace", timeout=120
        )
        assert run.returncode == 0, run.stderr[-2000:]
        if KV_LINE.search(run.stderr):
            break
    facts = load_model_facts(path)
    # SWA cells: pad(min(n_ctx, window + n_ubatch), 256) = pad(128 + 512) = 768
    assert _kv_lines(run.stderr) == _expected_lines(facts, 1024, 768, v_padded=flash_attn == "off")


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


@pytest.mark.slow
@pytest.mark.parametrize("arch", ["llama", "qwen2"])
def test_llama_server_serves_it(tmp_path: Path, llama_bin: Path, arch: str) -> None:
    path = write_tiny_gguf(tmp_path / "m.gguf", arch=arch)
    port = _free_port()
    log_path = tmp_path / "server.log"
    with log_path.open("w") as log:
        server = subprocess.Popen(
            [str(llama_bin / "llama-server"), "-m", str(path), "-c", "512", "-lv", "4", "--port", str(port)],
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
        )
        try:
            base = f"http://127.0.0.1:{port}"
            deadline = time.monotonic() + 60
            while True:
                assert server.poll() is None, log_path.read_text()[-2000:]
                try:
                    with urllib.request.urlopen(f"{base}/health", timeout=2) as response:  # noqa: S310 - http://127.0.0.1
                        if response.status == 200:
                            break
                except (urllib.error.URLError, ConnectionError):
                    pass
                assert time.monotonic() < deadline, "llama-server did not become ready in 60 s"
                time.sleep(0.2)
            request = urllib.request.Request(  # noqa: S310 - http://127.0.0.1
                f"{base}/completion",
                data=json.dumps({"prompt": "hi", "n_predict": 4, "ignore_eos": True}).encode(),  # random weights
                headers={"Content-Type": "application/json"},
            )
            with urllib.request.urlopen(request, timeout=60) as response:  # noqa: S310 - http://127.0.0.1
                answer = json.load(response)
            assert answer["tokens_predicted"] == 4
        finally:
            server.terminate()
            server.wait(timeout=30)
    facts = load_model_facts(path)
    # four slots, one unified stream: 512 cells
    assert _kv_lines(log_path.read_text(errors="replace")) == _expected_lines(facts, 512, 512, v_padded=False)
