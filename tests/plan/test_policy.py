"""plan.policy: loading configs/planner.toml with a user's [planner] table over it (tables merged key by key),
the per-backend lookups, and every bad value refused with one line naming the file and key that hold it."""

from __future__ import annotations

from fractions import Fraction
from pathlib import Path

import pytest

from safe_llama.errors import ExitStatus, SafeLlamaError
from safe_llama.paths import packaged_configs
from safe_llama.plan.policy import STEPS, Policy, load_policy

PACKAGED = packaged_configs() / "planner.toml"


@pytest.fixture(scope="module")
def policy() -> Policy:
    return load_policy(PACKAGED)


def _refused(path: Path, user: Path | None = None) -> str:
    """The one-line message load_policy refuses the files with (exit status BAD_CONFIG)."""
    with pytest.raises(SafeLlamaError) as caught:
        load_policy(path, user)
    assert caught.value.status == ExitStatus.BAD_CONFIG
    assert "\n" not in caught.value.message and caught.value.message.startswith("safe-llama: ")
    return caught.value.message


def _packaged_copy(tmp_path: Path, old: str, new: str) -> Path:
    """The packaged file with one line changed (or dropped), as another packaged policy."""
    text = PACKAGED.read_text()
    assert old in text
    path = tmp_path / "planner.toml"
    path.write_text(text.replace(old, new, 1))
    return path


def test_the_packaged_values(policy: Policy) -> None:
    assert policy.ctx_floor == 4096 and policy.skip_llama_fit is True
    assert policy.max_alloc_margin["vulkan"] == 64 << 20
    assert policy.compute.activation_bytes_per_embd == 8 and policy.compute.split_bytes_per_token == 4192
    assert policy.kv_f16_copy_backends == ("cuda", "hip")
    assert policy.cpu_repack_types == frozenset({"q4_0", "q4_k", "iq4_nl", "mxfp4"})
    assert policy.openvino_q8 is False and policy.pipeline_copies == 4
    assert set(s for steps in policy.ladder.values() for s in steps) <= set(STEPS)


def test_per_backend_falls_back_to_default(policy: Policy) -> None:
    assert policy.per_backend(policy.memory_margin_fraction, "vulkan") == 0.02
    assert policy.per_backend(policy.memory_margin_fraction, "metal") == 0.02
    assert policy.per_backend({"cuda": 1}, "metal") is None  # no default: nothing


def test_address_space_fixed_adds_the_server_loop(policy: Policy) -> None:
    base = policy.address_space_overhead["default"]
    assert policy.address_space_fixed("cpu", "completion") == base
    assert policy.address_space_fixed("cpu", "server") == base + policy.address_space_server_loop
    assert policy.address_space_fixed("openvino", "completion") == policy.address_space_overhead["openvino"]


def test_ladder_for_backend_tool_then_backend_then_default(tmp_path: Path) -> None:
    user = tmp_path / "config.toml"
    user.write_text('[planner.ladder]\n"cpu.server" = ["kv-q8"]\n')
    policy = load_policy(PACKAGED, user)
    assert policy.ladder_for("cpu", "server") == ("kv-q8",)
    assert policy.ladder_for("cpu", "cli") == ("ctx", "kv-q8", "kv-q4")
    assert policy.ladder_for("metal", "server") == ("weights", "kv-q8", "kv-q4", "ctx", "ngl")
    assert load_policy(PACKAGED).ladder_for("cpu", "server") == ("ctx", "kv-q8", "kv-q4")


def test_a_ladder_sub_table_is_a_backend_and_tool(tmp_path: Path) -> None:
    user = tmp_path / "config.toml"
    user.write_text('[planner.ladder.vulkan]\nserver = ["ctx"]\n')
    policy = load_policy(PACKAGED, user)
    assert policy.ladder["vulkan.server"] == ("ctx",)
    assert policy.ladder_for("vulkan", "server") == ("ctx",)


def test_a_users_table_is_merged_key_by_key(tmp_path: Path) -> None:
    user = tmp_path / "config.toml"
    user.write_text("[planner]\nctx_floor = 8192\n[planner.memory_margin_fraction]\ncuda = 0.1\n")
    policy = load_policy(PACKAGED, user)
    assert policy.ctx_floor == 8192
    assert policy.memory_margin_fraction == {"default": 0.02, "cuda": 0.1, "vulkan": 0.02}


