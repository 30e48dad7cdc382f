"""The MUSA backend (Moore Threads: ggml/src/ggml-musa builds ggml-cuda with GGML_CUDA_NAME "MUSA").

Owns its description; must not probe."""

from __future__ import annotations

from safe_llama.backends.backend import AllocRule, Backend

BACKEND = Backend(
    name="musa",
    prefixes=("MUSA",),
    rules={"": AllocRule((0x1ED5,), "none", "ggml's MUSA buffers have no per-allocation cap")},
)
