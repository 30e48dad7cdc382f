"""The stores as each tool lays them out on disk (built here: the HF hub cache's blobs and snapshot symlinks,
llama.cpp's cache, LM Studio's publisher/repo folders, Ollama's manifests and sha256- blobs), found and named as
each tool names them; split files as one model, an mmproj with its model."""

from __future__ import annotations

import json
import os
from pathlib import Path

from safe_llama.pipeline.model_scan import Found, scan, stores

SHA_A = "a" * 64
SHA_B = "b" * 64
SHA_C = "c" * 64


def _blob(path: Path, text: str = "GGUF") -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return path


def _hf_repo(hub: Path, repo: str, files: dict[str, str], rev: str = "0" * 40) -> Path:
    """models--org--repo/{blobs/<sha>, refs/main, snapshots/<rev>/<file> -> ../../blobs/<sha>}, as huggingface_hub
    and llama.cpp's downloader write it."""
    root = hub / ("models--" + repo.replace("/", "--"))
    (root / "refs").mkdir(parents=True)
    (root / "refs" / "main").write_text(rev)
    snap = root / "snapshots" / rev
    for name, sha in files.items():
        _blob(root / "blobs" / sha)
        link = snap / name
        link.parent.mkdir(parents=True, exist_ok=True)
        link.symlink_to(os.path.relpath(root / "blobs" / sha, link.parent))
    return snap


def _env(home: Path) -> dict[str, str]:
    return {"HOME": str(home)}


def _by_name(found: list[Found]) -> dict[str, Found]:
    return {f.name: f for f in found}


def test_the_hf_hub_cache_names_repo_and_file_and_pairs_the_mmproj(tmp_path: Path) -> None:
    hub = tmp_path / ".cache" / "huggingface" / "hub"
    snap = _hf_repo(hub, "ggml-org/gemma-3-4b-it-GGUF",
                    {"gemma-3-4b-it-Q4_K_M.gguf": SHA_A, "mmproj-model-f16.gguf": SHA_B})  # fmt: skip
    found = _by_name(scan([], _env(tmp_path)))
    model = found["ggml-org/gemma-3-4b-it-GGUF/gemma-3-4b-it-Q4_K_M.gguf"]
    assert model.store == "hf"
    assert model.path == str(snap / "gemma-3-4b-it-Q4_K_M.gguf")  # the snapshot's link: what llama.cpp opens
    assert model.mmproj == str(snap / "mmproj-model-f16.gguf") and model.mmproj_loaded  # -hf loads it
    assert len(found) == 1


def test_only_the_snapshot_refs_main_names_is_listed(tmp_path: Path) -> None:
    hub = tmp_path / "hub"
    _hf_repo(hub, "org/m-GGUF", {"m-Q8_0.gguf": SHA_A}, rev="1" * 40)
    old = hub / "models--org--m-GGUF" / "snapshots" / ("2" * 40)
    _blob(old / "m-Q8_0.gguf")
    found = scan([], {"HOME": str(tmp_path), "HF_HUB_CACHE": str(hub)})
    assert [f.path for f in found] == [str(hub / "models--org--m-GGUF" / "snapshots" / ("1" * 40) / "m-Q8_0.gguf")]


def test_split_files_are_one_model_and_a_missing_part_is_said(tmp_path: Path) -> None:
    hub = tmp_path / ".cache" / "huggingface" / "hub"
    _hf_repo(hub, "org/big-GGUF", {"Q8_0/big-Q8_0-00001-of-00003.gguf": SHA_A,
                                   "Q8_0/big-Q8_0-00002-of-00003.gguf": SHA_B,
                                   "Q8_0/big-Q8_0-00003-of-00003.gguf": SHA_C,
                                   "Q4/big-Q4_0-00001-of-00002.gguf": "d" * 64})  # fmt: skip
    found = _by_name(scan([], _env(tmp_path)))
    whole = found["org/big-GGUF/Q8_0/big-Q8_0-00001-of-00003.gguf"]
    assert len(whole.parts) == 3 and whole.path == whole.parts[0] and whole.problem is None
    broken = found["org/big-GGUF/Q4/big-Q4_0-00001-of-00002.gguf"]
    assert broken.problem == "split into 2 files, 1 here (parts 1)"
    assert len(found) == 2


