"""Where GGUF models are kept on this machine, and which files make one model: the Hugging Face hub cache, llama.cpp's
own cache, LM Studio's models folders, Ollama's store (its manifests name the blobs), and folders given.

Owns the stores' folder layouts (models--org--repo/snapshots/<rev>/ symlinks to blobs; publisher/repo/ folders;
manifests/<host>/<namespace>/<model>/<tag> naming sha256-<hex> blobs), grouping split files into one model and
pairing an mmproj with its model; must not read a model's header (model_index does) nor plan. Bounded: at most
MAX_FILES files a scan and MAX_DEPTH folders deep; symlinked folders are not followed (a loop), symlinked files are.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from safe_llama.cmdline.model_source import best_mmproj, hf_cache_dir, llama_cache_dir, split_info

MAX_FILES = 20_000  # GGUF files one scan looks at
MAX_DEPTH = 8  # folders below a store's root
MAX_MANIFEST = 1 << 20  # bytes of one Ollama manifest
GGUF_MAGIC = b"GGUF"
OLLAMA_MODEL = "application/vnd.ollama.image.model"
OLLAMA_PROJECTOR = "application/vnd.ollama.image.projector"
OLLAMA_LIBRARY = "registry.ollama.ai/library/"


@dataclass(frozen=True)
class Found:
    """One model as a launch would load it: its first file, every part, the projector beside it."""

    name: str  # how its store names it (org/repo/file, an Ollama model:tag, the path)
    store: str  # "hf" | "llama.cpp" | "lm-studio" | "ollama" | "given"
    path: str  # the file llama.cpp opens (the first part of a split model)
    parts: tuple[str, ...]  # every file of the model, the first one first
    mmproj: str | None = None  # the projector shown with it
    mmproj_loaded: bool = False  # a launch loads the projector too (-hf does; -m does not)
    problem: str | None = None  # why it cannot be a model (not GGUF, a part missing): shown, not planned


@dataclass(frozen=True)
class Store:
    kind: str
    root: Path


def stores(env: Mapping[str, str]) -> tuple[Store, ...]:
    """Every place a tool keeps GGUFs by default or as the environment says, each once."""
    home = Path(env.get("HOME") or Path.home())
    hub = [hf_cache_dir(env)]  # the pinned llama.cpp's (LLAMA_CACHE first)
    if env.get("HF_HUB_CACHE"):
        hub.append(Path(env["HF_HUB_CACHE"]))
    elif env.get("HF_HOME"):
        hub.append(Path(env["HF_HOME"]) / "hub")
    hub.append(Path(env.get("XDG_CACHE_HOME") or home / ".cache") / "huggingface" / "hub")
    found = [Store("hf", p) for p in hub]
    found.append(Store("llama.cpp", llama_cache_dir(env)))
    found += [
        Store("lm-studio", home / ".lmstudio" / "models"),
        Store("lm-studio", home / ".cache" / "lm-studio" / "models"),
    ]
    ollama = [Path(env["OLLAMA_MODELS"])] if env.get("OLLAMA_MODELS") else []
    ollama += [home / ".ollama" / "models", Path("/usr/share/ollama/.ollama/models")]
    found += [Store("ollama", p) for p in ollama]
    seen: set[str] = set()
    out = []
    for store in found:
        key = f"{store.kind}:{os.path.abspath(store.root)}"
        if key not in seen and store.root.is_dir():
            seen.add(key)
            out.append(store)
    return tuple(out)


def _ggufs(root: Path, budget: list[int]) -> Iterator[str]:
    """Every *.gguf under root (root itself when it is a file), depth-first in name order; symlinked folders
    are not entered."""
    stack: list[tuple[str, int]] = [(str(root), 0)]
    while stack and budget[0] > 0:
        folder, depth = stack.pop()
        try:
            with os.scandir(folder) as it:
                entries = sorted(it, key=lambda e: e.name)
        except OSError:
            continue
        below = []
        for entry in entries:
            try:
                if entry.is_dir(follow_symlinks=False):
                    if depth < MAX_DEPTH and not entry.name.startswith("."):
                        below.append((entry.path, depth + 1))
                elif entry.name.lower().endswith(".gguf") and entry.is_file():
                    budget[0] -= 1
                    if budget[0] < 0:
                        return
                    yield entry.path
            except OSError:
                continue
        stack.extend(reversed(below))


def _group(files: Sequence[str], store: str, name_of: Mapping[str, str], loads_mmproj: bool) -> list[Found]:
    """Split parts as one model (named by its first part), each projector with the model of its folder."""
    models: dict[str, list[tuple[int, str]]] = {}
    counts: dict[str, int] = {}
    projectors = [f for f in files if "mmproj" in os.path.basename(f).lower()]
    for path in files:
        if path in projectors:
            continue
        info = split_info(path)
        prefix, _, index, count = info if info is not None else (path, "", 1, 1)
        key = prefix if count > 1 else path
        models.setdefault(key, []).append((index, path))
        counts[key] = count
    out = []
    for key, parts in models.items():
        parts.sort()
        paths = tuple(p for _, p in parts)
        first = paths[0]
        problem = None
        if [i for i, _ in parts] != list(range(1, counts[key] + 1)):
            have = ", ".join(str(i) for i, _ in parts)
            problem = f"split into {counts[key]} files, {len(parts)} here (parts {have})"
        folder = os.path.dirname(first)
        mmproj = best_mmproj([p for p in projectors if os.path.dirname(p) == folder], first)
        out.append(
            Found(name_of.get(first, first), store, first, paths, mmproj, loads_mmproj and mmproj is not None, problem)
        )
    claimed = {f.mmproj for f in out}
    out += [Found(name_of.get(p, p), store, p, (p,), problem="a projector (mmproj) with no model beside it")
            for p in projectors if p not in claimed]  # fmt: skip
    return out


def _hf(root: Path, budget: list[int]) -> list[Found]:
    """models--org--repo/snapshots/<rev>/...: the revision refs/main names (every one when there is none)."""
    out: list[Found] = []
    for repo in sorted(root.glob("models--*")):
        name = repo.name.removeprefix("models--").replace("--", "/")
        try:
            with open(repo / "refs" / "main", "rb") as f:
                main = f.read(100).decode(errors="replace").strip()  # a commit hash: 40 characters
        except OSError:
            main = ""
        main = main if main.isalnum() else ""
        snaps = [repo / "snapshots" / main] if main and (repo / "snapshots" / main).is_dir() else []
        snaps = snaps or sorted(p for p in (repo / "snapshots").glob("*") if p.is_dir())
        for snap in snaps:
            files = list(_ggufs(snap, budget))
            names = {f: f"{name}/{os.path.relpath(f, snap)}" for f in files}
            out += _group(files, "hf", names, loads_mmproj=True)
    return out


def _folders(store: str, root: Path, budget: list[int]) -> list[Found]:
    """A folder of GGUFs (LM Studio's publisher/repo/, llama.cpp's cache, one given): named by the path below
    the root."""
    files = list(_ggufs(root, budget))
    by_folder: dict[str, list[str]] = {}
    for f in files:
        by_folder.setdefault(os.path.dirname(f), []).append(f)
    names = {f: (os.path.relpath(f, root) if store != "given" else f) for f in files}
    return [m for group in by_folder.values() for m in _group(group, store, names, loads_mmproj=False)]


def _manifest_layers(path: Path) -> list[tuple[str, str]] | None:
    """(mediaType, digest) of an Ollama manifest's layers; None when it is not one."""
    try:
        with open(path, "rb") as f:
            text = f.read(MAX_MANIFEST + 1)
        data = json.loads(text) if len(text) <= MAX_MANIFEST else None
    except (OSError, ValueError):
        return None
    layers = data.get("layers") if isinstance(data, dict) else None
    if not isinstance(layers, list):
        return None
    return [
        (str(layer["mediaType"]), str(layer["digest"]))
        for layer in layers
        if isinstance(layer, dict) and isinstance(layer.get("mediaType"), str) and isinstance(layer.get("digest"), str)
    ]


