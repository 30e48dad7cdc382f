"""Tests for safe_llama/diagnosis/explain_words.py: explain's plain words (configs/explain.toml)."""

from __future__ import annotations

import pytest

from safe_llama.diagnosis.explain_words import fill, load_words, parse_words
from safe_llama.diagnosis.signatures import load_table
from safe_llama.errors import SafeLlamaError
from safe_llama.paths import packaged_configs

TABLE = load_table()
WORDS = load_words(packaged_configs() / "explain.toml")


def test_every_signature_has_plain_words() -> None:
    missing = [sig.id for sig in TABLE.signatures if "what" not in WORDS.signatures.get(sig.id, {})]
    assert missing == []


def test_fill_leaves_unknown_placeholders_as_written() -> None:
    assert fill("{tool} failed at {where}", {"tool": "llama-server"}) == "llama-server failed at {where}"


@pytest.mark.parametrize(
    ("text", "message"),
    [
        pytest.param("[signature\n", "explain.toml: ", id="not-toml"),
        pytest.param("signature = 1\n", "[signature] must be a table", id="not-a-table"),
        pytest.param("[signature.x]\nwhat = 1\n", "signature.x.what must be text", id="not-text"),
    ],
)
def test_bad_words_name_the_file_and_the_key(text: str, message: str) -> None:
    with pytest.raises(SafeLlamaError) as err:
        parse_words(text)
    assert message in err.value.message and int(err.value.status) == 66
