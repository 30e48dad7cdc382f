"""Tests for safe_llama/pipeline/remote_header.py: a model llama.cpp has not downloaded yet, planned from its
header read over HTTPS range requests, against tests/hf_hub.py (a local stand-in for the hub: no internet here).

The fast tests serve tiny models; the slow one is the whole first start of `safe-llama completion -hf` on the
pinned CPU build and the bundled model: planned exactly (the plan's KV is the KV llama.cpp logs), downloaded,
answered."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import pytest

from safe_llama.cmdline.llama_args import parse
from safe_llama.cmdline.model_source import resolve
from safe_llama.errors import ModelNotOnDisk
from safe_llama.model.facts_cache import facts_for
from safe_llama.pipeline.remote_header import MAX_HEADER_BYTES, RemoteModel, read_remote, shown
from tests.hf_hub import COMMIT, Hub, serving
from tests.llama_run import kv_lines
from tests.tiny_gguf import write_tiny_gguf

TOKEN = "hf_" + "Tok3n" * 7  # the shape llama.cpp sends to the API (hf_ and 34 or more letters or digits)
REPO = "test-org/tiny-GGUF"


@pytest.fixture
def tiny(tmp_path: Path) -> Path:
    return write_tiny_gguf(tmp_path / "tiny.gguf", n_ctx_train=4096)


@pytest.fixture
def hub(tmp_path: Path, tiny: Path) -> Iterator[Hub]:
    split = write_tiny_gguf(tmp_path / "split.gguf", n_ctx_train=8192)
    files = {
        "tiny-Q4_K_M.gguf": tiny,
        "tiny-Q8_0.gguf": split,
        "big/tiny-F16-00001-of-00002.gguf": split,
        "big/tiny-F16-00002-of-00002.gguf": tiny,
    }
    with serving(tmp_path, {REPO: files}) as running:
        yield running


def _env(hub: Hub, tmp_path: Path, **extra: str) -> dict[str, str]:
    return {"HOME": str(tmp_path / "home"), "MODEL_ENDPOINT": hub.endpoint, "SSL_CERT_FILE": str(hub.cert), **extra}


def _read(args: list[str], env: dict[str, str], tool: str = "server") -> tuple[RemoteModel, str]:
    cmd = parse(tool, args, env)
    source = resolve(cmd, env)
    assert source is not None and not source.on_disk
    remote = read_remote(source, cmd, env)
    return remote, remote.line(source.spec, tool)


def test_the_header_read_over_https_gives_the_files_own_facts(hub: Hub, tmp_path: Path, tiny: Path) -> None:
    env = _env(hub, tmp_path, HF_TOKEN=TOKEN)
    remote, line = _read(["-hf", REPO], env)
    url = f"{hub.endpoint}{REPO}/resolve/{COMMIT}/tiny-Q4_K_M.gguf"
    assert remote.url == url
    assert remote.facts == replace(facts_for(tiny, env), path=url)
    assert line.startswith(f"{REPO} is not downloaded yet: planned from its GGUF header, read over HTTPS from {url}")
    # llama.cpp's requests, in its order, each with the token (it is valid for the API); never said
    assert [(s.path, s.authorization) for s in hub.seen] == [
        (f"/api/models/{REPO}/refs", f"Bearer {TOKEN}"),
        (f"/api/models/{REPO}/tree/{COMMIT}?recursive=true", f"Bearer {TOKEN}"),
        (f"/{REPO}/resolve/{COMMIT}/tiny-Q4_K_M.gguf", f"Bearer {TOKEN}"),
    ]
    assert hub.seen[-1].range == "bytes=0-4194303" and TOKEN not in line


def test_a_tag_a_file_and_a_split_model(hub: Hub, tmp_path: Path) -> None:
    env = _env(hub, tmp_path)
    remote, _ = _read(["-hf", f"{REPO}:q8_0"], env)
    assert remote.url.endswith("/tiny-Q8_0.gguf") and remote.facts.context_length == 8192
    remote, _ = _read(["-hf", REPO, "-hff", "big/tiny-F16-00001-of-00002.gguf"], env)
    assert remote.facts.context_length == 8192
    # -mu naming the second part: llama.cpp loads the first, whose header is read
    second = f"{hub.endpoint}{REPO}/resolve/main/big/tiny-F16-00002-of-00002.gguf"
    remote, _ = _read(["-mu", second], env)
    assert remote.url == second.replace("00002-of", "00001-of") and remote.facts.context_length == 8192
    assert all(s.authorization is None for s in hub.seen)  # no token given, none sent


def test_hfr_and_llama_arg_hf_repo_are_hf(hub: Hub, tmp_path: Path) -> None:
    env = _env(hub, tmp_path)
    by_alias, _ = _read(["-hfr", REPO], env)
    by_variable, _ = _read([], {**env, "LLAMA_ARG_HF_REPO": REPO})
    assert by_alias.url == by_variable.url and by_alias.url.endswith("/tiny-Q4_K_M.gguf")


def test_a_docker_model_and_credentials_kept_from_another_host(
    tmp_path: Path, tiny: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """-dr as llama.cpp resolves it (token, manifest, blob); Docker Hub's blob redirect goes to another host
    (here localhost), which gets no Authorization."""
    with serving(tmp_path, {}, {"ai/tiny:latest": tiny}) as hub:
        monkeypatch.setattr("safe_llama.pipeline.remote_header.DOCKER_AUTH", hub.endpoint)
        monkeypatch.setattr("safe_llama.pipeline.remote_header.DOCKER_REGISTRY", hub.endpoint)
        remote, _ = _read(["-dr", "tiny"], _env(hub, tmp_path))
        assert remote.facts.context_length == 4096
        assert remote.url.startswith(f"{hub.endpoint}v2/ai/tiny/blobs/sha256:")  # the URL llama.cpp asks
        assert [(s.path.split("?")[0], s.authorization) for s in hub.seen[:3]] == [
            ("/token", None),
            ("/v2/ai/tiny/manifests/latest", "Bearer dock3r-t0ken"),
            (hub.seen[2].path, "Bearer dock3r-t0ken"),
        ]
        assert hub.seen[2].path.startswith("/v2/ai/tiny/blobs/sha256:")
        assert all(s.authorization is None for s in hub.seen[3:]) and hub.seen[3].path.startswith("/cdn/")


def test_a_token_llama_cpp_keeps_from_the_api_is_kept_from_it_too(hub: Hub, tmp_path: Path) -> None:
    env = _env(hub, tmp_path, HF_TOKEN="not-an-hf-token")  # noqa: S106 (a made-up token, the test's input)
    _read(["-hf", REPO], env)
    assert [s.authorization for s in hub.seen] == [None, None, "Bearer not-an-hf-token"]


@pytest.mark.parametrize(
    ("args", "extra", "why"),
    [
        pytest.param(["-hf", f"{REPO}:Q2_K"], {}, f"{REPO} holds no Q2_K GGUF model file", id="no such tag"),
        pytest.param(["-hf", "test-org/absent"], {}, "/api/models/test-org/absent/refs: HTTP 404", id="no repo"),
        pytest.param(["-hf", REPO, "--offline"], {}, "--offline: llama.cpp loads it only from its cache", id="offline"),
        pytest.param(
            ["-hf", REPO],
            {"SSL_CERT_FILE": "/nonexistent.pem", "SSL_CERT_DIR": "/nonexistent"},
            "no CA certificates to verify the server with (SSL_CERT_FILE /nonexistent.pem is not a file)",
            id="no CA",
        ),
        pytest.param(
            ["-hf", REPO, "-hft", TOKEN + "\nX-Leak: 1"],
            {},
            "tiny-Q4_K_M.gguf: a URL or a header (the token?) that HTTP cannot carry",
            id="a token HTTP cannot carry",
        ),
        pytest.param(
            ["-hf", REPO],
            {"SSL_CERT_FILE": "/etc/ssl/certs/ca-certificates.crt"},
            "the server's certificate is not trusted (self-signed certificate)",
            id="untrusted",
        ),
    ],
)
def test_when_the_header_cannot_be_read_the_line_says_why(
    hub: Hub, tmp_path: Path, args: list[str], extra: dict[str, str], why: str
) -> None:
    env = _env(hub, tmp_path, HF_TOKEN=TOKEN, **extra)
    with pytest.raises(ModelNotOnDisk) as err:
        _read(args, env)
    message = err.value.message
    assert why in message and TOKEN not in message
    assert message.endswith(
        "llama-server downloads it and fits it itself on this start; the plan is exact from the next start"
    )


def test_a_url_is_shown_without_its_credentials_or_query() -> None:
    assert shown("https://u:p@example.org:8443/a/m.gguf?sig=x") == "https://****:****@example.org:8443/a/m.gguf"
    assert MAX_HEADER_BYTES >= 10 << 20  # a real header (the bundled model's 6 MiB) fits under the cap


@pytest.mark.slow
def test_the_first_start_of_an_hf_model_is_planned_exactly(
    tmp_path: Path, llama_bin: Path, bundled_model: Path, clean_env: dict[str, str]
) -> None:
    """`safe-llama completion -hf <repo> -p Hi -n 4` against the local hub: the plan's KV is llama.cpp's, the
    model is downloaded by llama.cpp (safe-llama fetched only its header), the reply comes."""
    repo = "test-org/gemma-3-270m-GGUF"
    name = "gemma-3-270m-Q4_K_M.gguf"
    with serving(tmp_path, {repo: {name: bundled_model}}) as hub:
        env = {k: v for k, v in clean_env.items() if k not in ("LLAMA_CACHE", "HF_HUB_CACHE", "HF_HOME")}
        env.update(
            HOME=str(tmp_path / "home"),
            XDG_CACHE_HOME=str(tmp_path / "cache"),
            HF_TOKEN=TOKEN,
            XDG_CONFIG_HOME=str(tmp_path / "config"),
            MODEL_ENDPOINT=hub.endpoint,
            SSL_CERT_FILE=str(hub.cert),
            SAFE_LLAMA_BIN_DIR=str(llama_bin),
            LLAMA_ARG_LOG_VERBOSITY="4",  # llama-completion logs its KV sizes from verbosity 4 on
        )
        args = ["completion", "-hf", repo, "-p", "Hi", "-n", "4"]
        planned = subprocess.run(
            [sys.executable, "-m", "safe_llama", "plan", "--json", *args], env=env, capture_output=True, text=True,
            timeout=120, check=True,
        )  # fmt: skip
        plan = json.loads(planned.stdout)
        assert plan["model"]["downloaded"] is False and plan["fits"] is True
        header_bytes = hub.sent_for(name)
        assert 0 < header_bytes < 16 << 20  # the header, not the 241 MiB of weights

        run = subprocess.run(
            [sys.executable, "-m", "safe_llama", *args], env=env, capture_output=True, text=True, timeout=300,
            stdin=subprocess.DEVNULL,
        )  # fmt: skip
        log = run.stdout + run.stderr
        assert run.returncode == 0, log[-3000:]
        url = f"{hub.endpoint}{repo}/resolve/{COMMIT}/{name}"
        assert (
            f"safe-llama: {repo} is not downloaded yet: planned from its GGUF header, read over HTTPS from {url}" in log
        )
        assert "llama-completion downloads it on this start" in log
        assert "fits it itself" not in log and "HTTPS is not supported" not in log
        logged = [(x.cells, x.layers, x.type_k, x.k, x.type_v, x.v, x.total) for x in kv_lines(log)]
        expected = [
            (c["cells"], c["layers"], c["type_k"], c["log_mib"]["k"], c["type_v"], c["log_mib"]["v"],
             c["log_mib"]["total"])
            for c in plan["kv"]["caches"]
        ]  # fmt: skip
        assert logged == expected and logged  # planned exactly on the first start
        assert "common_perf_print" in log  # it answered (4 tokens predicted)
        # llama.cpp downloaded the whole file into its cache; the token was sent, and said or kept nowhere
        snapshot = tmp_path / "cache" / "huggingface" / "hub" / f"models--{repo.replace('/', '--')}" / "snapshots"
        assert (snapshot / COMMIT / name).stat().st_size == bundled_model.stat().st_size
        assert hub.sent_for(name) >= bundled_model.stat().st_size
        assert any(s.authorization == f"Bearer {TOKEN}" for s in hub.seen)
        assert TOKEN not in log and TOKEN not in planned.stdout + planned.stderr
        for root, _, files in os.walk(tmp_path / "cache" / "safe-llama"):
            for file in files:
                assert TOKEN.encode() not in (Path(root) / file).read_bytes()
        # the next start reads the file in llama.cpp's cache: no line about a download
        again = subprocess.run(
            [sys.executable, "-m", "safe_llama", "plan", "--json", *args], env=env, capture_output=True, text=True,
            timeout=120, check=True,
        )  # fmt: skip
        cached = json.loads(again.stdout)
        assert cached["model"]["downloaded"] is True and cached["kv"] == plan["kv"]
