"""The CANN backend (ggml/src/ggml-cann, Huawei Ascend): safe-llama knows its devices' names, nothing of its limits.

Owns its description; must not probe."""

from __future__ import annotations

from safe_llama.backends.backend import Backend

BACKEND = Backend(name="cann", prefixes=("CANN",))
