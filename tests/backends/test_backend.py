"""backends.backend: the protocol's few pieces of logic (a device's kind, a rule's key, which device names a
backend owns, when an environment cap applies) and the check of a user's [backends] entries."""

from __future__ import annotations

import pytest

from safe_llama.backends.backend import AllocRule, Backend, EnvCap, parse_alloc_rules
from safe_llama.errors import ExitStatus, SafeLlamaError

KINDS = Backend("kinds", default_kind="CPU")


@pytest.mark.parametrize(
    ("backend", "device", "kind"),
    [
        pytest.param(Backend("one"), "GPU.1", "", id="one-kind"),
        pytest.param(KINDS, None, "CPU", id="unnamed-is-the-default"),
        pytest.param(KINDS, "GPU.1", "GPU", id="numbered"),
        pytest.param(KINDS, "GPU.1.0", "GPU", id="a-tile"),
        pytest.param(KINDS, "NPU", "NPU", id="npu"),
        pytest.param(KINDS, "1", "CPU", id="no-kind-in-it"),
    ],
)
def test_kind(backend: Backend, device: str | None, kind: str) -> None:
    assert backend.kind(device) == kind


def test_rule_key_names_the_kind_when_there_is_one() -> None:
    assert (KINDS.rule_key("GPU"), Backend("cuda").rule_key("")) == ("kinds:GPU", "cuda")


def test_owns_by_prefix_or_whole_name() -> None:
    backend = Backend("x", prefixes=("Xy",), whole_names=("X",))
    assert [backend.owns(n) for n in ("Xy0", "X", "X0", "Z")] == [True, True, False, False]


@pytest.mark.parametrize(
    ("value", "applies"),
    [
        pytest.param(None, False, id="unset"),
        pytest.param("0", False, id="zero"),
        pytest.param("1", True, id="one"),
        pytest.param(" 2x", True, id="leading-digits"),
        pytest.param("yes", False, id="no-number"),
    ],
)
def test_env_cap_applies_to_a_number_other_than_zero(value: str | None, applies: bool) -> None:
    env = {} if value is None else {"CAP": value}
    assert EnvCap("CAP", 1, "why").applies(env) is applies


def test_parse_alloc_rules() -> None:
    rules = parse_alloc_rules({"x": {"vendor_ids": [1], "alloc_limit": "none", "why": "w"}}, "here")
    assert rules == {"x": AllocRule((1,), "none", "w")}


def test_a_rule_without_why_names_where_and_key() -> None:
    with pytest.raises(SafeLlamaError) as err:
        parse_alloc_rules({"x": {"alloc_limit": "none"}}, "here")
    assert err.value.status == ExitStatus.BAD_CONFIG and err.value.message.startswith("safe-llama: here: [x]: needs")
