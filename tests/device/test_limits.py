"""device.limits: device/'s vocabulary. Its one piece of logic is where a declared setting came from
(DeclaredLimits.origin); the rest is checked as the values other modules rely on."""

from __future__ import annotations

import dataclasses

import pytest

from safe_llama.device.limits import (
    INTEL,
    NOTHING_DECLARED,
    NVIDIA,
    DeclaredLimits,
    Sourced,
)


def test_a_setting_without_an_origin_is_its_option() -> None:
    assert NOTHING_DECLARED.origin("host_memory", "--host-memory") == "--host-memory"


def test_a_setting_from_elsewhere_names_that_place() -> None:
    declared = DeclaredLimits(
        host_memory_bytes=1, origins=(("host_memory", "SAFE_LLAMA_HOST_MEMORY"), ("max_alloc", "config.toml"))
    )
    assert declared.origin("host_memory", "--host-memory") == "SAFE_LLAMA_HOST_MEMORY"
    assert declared.origin("max_alloc", "--max-alloc") == "config.toml"
    assert declared.origin("device_memory", "--device-memory") == "--device-memory"


def test_nothing_declared_declares_nothing() -> None:
    assert DeclaredLimits() == NOTHING_DECLARED
    assert [
        f.name for f in dataclasses.fields(DeclaredLimits) if getattr(NOTHING_DECLARED, f.name) not in (None, ())
    ] == []


def test_sourced_values_compare_by_value_source_and_detail_and_stay_put() -> None:
    assert Sourced(1, "probed", "x") == Sourced(1, "probed", "x")
    assert Sourced(1, "probed", "x") != Sourced(1, "declared", "x")
    with pytest.raises(dataclasses.FrozenInstanceError):
        Sourced(1, "probed", "x").value = 2  # type: ignore[misc]


def test_vendor_ids_are_the_pci_ones() -> None:
    assert (INTEL, NVIDIA) == (0x8086, 0x10DE)
