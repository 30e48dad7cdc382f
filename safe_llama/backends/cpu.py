"""The CPU backend (ggml/src/ggml-cpu): the host itself, device "CPU".

Owns its description; must not probe the host (device/probe_host does)."""

from __future__ import annotations

from safe_llama.backends.backend import AllocRule, Backend

BACKEND = Backend(
    name="cpu",
    whole_names=("CPU",),
    log_marks=r"CPU buffer|ggml_aligned_malloc|ggml_backend_cpu",
    rules={"": AllocRule((), "none", "ggml's CPU buffers have no per-allocation cap")},
    host_kinds=frozenset({""}),
)
