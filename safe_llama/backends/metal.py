"""The Metal backend (ggml/src/ggml-metal): devices MTL0, ...

Owns its description; must not probe."""

from __future__ import annotations

from safe_llama.backends.backend import AllocRule, Backend

BACKEND = Backend(
    name="metal",
    prefixes=("MTL",),
    log_marks=r"\bMTL\d|ggml_metal",
    gpu_marks=r"\bMTL\d",
    rules={"": AllocRule((), "unprobed", "Metal's maxBufferLength is not probed")},
)
