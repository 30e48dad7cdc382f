"""The environment read other than by name: the variables of some prefixes (llama.cpp's LLAMA_ARG_*, the
backends' GGML_*, ...), or all of it handed to a child process (a probe whose answer is cached under a key
made of such a prefix scan).

Owns those two reads, so that an environment that notes what a launch reads (run.fast_record's) is told
which kind of read it is; must not decide which prefixes matter (the callers do).
"""

from __future__ import annotations

from collections.abc import Mapping


def prefixed(env: Mapping[str, str], prefixes: tuple[str, ...]) -> dict[str, str]:
    """The variables whose names start with one of prefixes."""
    scan = getattr(env, "prefixed", None)
    if callable(scan):
        found: dict[str, str] = scan(prefixes)
        return found
    return {k: v for k, v in env.items() if k.startswith(prefixes)}


def whole(env: Mapping[str, str]) -> dict[str, str]:
    """All of it, for a child process whose answer the caller keys by prefixed() (not a read of each value)."""
    everything = getattr(env, "whole", None)
    if callable(everything):
        found: dict[str, str] = everything()
        return found
    return dict(env)
