"""Where the model llama.cpp will load comes from, and which file on disk that is.

Owns the pinned source's cache rules (common/hf-cache.cpp, common/download.cpp, common/arg.cpp): the
HF hub cache directory, the models--org--repo/snapshots/<ref> layout, the quant-tag choice, the automatic
mmproj, and the file -mu/-dr download to. Pure but for listing the cache; never downloads anything.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from safe_llama.cmdline.llama_args import CommandLine

DEFAULT_TAGS = ("Q4_K_M", "Q8_0")  # find_best_model with no :tag
# llama.cpp's examples that auto-download an mmproj with -hf (mmproj_examples, plus download)
MMPROJ_TOOLS = frozenset({"cli", "server", "completion"})
_SIDE_FILES = ("mmproj", "imatrix", "mtp-", "eagle3-", "dflash-", "dspark-")
_SPLIT = re.compile(r"^(.+)-([0-9]{5})-of-([0-9]{5})$", re.IGNORECASE)
_TAG = re.compile(r"[-.]([A-Z0-9_]+)$", re.IGNORECASE)


@dataclass(frozen=True)
class ModelSource:
    """The model a command line names, and the file it is on disk (None: not downloaded yet)."""

    kind: str  # "model" (-m) | "hf" (-hf) | "url" (-mu) | "docker" (-dr) | "bundled" (none given)
    spec: str  # what the user wrote (repo[:tag], URL, path)
    path: str | None
    where: str  # how the path was found, or where it would be
    mmproj: str | None = None  # the projector -hf loads beside it (on disk)

    @property
    def on_disk(self) -> bool:
        return self.path is not None


def hf_cache_dir(env: Mapping[str, str]) -> Path:
    """hf_cache::get_cache_directory: the first of these set and non-empty."""
    for var, sub in (
        ("LLAMA_CACHE", ""),
        ("HF_HUB_CACHE", ""),
        ("HUGGINGFACE_HUB_CACHE", ""),
        ("HF_HOME", "hub"),
        ("XDG_CACHE_HOME", "huggingface/hub"),
        ("HOME", ".cache/huggingface/hub"),
    ):
        base = env.get(var, "")
        if base:
            return Path(base) / sub if sub else Path(base)
    return Path.home() / ".cache" / "huggingface" / "hub"


def llama_cache_dir(env: Mapping[str, str]) -> Path:
    """fs_get_cache_directory (Linux): where -mu and -dr download to."""
    if env.get("LLAMA_CACHE"):
        return Path(env["LLAMA_CACHE"])
    base = env.get("XDG_CACHE_HOME") or str(Path(env.get("HOME") or Path.home()) / ".cache")
    return Path(base) / "llama.cpp"


def split_repo_tag(spec: str) -> tuple[str, str]:
    """common_download_split_repo_tag: 'org/repo:Q8_0' -> ('org/repo', 'Q8_0')."""
    parts = spec.split(":")
    return parts[0], (parts[-1] if len(parts) > 1 else "")


def split_info(path: str) -> tuple[str, str, int, int] | None:
    """get_gguf_split_info: (prefix, TAG, index, count), None for a non-.gguf name."""
    if not path.endswith(".gguf"):
        return None
    prefix = path[: -len(".gguf")]
    index = count = 1
    found = _SPLIT.match(prefix)
    if found:
        prefix, index, count = found.group(1), int(found.group(2)), int(found.group(3))
    tag = _TAG.search(prefix)
    return prefix, (tag.group(1).upper() if tag else ""), index, count


def _quant_bits(tag: str) -> int:
    digits = re.search(r"[0-9]+", tag)
    return int(digits.group(0)) if digits else 0


def is_model_file(path: str) -> bool:
    name = path.rsplit("/", 1)[-1]
    return path.endswith(".gguf") and not any(word in name for word in _SIDE_FILES)


def _first_part(path: str) -> bool:
    info = split_info(path)
    return info is not None and not (info[3] > 1 and info[2] != 1)


def best_model(files: Sequence[str], tag: str) -> str | None:
    """find_best_model: the first file matching the tag (Q4_K_M, then Q8_0 when none), else the first model."""
    for wanted in (tag,) if tag else DEFAULT_TAGS:
        pattern = re.compile(re.escape(wanted) + "[.-]", re.IGNORECASE)
        for path in files:
            if is_model_file(path) and pattern.search(path) and _first_part(path):
                return path
    if not tag:
        return next((p for p in files if is_model_file(p) and _first_part(p)), None)
    return None


def best_mmproj(files: Sequence[str], model: str) -> str | None:
    """find_best_sibling(.., "mmproj"): deepest shared folder, then the quantisation nearest the model's."""
    info = split_info(model)
    model_bits = _quant_bits(info[1]) if info else 0
    model_dir = model.split("/")[:-1]
    best: tuple[int, int] | None = None
    chosen = None
    for path in files:
        if not path.endswith(".gguf") or "mmproj" not in path:
            continue
        sib_dir = path.split("/")[:-1]
        depth = 0
        while depth < min(len(model_dir), len(sib_dir)) and model_dir[depth] == sib_dir[depth]:
            depth += 1
        if depth != len(sib_dir):
            continue
        sib = split_info(path)
        diff = abs((_quant_bits(sib[1]) if sib else 0) - model_bits)
        if best is None or depth > best[0] or (depth == best[0] and diff < best[1]):
            best, chosen = (depth, diff), path
    return chosen


