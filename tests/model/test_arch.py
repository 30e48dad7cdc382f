"""model.arch: llama.cpp's memory layout per architecture, as a table. Checked for what the rest of model/
relies on: each architecture listed once, rules that are consistent with themselves, the entries the KV
estimate depends on, and (where the pinned source is installed) exactly llama.cpp's architecture names."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from safe_llama.model import arch
from safe_llama.model.arch import ARCHITECTURES, LLAMA_MAX_LAYERS, UNMODELLED, ArchRule, SwaRule
from safe_llama.paths import LLAMA_CPP_PINNED, system_prefix


def test_each_architecture_is_listed_once() -> None:
    groups = (arch._PLAIN, arch._NO_MEMORY, tuple(arch._SPECIAL))
    names = [name for group in groups for name in group]
    assert len(names) == len(set(names)) == len(ARCHITECTURES)
    assert not set(ARCHITECTURES) & set(UNMODELLED)


def test_plain_and_memoryless_architectures_get_the_base_rules() -> None:
    assert all(ARCHITECTURES[name] == ArchRule() for name in arch._PLAIN)
    assert all(ARCHITECTURES[name] == ArchRule(memory="none") for name in arch._NO_MEMORY)
    assert ARCHITECTURES["llama"] == ArchRule() and ARCHITECTURES["bert"].memory == "none"


@pytest.mark.parametrize("name", sorted(ARCHITECTURES))
def test_each_rule_is_consistent(name: str) -> None:
    rule = ARCHITECTURES[name]
    if rule.memory == "hybrid":
        assert rule.recurrent_layers, "a hybrid says which of its layers recur"
    else:
        assert not rule.recurrent_layers, "only a hybrid mixes recurrent and attending layers"
    if rule.memory in ("kv", "none"):
        assert rule.state == "ssm" and rule.recurrent_interval == 4, "no recurrent state to size"
    if rule.indexer:
        assert rule.mla, "the DSA indexer architectures all use latent attention"
    if rule.swa is not None and rule.swa.forced_window is not None:
        assert rule.swa.period is not None
    if rule.memory == "none":
        assert rule == ArchRule(memory="none")
    assert name == name.lower() and " " not in name


def test_the_rules_the_kv_estimate_leans_on() -> None:
    assert ARCHITECTURES["gemma3"].swa == SwaRule(period=6, when="window_positive")
    assert ARCHITECTURES["gemma2"].swa == SwaRule(period=2, default_window=4096)
    llama4 = ARCHITECTURES["llama4"].swa
    assert llama4 is not None and (llama4.swa_type, llama4.forced_window) == ("chunked", 8192)
    assert ARCHITECTURES["deepseek2"].mla and not ARCHITECTURES["llama"].mla
    assert (ARCHITECTURES["mamba"].memory, ARCHITECTURES["jamba"].memory) == ("recurrent", "hybrid")
    assert ARCHITECTURES["minimax-01"].recurrent_interval == 8
    assert ARCHITECTURES["qwen35"].recurrent_layers == "interval"


def test_unmodelled_architectures_say_which_way_they_err() -> None:
    assert UNMODELLED
    for name, entry in UNMODELLED.items():
        assert entry.direction in ("over", "under", "unknown") and entry.reason, name


def test_the_layer_cap_is_llama_cpps() -> None:
    assert LLAMA_MAX_LAYERS == 512  # src/llama-hparams.h


def _pinned_arch_source() -> Path | None:
    found = sorted((system_prefix({}) / "llama.cpp" / LLAMA_CPP_PINNED / "src").glob("*/llama.cpp/src/llama-arch.cpp"))
    return found[0] if found else None


@pytest.mark.skipif(_pinned_arch_source() is None, reason="the pinned llama.cpp source is not installed")
def test_the_table_names_every_architecture_of_the_pinned_llama_cpp() -> None:
    source = _pinned_arch_source()
    assert source is not None
    text = source.read_text()
    table = text[text.index("LLM_ARCH_NAMES = {") :]
    names = set(re.findall(r'\{ LLM_ARCH_\w+, *"([^"]+)"', table[: table.index("};")])) - {"(unknown)"}
    assert len(names) > 100
    assert sorted(names - set(ARCHITECTURES) - set(UNMODELLED)) == []  # one llama.cpp knows, the table does not
    assert sorted((set(ARCHITECTURES) | set(UNMODELLED)) - names) == []  # one the table invented
