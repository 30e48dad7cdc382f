"""The KV prediction against the real pinned llama-server: every `llama_kv_cache: size` line, and exact
bytes from the CPU backend's allocation failure under an address-space limit."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from safe_llama.cmdline.llama_args import parse
from safe_llama.cmdline.request import to_request
from safe_llama.model.header_facts import load_model_facts
from safe_llama.model.kv import buffers, mib_line, plan_kv
from tests.llama_run import ALLOC_FAIL, kv_lines, run_server_until_ready
from tests.tiny_gguf import write_tiny_gguf

MODELS: dict[str, dict[str, object]] = {
    "L1": {"arch": "llama", "n_layer": 2, "n_head": 4, "n_head_kv": 2, "head_dim": 16},
    "L2": {"arch": "llama", "n_layer": 3, "n_head": 8, "n_head_kv": 8, "head_dim": 32},
    "L3": {"arch": "llama", "n_layer": 4, "n_head": 6, "n_head_kv": 2, "head_dim": 64, "n_embd": 128},
    "Q1": {"arch": "qwen2", "n_layer": 2, "n_head": 4, "n_head_kv": 1, "head_dim": 32},
    "Q2": {"arch": "qwen2", "n_layer": 3, "n_head": 12, "n_head_kv": 4, "head_dim": 16},
}

# (model, llama-server args, extra environment)
MATRIX: list[tuple[str, list[str], dict[str, str]]] = [
    ("G", ["-c", "65536"], {}),
    ("G", ["-c", "1000"], {}),
    ("G", ["-c", "0"], {}),
    ("G", [], {}),
    ("G", ["-c", "4096", "-np", "2"], {}),
    ("G", ["-c", "4096", "-np", "3", "-kvu"], {}),
    ("G", ["-c", "8192", "--swa-full"], {}),
    ("G", ["-c", "8192", "-ub", "128"], {}),
    ("G", ["-c", "4096", "-ctk", "q8_0", "-ctv", "q8_0"], {}),
    ("G", ["-c", "5000", "-np", "4"], {"LLAMA_ARG_CACHE_TYPE_K": "q4_0"}),
    ("L1", ["-c", "300"], {}),
    ("L1", ["-c", "0"], {}),
    ("L1", ["-np", "2"], {}),
    ("L1", ["-c", "2048", "-np", "1", "-ctk", "f32", "-ctv", "f32"], {}),
    ("L1", ["-np", "2", "-c", "1000"], {"LLAMA_ARG_KV_UNIFIED": "1"}),
    ("L2", ["-c", "1234", "-np", "3"], {}),
    ("L2", ["-c", "4096", "-ctk", "bf16", "-ctv", "bf16"], {}),
    ("L2", ["-c", "4096", "-ctk", "q4_1", "-ctv", "q5_0"], {}),
    ("L3", ["-c", "3000", "-ctk", "q5_1", "-ctv", "iq4_nl"], {}),
    ("L3", [], {"LLAMA_ARG_CTX_SIZE": "777", "LLAMA_ARG_N_PARALLEL": "2"}),
    ("L3", ["-c", "2048"], {"LLAMA_ARG_CTX_SIZE": "999"}),
    ("Q1", ["-c", "512", "-np", "4", "-kvu"], {}),
    ("Q1", ["-c", "4096", "-ctk", "q8_0", "-ctv", "f16"], {}),
    ("Q2", ["-c", "2000", "-np", "2", "-ub", "64", "-b", "64"], {}),
    ("Q2", ["-np", "2", "-fit", "off"], {}),
    ("Q2", ["-c", "0", "-np", "3"], {}),
    ("Q2", ["-c", "700", "-np", "3", "-no-kvu"], {"LLAMA_ARG_KV_UNIFIED": "1"}),
]


@pytest.fixture(scope="module")
def models(tmp_path_factory: pytest.TempPathFactory, bundled_model: Path) -> dict[str, Path]:
    folder = tmp_path_factory.mktemp("models")
    out = {"G": bundled_model}
    for name, spec in MODELS.items():
        out[name] = write_tiny_gguf(folder / f"{name}.gguf", **spec)  # type: ignore[arg-type]
    return out


def _predict(
    model: Path, args: list[str], env: dict[str, str]
) -> list[tuple[str, int, int, int, int, str, str, str, str]]:
    req = to_request(parse("server", ["-m", str(model), *args], env))
    kv = plan_kv(load_model_facts(model), req.kv)
    out = []
    for cache in kv.caches:
        total, k, v = mib_line(cache)
        out.append(
            (
                total,
                cache.cells,
                cache.layers,
                cache.n_seq_max,
                cache.n_stream,
                cache.type_k,
                k,
                cache.type_v,
                v,
            )
        )
    return out


@pytest.mark.slow
@pytest.mark.parametrize(("model", "args", "env"), MATRIX, ids=[f"{m}:{' '.join(a) or '-'}:{e}" for m, a, e in MATRIX])
def test_kv_lines_match_real_server(
    model: str,
    args: list[str],
    env: dict[str, str],
    models: dict[str, Path],
    llama_bin: Path,
    clean_env: dict[str, str],
) -> None:
    path = models[model]
    run_env = {**clean_env, **env, "LLAMA_ARG_LOG_VERBOSITY": "4"}
    code, log = run_server_until_ready(llama_bin, ["-m", str(path), *args], run_env)
    assert code is None, f"llama-server exited {code}:\n{log[-3000:]}"
    seen = [(x.total, x.cells, x.layers, x.seqs, x.streams, x.type_k, x.k, x.type_v, x.v) for x in kv_lines(log)]
    assert seen, log[-3000:]
    assert _predict(path, args, {**env}) == seen


EXACT = [
    ("G", ["-c", "2000000"], 3_000_000),
    ("L2", ["-c", "4000000"], 3_000_000),
    ("L3", ["-c", "3000000", "-ctk", "q8_0", "-ctv", "q8_0"], 3_000_000),
    ("Q1", ["-c", "16000000", "-np", "2"], 3_000_000),
]


@pytest.mark.slow
@pytest.mark.parametrize(("model", "args", "limit_kib"), EXACT, ids=[f"{m}:{' '.join(a)}" for m, a, _ in EXACT])
def test_exact_first_kv_buffer_under_ulimit(
    model: str,
    args: list[str],
    limit_kib: int,
    models: dict[str, Path],
    llama_bin: Path,
    clean_env: dict[str, str],
) -> None:
    path = models[model]
    code, log = run_server_until_ready(llama_bin, ["-m", str(path), *args], clean_env, as_limit_kib=limit_kib)
    assert code not in (None, 0), "expected the KV allocation to fail under the address-space limit"
    found = ALLOC_FAIL.findall(log)
    assert found, log[-3000:]
    req = to_request(parse("server", ["-m", str(path), *args], {}))
    kv = plan_kv(load_model_facts(path), req.kv)
    first_buffer = buffers(kv.caches[0].tensor_bytes, None)[0]
    assert int(found[0]) == first_buffer
    assert re.search(r"failed to initialize the context|unable to create context|failed to allocate", log)
