"""Model facts cached by file identity, so a launch reads a small JSON instead of the GGUF header.

Owns the cache location and key; the reading itself is model_facts' job.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
from collections.abc import Mapping
from pathlib import Path

from safe_llama import state
from safe_llama.errors import ExitStatus, SafeLlamaError
from safe_llama.model.facts import ModelFacts, facts_from_json, facts_to_json, load_model_facts
from safe_llama.paths import cache_dir

FORMAT = 1


def facts_for(path: str | os.PathLike[str], env: Mapping[str, str] = os.environ) -> ModelFacts:
    model = Path(path)
    try:
        key = state.file_key(model)
    except FileNotFoundError:
        raise SafeLlamaError(f"safe-llama: {model}: model file not found", ExitStatus.BAD_MODEL) from None
    except OSError as err:
        raise SafeLlamaError(f"safe-llama: {model}: {err.strerror}", ExitStatus.BAD_MODEL) from None
    digest = hashlib.sha256(f"{FORMAT}|{key}".encode()).hexdigest()[:32]
    where = cache_dir(env) / "facts" / f"{digest}.json"
    cached = state.read_json(where)
    if isinstance(cached, dict):
        try:
            facts = facts_from_json(cached)
            if str(facts.path) == str(model):
                return facts
        except (KeyError, TypeError, ValueError):
            pass
    facts = load_model_facts(model)
    with contextlib.suppress(OSError):  # a read-only cache only costs speed
        state.write_json(where, facts_to_json(facts))
    return facts