def _cached_ref(repo_dir: Path) -> str | None:
    """get_cached_ref: refs/main, else the first valid ref."""
    refs = repo_dir / "refs"
    fallback = None
    try:
        entries = sorted(refs.iterdir())
    except OSError:
        return None
    for entry in entries:
        try:
            commit = entry.read_text().splitlines()[0].strip() if entry.is_file() else ""
        except (OSError, IndexError):
            continue
        if not re.fullmatch(r"[0-9a-fA-F]{40}", commit):
            continue
        if entry.name == "main":
            return commit
        fallback = fallback or commit
    return fallback


def cached_files(repo: str, env: Mapping[str, str]) -> tuple[Path, list[str]] | None:
    """hf_cache::get_cached_files for one repo: the snapshot folder and its files (relative, sorted)."""
    repo_dir = hf_cache_dir(env) / ("models--" + repo.replace("/", "--"))
    commit = _cached_ref(repo_dir)
    if commit is None:
        return None
    snapshot = repo_dir / "snapshots" / commit
    if not snapshot.is_dir():
        return None
    files = []
    for root, _, names in os.walk(snapshot, followlinks=False):
        for name in names:
            files.append(os.path.relpath(os.path.join(root, name), snapshot).replace(os.sep, "/"))
    return snapshot, sorted(files)


def _existing(path: Path) -> bool:
    try:
        return path.is_file()  # a snapshot entry is a link into blobs/: a dangling one is not on disk
    except OSError:
        return False


def resolve_hf(spec: str, hf_file: str | None, tool: str, env: Mapping[str, str], *, mmproj: bool) -> ModelSource:
    repo, tag = split_repo_tag(spec)
    found = cached_files(repo, env)
    folder = hf_cache_dir(env) / ("models--" + repo.replace("/", "--"))
    if found is None:
        return ModelSource("hf", spec, None, f"not in the HF cache {folder}")
    snapshot, files = found
    chosen = hf_file if hf_file and hf_file in files else (None if hf_file else best_model(files, tag))
    if chosen is None or not _existing(snapshot / chosen):
        what = hf_file or (f"a {tag} file" if tag else "a GGUF model file")
        return ModelSource("hf", spec, None, f"{what} is not in the HF cache {snapshot}")
    projector = best_mmproj(files, chosen) if mmproj and tool in MMPROJ_TOOLS else None
    projector_path = str(snapshot / projector) if projector and _existing(snapshot / projector) else None
    return ModelSource("hf", spec, str(snapshot / chosen), f"HF cache {snapshot}", projector_path)


def url_file(url: str, env: Mapping[str, str]) -> Path:
    """get_default_local_path: the URL's last path segment, in llama.cpp's cache."""
    name = url.split("#")[0].split("?")[0].split("/")[-1]
    return llama_cache_dir(env) / name


def docker_file(spec: str, env: Mapping[str, str]) -> Path:
    """common_docker_resolve_model's local file: [ai/]repo_tag.gguf in llama.cpp's cache."""
    repo, _, tag = spec.partition(":")
    if "/" not in spec:
        repo = "ai/" + repo
    return llama_cache_dir(env) / f"{repo.replace('/', '_')}_{tag or 'latest'}.gguf"


def _on_disk(kind: str, spec: str, path: Path) -> ModelSource:
    return ModelSource(kind, spec, str(path) if _existing(path) else None, str(path))