def _blob(root: Path, digest: str) -> str | None:
    algo, _, hexes = digest.partition(":")
    if algo != "sha256" or len(hexes) != 64 or any(c not in "0123456789abcdef" for c in hexes):
        return None
    return str(root / "blobs" / f"sha256-{hexes}")


def _ollama(root: Path, budget: list[int]) -> list[Found]:
    """manifests/<host>/<namespace>/<model>/<tag>: each names its model blob and projector blob by digest."""
    out: list[Found] = []
    manifests = root / "manifests"
    for path in sorted(p for p in manifests.rglob("*") if p.is_file() and not p.is_symlink()):
        if budget[0] <= 0:
            break
        budget[0] -= 1
        where = path.relative_to(manifests).as_posix()
        if where.count("/") != 3:
            continue
        model_tag = where.removeprefix(OLLAMA_LIBRARY)
        name = ":".join(model_tag.rsplit("/", 1))
        layers = _manifest_layers(path)
        if layers is None:
            out.append(Found(name, "ollama", str(path), (str(path),), problem="not an Ollama manifest"))
            continue
        model = next((_blob(root, d) for t, d in layers if t == OLLAMA_MODEL), None)
        projector = next((_blob(root, d) for t, d in layers if t == OLLAMA_PROJECTOR), None)
        if model is None:
            out.append(Found(name, "ollama", str(path), (str(path),), problem="its manifest names no model blob"))
            continue
        problem = None if os.path.isfile(model) else f"its model blob {os.path.basename(model)} is missing"
        out.append(Found(name, "ollama", model, (model,), projector, projector is not None, problem))
    return out


def scan(paths: Sequence[str], env: Mapping[str, str], *, defaults: bool = True) -> list[Found]:
    """Every model in the stores (when `defaults`) and under `paths`, each file once (the first place that
    names it wins: the stores, then the paths given)."""
    budget = [MAX_FILES]
    found: list[Found] = []
    for store in stores(env) if defaults else ():
        if store.kind == "hf":
            found += _hf(store.root, budget)
        elif store.kind == "ollama":
            found += _ollama(store.root, budget)
        else:
            found += _folders(store.kind, store.root, budget)
    for given in paths:
        if os.path.isfile(given):
            found.append(Found(given, "given", given, (given,)))
        elif os.path.isdir(given):
            found += _folders("given", Path(given), budget)
        else:
            found.append(Found(given, "given", given, (given,), problem="no such file or folder"))
    seen: set[str] = set()
    out = []
    for model in found:
        real = os.path.realpath(model.path)
        if real not in seen:
            seen.add(real)
            out.append(model)
    return out