def test_a_missing_user_config_is_the_packaged_policy(tmp_path: Path, policy: Policy) -> None:
    assert load_policy(PACKAGED, tmp_path / "absent.toml") == policy


def test_a_broken_user_config_is_named(tmp_path: Path) -> None:
    user = tmp_path / "config.toml"
    user.write_text("[planner\nctx_floor = 1\n")
    assert str(user) in _refused(PACKAGED, user)
    user.write_text("[planner]\nctx_floor = 8192\n")
    assert load_policy(PACKAGED, user).ctx_floor == 8192


def test_a_bad_user_planner_value_names_the_users_file_and_key(tmp_path: Path) -> None:
    user = tmp_path / "config.toml"
    user.write_text('[planner]\nctx_floor = "lots"\n')
    assert f'{user}: [planner] ctx_floor: "lots" is not a whole number of tokens from 1 to' in _refused(PACKAGED, user)
    user.write_text('[planner.ladder]\ncpu = ["ctx", "nope"]\n')
    assert f'{user}: [planner] ladder.cpu: ["ctx", "nope"] is not a list of steps, each one of' in _refused(
        PACKAGED, user
    )
    user.write_text('[planner.max_alloc_margin_bytes]\nvulkan = "big"\n')
    assert f'{user}: [planner] max_alloc_margin_bytes.vulkan: "big" is not a whole number of bytes' in _refused(
        PACKAGED, user
    )


def test_an_unknown_user_key_is_refused_with_the_known_ones(tmp_path: Path) -> None:
    user = tmp_path / "config.toml"
    user.write_text("[planner]\nctx_flor = 8192\n")
    message = _refused(PACKAGED, user)
    assert message.startswith(f"safe-llama: {user}: [planner] ctx_flor: unknown key (known: ")
    assert "ctx_floor" in message


def test_a_planner_that_is_not_a_table_is_refused(tmp_path: Path) -> None:
    user = tmp_path / "config.toml"
    user.write_text("planner = 3\n")
    assert _refused(PACKAGED, user) == f"safe-llama: {user}: [planner] must be a table"


def test_a_bad_packaged_value_names_the_packaged_file(tmp_path: Path) -> None:
    path = _packaged_copy(tmp_path, "ctx_floor = 4096", 'ctx_floor = "x"')
    assert _refused(path).startswith(f'safe-llama: {path}: ctx_floor: "x" is not a whole number')
    path = _packaged_copy(tmp_path, 'cpu = ["ctx", "kv-q8", "kv-q4"]', 'cpu = ["ctx", "later"]')
    user = tmp_path / "config.toml"
    user.write_text('[planner.ladder]\ncuda = ["ctx"]\n')  # the user's ladder table holds no cpu key
    assert f'{path}: ladder.cpu: ["ctx", "later"] is not a list of steps' in _refused(path, user)


def test_a_missing_required_key_is_named(tmp_path: Path) -> None:
    path = _packaged_copy(tmp_path, "ctx_floor = 4096\n", "")
    assert _refused(path) == f"safe-llama: {path}: ctx_floor: missing"


def test_optional_keys_take_their_defaults(tmp_path: Path) -> None:
    path = _packaged_copy(tmp_path, "pipeline_copies = 4\n", "")
    assert load_policy(path).pipeline_copies == 1


@pytest.mark.parametrize(
    ("value", "accepted"),
    [
        pytest.param("0.5", True, id="a-half"),
        pytest.param("1", False, id="all-of-it"),
        pytest.param("0", False, id="nothing"),
        pytest.param('"3/4"', False, id="text"),
        pytest.param("true", False, id="a-bool"),
    ],
)
def test_failed_alloc_share_is_a_share(tmp_path: Path, value: str, accepted: bool) -> None:
    user = tmp_path / "config.toml"
    user.write_text(f"[planner]\nfailed_alloc_share = {value}\n")
    if accepted:
        assert load_policy(PACKAGED, user).failed_alloc_share == Fraction(1, 2)
        return
    assert f"{user}: [planner] failed_alloc_share: {value} is not a number more than 0 and less than 1" in _refused(
        PACKAGED, user
    )


def test_the_packaged_failed_alloc_share_is_exact(policy: Policy) -> None:
    assert policy.failed_alloc_share == Fraction(3, 4)