def resolve(cmd: CommandLine, env: Mapping[str, str]) -> ModelSource | None:
    """The model source llama.cpp will load, in its order (-hf over -dr over -mu over -m); None when no
    source is given at all (the only case the bundled model is used)."""

    def text(key: str) -> str | None:
        value = cmd.value(key)
        return value if isinstance(value, str) and value else None

    hf, docker, url, model = text("--hf-repo"), text("--docker-repo"), text("--model-url"), text("--model")
    if hf:
        mmproj = cmd.value("--mmproj-auto") is not False and not text("--mmproj") and not text("--mmproj-url")
        return resolve_hf(hf, text("--hf-file"), cmd.tool, env, mmproj=mmproj)
    if docker:
        return _on_disk("docker", docker, docker_file(docker, env))
    if url:
        return _on_disk("url", url, Path(model) if model else url_file(url, env))
    if model:
        return ModelSource("model", model, model, "-m")
    return None


# What llama.cpp requests for a model it has not downloaded yet (common/hf-cache.cpp, common/download.cpp):
# pure rules, so pipeline/remote_header.py asks the same server for the same file before llama.cpp does.
# compiled on their first use (re's own cache): a local model's plan never reads them
_REPO_ID = r"[A-Za-z0-9_]+(?:[/.-][A-Za-z0-9_]+)*"
_HF_TOKEN = r"hf_[A-Za-z0-9]{34,253}"  # noqa: S105 -- the shape of a token, not one
_COMMIT = r"[0-9a-fA-F]{40}"


def model_endpoint(env: Mapping[str, str]) -> str:
    """common_get_model_endpoint: MODEL_ENDPOINT, else HF_ENDPOINT, else huggingface.co; ends with '/'."""
    endpoint = env.get("MODEL_ENDPOINT") or env.get("HF_ENDPOINT") or "https://huggingface.co/"
    return endpoint if endpoint.endswith("/") else endpoint + "/"


def valid_repo_id(repo: str) -> bool:
    """hf_cache's is_valid_repo_id: [A-Za-z0-9_] runs joined by single / . -, exactly one '/'."""
    return len(repo) <= 256 and repo.count("/") == 1 and re.fullmatch(_REPO_ID, repo) is not None


def api_token(token: str | None) -> str | None:
    """The token llama.cpp sends to the HF API (is_valid_hf_token: 'hf_' and 34 to 253 letters or digits);
    the downloads themselves carry any non-empty token."""
    return token if token and re.fullmatch(_HF_TOKEN, token) else None


def commit_from_refs(refs: object) -> str | None:
    """get_repo_commit: the 'main' branch's targetCommit, else the first valid branch's."""
    if not isinstance(refs, dict) or not isinstance(refs.get("branches"), list):
        return None
    first = None
    for branch in refs["branches"]:
        if not isinstance(branch, dict):
            continue
        name, commit = branch.get("name"), branch.get("targetCommit")
        if not (isinstance(name, str) and isinstance(commit, str) and re.fullmatch(_COMMIT, commit)):
            continue
        if name == "main":
            return commit
        first = first or commit
    return first


def files_from_tree(tree: object) -> dict[str, int]:
    """get_repo_files: the repository's files (path -> size in bytes, 0 when not said), in the listing's order."""
    files: dict[str, int] = {}
    if not isinstance(tree, list):
        return files
    for item in tree:
        if not isinstance(item, dict) or item.get("type") != "file" or not isinstance(item.get("path"), str):
            continue
        path = item["path"]
        if path.startswith("/") or ".." in path.split("/"):
            continue  # is_valid_subpath
        lfs = item.get("lfs")
        size = lfs.get("size") if isinstance(lfs, dict) else item.get("size")
        files[path] = size if isinstance(size, int) and 0 <= size < 1 << 50 else 0
    return files


def first_part_url(url: str) -> str:
    """common_download_get_all_parts(url)[0]: a split model's first part, the one llama.cpp loads."""
    info = split_info(url)
    if info is None or info[3] <= 1:
        return url
    return f"{info[0]}-00001-of-{info[3]:05d}.gguf"


def docker_repo_tag(spec: str) -> tuple[str, str]:
    """common_docker_resolve_model: ('ai/<model>' when no '/', tag or 'latest')."""
    repo, _, tag = spec.partition(":")
    return (repo if "/" in spec else "ai/" + repo), (tag or "latest")


def docker_gguf_digest(manifest: object) -> str | None:
    """The manifest's first GGUF layer's digest (sha256:<64 hex>, lower-cased), as llama.cpp picks it."""
    layers = manifest.get("layers") if isinstance(manifest, dict) else None
    for layer in layers if isinstance(layers, list) else []:
        kind = layer.get("mediaType") if isinstance(layer, dict) else None
        if isinstance(kind, str) and "gguf" in kind:
            digest = layer.get("digest")
            if isinstance(digest, str) and re.fullmatch(r"sha256:[0-9a-fA-F]{64}", digest):
                return digest.lower()
            return None
    return None
