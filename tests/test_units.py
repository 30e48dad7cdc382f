"""units.py: byte counts for people (binary units, two decimals above bytes) and sizes parsed from text."""

from __future__ import annotations

import pytest

from safe_llama.units import human, parse_bytes


@pytest.mark.parametrize(
    ("n", "text"),
    [
        pytest.param(0, "0 B", id="zero"),
        pytest.param(1023, "1023 B", id="under-a-kib"),
        pytest.param(1024, "1.00 KiB", id="a-kib"),
        pytest.param(1536, "1.50 KiB", id="one-and-a-half"),
        pytest.param(4_294_959_104, "4.00 GiB", id="uhd770-max-alloc"),
        pytest.param(5 << 40, "5.00 TiB", id="tib"),
        pytest.param(3 << 50, "3072.00 TiB", id="above-tib-stays-tib"),
        pytest.param(-2048, "-2.00 KiB", id="negative"),
    ],
)
def test_human(n: int, text: str) -> None:
    assert human(n) == text


@pytest.mark.parametrize(
    ("text", "n"),
    [
        pytest.param("4294959104", 4_294_959_104, id="plain"),
        pytest.param("4G", 4 << 30, id="g"),
        pytest.param("4GiB", 4 << 30, id="gib"),
        pytest.param("4gb", 4 << 30, id="gb-is-binary"),
        pytest.param("512M", 512 << 20, id="m"),
        pytest.param(" 1.5g ", 3 << 29, id="fraction-and-spaces"),
        pytest.param("2t", 2 << 40, id="t"),
        pytest.param("10k", 10 << 10, id="k"),
        pytest.param("7b", 7, id="bytes"),
    ],
)
def test_parse_bytes(text: str, n: int) -> None:
    assert parse_bytes(text) == n


@pytest.mark.parametrize("text", ["", "G", "-1G", "4X", "4 G B", "1e9", "four"])
def test_parse_bytes_rejects_what_is_not_a_size(text: str) -> None:
    with pytest.raises(ValueError, match="is not a size"):
        parse_bytes(text)