def test_llama_cpp_cache_and_lm_studio_folders(tmp_path: Path) -> None:
    cache = _blob(tmp_path / ".cache" / "llama.cpp" / "bartowski_Qwen3-8B-GGUF_Qwen3-8B-Q4_K_M.gguf")
    lms = tmp_path / ".lmstudio" / "models" / "lmstudio-community" / "Qwen2.5-VL-7B-Instruct-GGUF"
    _blob(lms / "Qwen2.5-VL-7B-Instruct-Q4_K_M.gguf")
    _blob(lms / "mmproj-model-f16.gguf")
    _blob(lms / "README.md", "not a model")
    found = _by_name(scan([], _env(tmp_path)))
    assert found["bartowski_Qwen3-8B-GGUF_Qwen3-8B-Q4_K_M.gguf"].path == str(cache)
    assert found["bartowski_Qwen3-8B-GGUF_Qwen3-8B-Q4_K_M.gguf"].store == "llama.cpp"
    vl = found["lmstudio-community/Qwen2.5-VL-7B-Instruct-GGUF/Qwen2.5-VL-7B-Instruct-Q4_K_M.gguf"]
    assert vl.store == "lm-studio" and vl.mmproj == str(lms / "mmproj-model-f16.gguf")
    assert not vl.mmproj_loaded  # LM Studio's files are launched with -m, which loads no projector
    assert len(found) == 2


def test_llama_cache_moves_with_its_variables(tmp_path: Path) -> None:
    elsewhere = tmp_path / "elsewhere"
    _blob(elsewhere / "m.gguf")
    assert [s.kind for s in stores({"HOME": str(tmp_path), "LLAMA_CACHE": str(elsewhere)})] == ["hf", "llama.cpp"]
    # LLAMA_CACHE is the pinned llama.cpp's HF cache too: the one file is listed once
    assert [f.name for f in scan([], {"HOME": str(tmp_path), "LLAMA_CACHE": str(elsewhere)})] == ["m.gguf"]


def _ollama_manifest(root: Path, where: str, layers: list[tuple[str, str]]) -> None:
    path = root / "manifests" / where
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({
        "schemaVersion": 2,
        "mediaType": "application/vnd.docker.distribution.manifest.v2+json",
        "config": {"mediaType": "application/vnd.docker.container.image.v1+json", "digest": "sha256:" + "e" * 64,
                   "size": 1},
        "layers": [{"mediaType": t, "digest": d, "size": 4} for t, d in layers],
    }))  # fmt: skip


def test_ollama_manifests_name_their_blobs(tmp_path: Path) -> None:
    root = tmp_path / ".ollama" / "models"
    model_blob = _blob(root / "blobs" / f"sha256-{SHA_A}")
    projector = _blob(root / "blobs" / f"sha256-{SHA_B}")
    hf_blob = _blob(root / "blobs" / f"sha256-{SHA_C}")
    _ollama_manifest(root, "registry.ollama.ai/library/gemma3/4b", [
        ("application/vnd.ollama.image.model", f"sha256:{SHA_A}"),
        ("application/vnd.ollama.image.projector", f"sha256:{SHA_B}"),
        ("application/vnd.ollama.image.template", "sha256:" + "f" * 64),
    ])  # fmt: skip
    _ollama_manifest(root, "hf.co/bartowski/Qwen3-8B-GGUF/Q4_K_M",
                     [("application/vnd.ollama.image.model", f"sha256:{SHA_C}")])  # fmt: skip
    _ollama_manifest(root, "registry.ollama.ai/library/gone/latest",
                     [("application/vnd.ollama.image.model", "sha256:" + "9" * 64)])  # fmt: skip
    (root / "manifests" / "registry.ollama.ai" / "library" / "gemma3" / "junk").write_text("{not json")
    found = _by_name(scan([], _env(tmp_path)))
    gemma = found["gemma3:4b"]
    assert (gemma.store, gemma.path, gemma.mmproj, gemma.mmproj_loaded) == ("ollama", str(model_blob), str(projector),
                                                                            True)  # fmt: skip
    assert found["hf.co/bartowski/Qwen3-8B-GGUF:Q4_K_M"].path == str(hf_blob)
    assert found["gone:latest"].problem == f"its model blob sha256-{'9' * 64} is missing"
    assert found["gemma3:junk"].problem == "not an Ollama manifest"


def test_given_folders_files_and_missing_paths(tmp_path: Path) -> None:
    folder = tmp_path / "models"
    _blob(folder / "a.gguf")
    _blob(folder / "deep" / "er" / "b.GGUF")
    _blob(folder / "notes.txt")
    loop = folder / "loop"
    loop.symlink_to(folder)  # a symlinked folder is not entered
    single = _blob(tmp_path / "single.bin")
    found = scan([str(folder), str(single), str(tmp_path / "nope")], _env(tmp_path / "empty-home"), defaults=False)
    assert [(f.name, f.problem) for f in found] == [
        (str(folder / "a.gguf"), None),
        (str(folder / "deep" / "er" / "b.GGUF"), None),
        (str(single), None),  # a file named is read, whatever its name: the header says whether it is a GGUF
        (str(tmp_path / "nope"), "no such file or folder"),
    ]


def test_a_file_in_two_places_is_listed_once(tmp_path: Path) -> None:
    hub = tmp_path / ".cache" / "huggingface" / "hub"
    snap = _hf_repo(hub, "org/m-GGUF", {"m-Q4_K_M.gguf": SHA_A})
    found = scan([str(snap / "m-Q4_K_M.gguf")], _env(tmp_path))
    assert [f.store for f in found] == ["hf"]
