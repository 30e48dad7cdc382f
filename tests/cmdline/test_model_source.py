"""Model sources resolved by the pinned source's cache rules (common/hf-cache.cpp, common/download.cpp)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from safe_llama.cmdline.llama_args import parse
from safe_llama.cmdline.model_source import (
    api_token,
    best_mmproj,
    best_model,
    commit_from_refs,
    docker_file,
    docker_gguf_digest,
    docker_repo_tag,
    files_from_tree,
    first_part_url,
    hf_cache_dir,
    model_endpoint,
    resolve,
    url_file,
    valid_repo_id,
)
from tests.tiny_gguf import write_tiny_gguf

COMMIT = "a" * 40


def hf_repo(cache: Path, repo: str, files: dict[str, bytes | Path], *, ref: str = "main") -> Path:
    """The hub layout llama.cpp writes: blobs/, refs/<ref>, snapshots/<commit>/<file> -> ../../blobs/<x>."""
    root = cache / ("models--" + repo.replace("/", "--"))
    (root / "refs").mkdir(parents=True)
    (root / "refs" / ref).write_text(COMMIT)
    snapshot = root / "snapshots" / COMMIT
    for i, (name, content) in enumerate(files.items()):
        blob = root / "blobs" / f"{i:064x}"
        blob.parent.mkdir(parents=True, exist_ok=True)
        blob.write_bytes(content.read_bytes() if isinstance(content, Path) else content)
        link = snapshot / name
        link.parent.mkdir(parents=True, exist_ok=True)
        link.symlink_to(Path("../" * (name.count("/") + 2)) / "blobs" / blob.name)
    return snapshot


@pytest.mark.parametrize(
    ("env", "expected"),
    [
        pytest.param({"LLAMA_CACHE": "/a", "HF_HUB_CACHE": "/b", "HOME": "/h"}, "/a", id="LLAMA_CACHE-first"),
        pytest.param({"HF_HUB_CACHE": "/b", "HF_HOME": "/c", "HOME": "/h"}, "/b", id="HF_HUB_CACHE"),
        pytest.param({"HUGGINGFACE_HUB_CACHE": "/b2", "HF_HOME": "/c"}, "/b2", id="legacy-hub-cache"),
        pytest.param({"HF_HOME": "/c", "XDG_CACHE_HOME": "/x"}, "/c/hub", id="HF_HOME-hub"),
        pytest.param({"XDG_CACHE_HOME": "/x", "HOME": "/h"}, "/x/huggingface/hub", id="XDG_CACHE_HOME"),
        pytest.param({"HOME": "/h"}, "/h/.cache/huggingface/hub", id="HOME"),
        pytest.param({"LLAMA_CACHE": "", "HOME": "/h"}, "/h/.cache/huggingface/hub", id="empty-is-unset"),
    ],
)
def test_hf_cache_directory(env: dict[str, str], expected: str) -> None:
    assert hf_cache_dir(env) == Path(expected)


def test_quant_tag_choice() -> None:
    files = ["README.md", "m-Q8_0.gguf", "m-Q4_K_M.gguf", "mmproj-m-f16.gguf", "m-IQ2_XS-00002-of-00002.gguf",
             "m-IQ2_XS-00001-of-00002.gguf"]  # fmt: skip
    assert best_model(files, "") == "m-Q4_K_M.gguf"
    assert best_model(files, "q8_0") == "m-Q8_0.gguf"  # the tag matches case-insensitively
    assert best_model(files, "IQ2_XS") == "m-IQ2_XS-00001-of-00002.gguf"  # the first split
    assert best_model(files, "Q5_K_M") is None  # a tag that is not there: no fallback
    assert best_model(["x-F16.gguf", "mmproj-x.gguf"], "") == "x-F16.gguf"  # the first model when no default tag


def test_mmproj_nearest_quantisation_in_the_same_folder() -> None:
    files = ["a/m-Q4_K_M.gguf", "a/mmproj-f16.gguf", "a/mmproj-q8_0.gguf", "mmproj-Q4_0.gguf", "b/mmproj-q4_0.gguf"]
    assert best_mmproj(files, "a/m-Q4_K_M.gguf") == "a/mmproj-q8_0.gguf"


def test_url_and_docker_files() -> None:
    env = {"HOME": "/h"}
    assert url_file("https://x/y/m.gguf?download=true#frag", env) == Path("/h/.cache/llama.cpp/m.gguf")
    assert docker_file("smollm2:135M-Q4_0", env) == Path("/h/.cache/llama.cpp/ai_smollm2_135M-Q4_0.gguf")
    assert docker_file("org/model", {"LLAMA_CACHE": "/l"}) == Path("/l/org_model_latest.gguf")


def test_hf_resolves_to_the_snapshot_file(tmp_path: Path) -> None:
    files: dict[str, bytes | Path] = {"m-Q4_K_M.gguf": b"q4", "m-Q8_0.gguf": b"q8", "mmproj-m-f16.gguf": b"p"}
    snapshot = hf_repo(tmp_path, "org/m-GGUF", files)
    env = {"HF_HUB_CACHE": str(tmp_path)}
    found = resolve(parse("server", ["-hf", "org/m-GGUF"], env), env)
    assert found is not None and found.path == str(snapshot / "m-Q4_K_M.gguf")
    assert found.mmproj == str(snapshot / "mmproj-m-f16.gguf")
    q8 = resolve(parse("server", ["-hf", "org/m-GGUF:Q8_0", "--no-mmproj"], env), env)
    assert q8 is not None and q8.path == str(snapshot / "m-Q8_0.gguf") and q8.mmproj is None
    hff = resolve(parse("cli", ["-hfr", "org/m-GGUF", "-hff", "m-Q8_0.gguf"], env), env)
    assert hff is not None and hff.path == str(snapshot / "m-Q8_0.gguf")
    by_env = resolve(parse("server", [], {**env, "LLAMA_ARG_HF_REPO": "org/m-GGUF:Q8_0"}), env)
    assert by_env is not None and by_env.path == str(snapshot / "m-Q8_0.gguf")


def test_hf_wins_over_m_and_a_missing_one_is_not_on_disk(tmp_path: Path) -> None:
    env = {"HF_HUB_CACHE": str(tmp_path)}
    found = resolve(parse("server", ["-m", "/x.gguf", "-hf", "org/absent"], env), env)
    assert found is not None and found.kind == "hf" and found.path is None
    hf_repo(tmp_path, "org/q", {"m-Q4_K_M.gguf": b"q4"})
    tagged = resolve(parse("server", ["-hf", "org/q:Q6_K"], env), env)
    assert tagged is not None and tagged.path is None and "Q6_K" in tagged.where


def test_only_no_source_means_the_bundled_model() -> None:
    assert resolve(parse("server", ["-c", "4096"], {}), {}) is None


def _plan(args: list[str], env: dict[str, str]) -> dict[str, object]:
    done = subprocess.run(
        [sys.executable, "-m", "safe_llama", "plan", "--json", "--host-memory", "8G", "server", *args],
        env=env, capture_output=True, text=True, timeout=120, check=True,
    )  # fmt: skip
    result: dict[str, object] = json.loads(done.stdout)
    return result


def test_plan_on_an_hf_model_in_the_cache(tmp_path: Path, clean_env: dict[str, str]) -> None:
    model = write_tiny_gguf(tmp_path / "src.gguf", n_ctx_train=4096)
    cache = tmp_path / "hub"
    snapshot = hf_repo(cache, "org/tiny-GGUF", {"tiny-Q4_K_M.gguf": model})
    env = {**clean_env, "HF_HUB_CACHE": str(cache), "XDG_CACHE_HOME": str(tmp_path / "xdg")}
    result = _plan(["-hf", "org/tiny-GGUF"], env)
    assert result["model"]["path"] == str(snapshot / "tiny-Q4_K_M.gguf")  # type: ignore[index]
    assert result["model"]["context_length"] == 4096  # type: ignore[index]
    argv = result["decision"]["argv"]  # type: ignore[index]
    assert "-m" not in argv and argv[:2] == ["-hf", "org/tiny-GGUF"]


def test_plan_on_an_hf_model_not_downloaded(tmp_path: Path, clean_env: dict[str, str]) -> None:
    env = {
        **clean_env,
        "HF_HUB_CACHE": str(tmp_path / "empty"),
        "XDG_CACHE_HOME": str(tmp_path / "xdg"),
        "MODEL_ENDPOINT": "http://127.0.0.1:9",
    }  # fmt: skip (the discard port: its header cannot be read)
    result = _plan(["-hf", "ggml-org/gemma-3-1b-it-GGUF", "-c", "8192"], env)
    assert result["model"] == {  # never the bundled model
        "path": None,
        "bundled": False,
        "downloaded": False,
        "source": {"kind": "hf", "spec": "ggml-org/gemma-3-1b-it-GGUF", "path": None,
                   "where": f"not in the HF cache {tmp_path / 'empty' / 'models--ggml-org--gemma-3-1b-it-GGUF'}",
                   "mmproj": None},
    }  # fmt: skip
    assert result["decision"]["argv"] == ["-hf", "ggml-org/gemma-3-1b-it-GGUF", "-c", "8192"]  # type: ignore[index]
    assert len(result["notes"]) == 1 and "not downloaded yet" in result["notes"][0]  # type: ignore[arg-type,index]


@pytest.mark.parametrize(
    ("env", "expected"),
    [
        pytest.param({}, "https://huggingface.co/", id="default"),
        pytest.param({"HF_ENDPOINT": "https://mirror.example"}, "https://mirror.example/", id="HF_ENDPOINT"),
        pytest.param(
            {"MODEL_ENDPOINT": "http://m:8080/x/", "HF_ENDPOINT": "https://h"},
            "http://m:8080/x/",
            id="MODEL_ENDPOINT first",
        ),
        pytest.param({"MODEL_ENDPOINT": "", "HF_ENDPOINT": "https://h"}, "https://h/", id="empty is unset"),
    ],
)
def test_the_endpoint_llama_cpp_asks(env: dict[str, str], expected: str) -> None:
    assert model_endpoint(env) == expected


def test_repository_names_and_tokens_as_llama_cpp_checks_them() -> None:
    assert valid_repo_id("ggml-org/gemma-3-270m-GGUF") and valid_repo_id("a_b/c.d")
    assert not any(valid_repo_id(r) for r in ("org", "a/b/c", "a//b", "-a/b", "a/b-", "a b/c", "a/" + "x" * 256))
    good = "hf_" + "a1B2" * 9
    assert api_token(good) == good
    assert api_token("hf_short") is None and api_token("sk_" + "a" * 40) is None and api_token(None) is None


def test_the_commit_and_the_files_of_a_repository() -> None:
    commit, other = "a" * 40, "b" * 40
    refs = {"branches": [{"name": "dev", "targetCommit": other}, {"name": "main", "targetCommit": commit}]}
    assert commit_from_refs(refs) == commit
    assert commit_from_refs({"branches": [{"name": "dev", "targetCommit": other}]}) == other
    assert commit_from_refs({"branches": [{"name": "main", "targetCommit": "zz"}]}) is None
    assert commit_from_refs([]) is None
    tree = [
        {"type": "file", "path": "m-Q4_K_M.gguf", "size": 135, "lfs": {"oid": "c" * 64, "size": 1 << 30}},
        {"type": "file", "path": "README.md", "size": 10},
        {"type": "directory", "path": "sub"},
        {"type": "file", "path": "../escape.gguf", "size": 1},
        {"type": "file", "path": "odd.gguf", "size": "big"},
    ]
    assert files_from_tree(tree) == {"m-Q4_K_M.gguf": 1 << 30, "README.md": 10, "odd.gguf": 0}
    assert files_from_tree({"error": "x"}) == {}


def test_split_urls_and_docker_names() -> None:
    assert first_part_url("https://h/r/m-Q4_K_M-00003-of-00004.gguf") == "https://h/r/m-Q4_K_M-00001-of-00004.gguf"
    assert first_part_url("https://h/r/m.gguf") == "https://h/r/m.gguf"
    assert first_part_url("https://h/r/m-00002-of-00002.gguf?download=true") == (
        "https://h/r/m-00002-of-00002.gguf?download=true"  # llama.cpp does not split a URL with a query either
    )
    assert docker_repo_tag("gemma3") == ("ai/gemma3", "latest")
    assert docker_repo_tag("me/smollm2:135M-Q4_0") == ("me/smollm2", "135M-Q4_0")
    layer = {"mediaType": "application/vnd.docker.ai.gguf.v3", "digest": "sha256:" + "AB" * 32}
    assert docker_gguf_digest({"layers": [{"mediaType": "x"}, layer]}) == "sha256:" + "ab" * 32
    assert docker_gguf_digest({"layers": [{**layer, "digest": "md5:00"}]}) is None
