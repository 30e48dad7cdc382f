"""The plain words explain says (configs/explain.toml): per signature, per failure category, per allocation
stage, and for the failures no signature decides; loading, checking, and filling their {placeholders}.
Owns the words only: must not read logs, decide what failed, or plan.
"""

from __future__ import annotations

import tomllib
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from safe_llama.errors import ExitStatus, SafeLlamaError


@dataclass(frozen=True)
class Words:
    """configs/explain.toml: plain words per signature, per category and for the unsigned cases."""

    signatures: Mapping[str, Mapping[str, str]]
    categories: Mapping[str, Mapping[str, str]]
    stages: Mapping[str, str]
    special: Mapping[str, Mapping[str, str]]  # abort, openvino-device-refused, unrecognised

    def for_signature(self, signature_id: str | None, category: str) -> Mapping[str, str]:
        own = self.signatures.get(signature_id or "", {})
        return {**self.categories.get(category, {}), **own}


def parse_words(text: str, where: str = "explain.toml") -> Words:
    try:
        raw = tomllib.loads(text)
    except tomllib.TOMLDecodeError as err:
        raise SafeLlamaError(f"safe-llama: {where}: {err}", ExitStatus.BAD_CONFIG) from None

    def table(value: Any, name: str) -> dict[str, Any]:
        if not isinstance(value, dict):
            raise SafeLlamaError(f"safe-llama: {where}: [{name}] must be a table", ExitStatus.BAD_CONFIG)
        return value

    def texts(value: Any, name: str) -> dict[str, str]:
        entries = table(value, name)
        bad = [k for k, v in entries.items() if not isinstance(v, str)]
        if bad:
            raise SafeLlamaError(f"safe-llama: {where}: {name}.{bad[0]} must be text", ExitStatus.BAD_CONFIG)
        return dict(entries)

    signatures = {k: texts(v, f"signature.{k}") for k, v in table(raw.get("signature", {}), "signature").items()}
    categories = {k: texts(v, f"category.{k}") for k, v in table(raw.get("category", {}), "category").items()}
    special = {k: texts(raw.get(k, {}), k) for k in ("abort", "openvino-device-refused", "unrecognised")}
    return Words(signatures, categories, texts(raw.get("stage", {}), "stage"), special)


def load_words(path: Path) -> Words:
    try:
        return parse_words(path.read_text(encoding="utf-8"), str(path))
    except OSError as err:
        raise SafeLlamaError(f"safe-llama: {path}: {err.strerror}", ExitStatus.BAD_CONFIG) from None


class _Fill(dict[str, str]):
    def __missing__(self, key: str) -> str:
        return "{" + key + "}"


def fill(text: str, values: Mapping[str, str]) -> str:
    return text.format_map(_Fill(values))
