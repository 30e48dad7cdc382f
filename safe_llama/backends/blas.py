"""The BLAS backend (ggml/src/ggml-blas: matrix products on the host): safe-llama knows its devices' names,
nothing of its limits.

Owns its description; must not probe."""

from __future__ import annotations

from safe_llama.backends.backend import Backend

BACKEND = Backend(name="blas", prefixes=("BLAS",))
