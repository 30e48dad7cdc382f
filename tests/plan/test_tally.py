"""plan.tally: the one add() and llama.cpp's count of offloaded layers."""

from __future__ import annotations

import pytest

from safe_llama.plan.tally import Tally, add, offloaded_slots


def test_add_sums_per_place_and_item_in_first_seen_order() -> None:
    tally: Tally = {}
    add(tally, "CUDA0", "weights", 10)
    add(tally, "host", "kv", 3)
    add(tally, "CUDA0", "kv", 5)
    add(tally, "CUDA0", "weights", 7)
    assert tally == {"CUDA0": {"weights": 17, "kv": 5}, "host": {"kv": 3}}
    assert list(tally["CUDA0"]) == ["weights", "kv"]


def test_add_lists_nothing_for_zero_bytes() -> None:
    tally: Tally = {}
    add(tally, "CUDA0", "compute", 0)
    assert tally == {}


@pytest.mark.parametrize(
    ("ngl", "slots"),
    [
        pytest.param(None, 29, id="default-all-and-output"),
        pytest.param(-1, 29, id="negative-all"),
        pytest.param(0, 0, id="none"),
        pytest.param(1, 1, id="output-layer-only"),
        pytest.param(28, 28, id="all-but-first"),
        pytest.param(29, 29, id="all"),
        pytest.param(99, 29, id="model-card-99"),
    ],
)
def test_offloaded_slots_counts_as_llama_cpp(ngl: int | None, slots: int) -> None:
    assert offloaded_slots(ngl, 28) == slots
