"""Human units for byte counts and their parsing (8G, 512MiB, 4294959104). Pure."""

from __future__ import annotations

import re

_UNITS = {"": 1, "b": 1, "k": 1 << 10, "m": 1 << 20, "g": 1 << 30, "t": 1 << 40}


def human(n: int | float) -> str:
    value = float(n)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(value) < 1024 or unit == "TiB":
            return f"{value:.0f} {unit}" if unit == "B" else f"{value:.2f} {unit}"
        value /= 1024
    raise AssertionError("unreachable")


def parse_bytes(text: str) -> int:
    """'4294959104', '4G', '4GiB', '512M', '1.5g' -> bytes (binary units)."""
    m = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([kmgt]?)(?:i?b)?\s*", text.lower())
    if m is None:
        raise ValueError(f"'{text}' is not a size (e.g. 4294959104, 512M, 4G)")
    return int(float(m.group(1)) * _UNITS[m.group(2)])
