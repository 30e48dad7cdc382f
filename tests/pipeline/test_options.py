"""Tests for safe_llama/pipeline/options.py: safe-llama's own settings turned into a plan's and a launch's options
(the ladder checked, sizes and numbers read, the flags' defaults), the precedence option > SAFE_LLAMA_* >
config.toml as the options see it, and a bad value as one line with exit 2 (66 for a bad config file)."""

from __future__ import annotations

from pathlib import Path

import pytest

from safe_llama.cmdline import launch_args
from safe_llama.errors import ExitStatus, SafeLlamaError
from safe_llama.pipeline.options import launch_options, plan_options
from safe_llama.pipeline.prepare import DEFAULT_ATTEMPTS, LaunchOptions

GIB = 1 << 30


def usage(settings: dict[str, str], origins: dict[str, str] | None = None) -> str:
    """The one line a bad setting gives, checked to leave with the usage code."""
    with pytest.raises(SafeLlamaError) as err:
        launch_options(settings, origins)
    assert err.value.status is ExitStatus.USAGE and int(err.value.status) == 2 and "\n" not in err.value.message
    return err.value.message


def test_nothing_set_is_the_defaults() -> None:
    options = launch_options({})
    assert options == LaunchOptions()
    assert (options.predict, options.remember, options.attempts) == (True, True, DEFAULT_ATTEMPTS)
    assert options.plan.ladder is None and options.plan.declared.host_memory_bytes is None


def test_the_ladder_is_split_trimmed_and_checked() -> None:
    assert launch_options({"ladder": " ctx, kv-q8,,stateful "}).plan.ladder == ("ctx", "kv-q8", "stateful")
    message = usage({"ladder": "ctx,kv-q2,kv-q3"})
    assert message.startswith(
        "safe-llama: --ladder: unknown step 'kv-q2' (steps separated by commas, each one of stateful, weights, kv-q8"
    )


def test_every_plan_setting_reaches_the_plan_options() -> None:
    options = launch_options({
        "min_ctx": "2048", "max_alloc": "4G", "device_memory": "16G", "host_memory": "1.5g", "integrated": "1",
        "bin_dir": "/opt/llama/bin", "llama_version": "0.4.1-dev", "rpc_memory": "10.0.0.2:50052=12G",
        "profile": "intel-uhd-770",
    }).plan  # fmt: skip
    assert (options.min_ctx, options.llama_bin, options.llama_version) == (2048, "/opt/llama/bin", "0.4.1-dev")
    declared = options.declared
    assert (declared.max_alloc_bytes, declared.memory_bytes, declared.host_memory_bytes) == (4 * GIB, 16 * GIB,
                                                                                            3 * GIB // 2)  # fmt: skip
    assert declared.integrated is True and declared.profile == "intel-uhd-770"
    assert declared.rpc_memory == (("10.0.0.2:50052", 12 * GIB),)
    assert options.kv_split is None  # `plan --kv-split` only: a launch decides it


@pytest.mark.parametrize(
    ("settings", "expected"),
    [({"integrated": "1"}, True), ({"discrete": "1"}, False), ({"integrated": "1", "discrete": "1"}, False),
     ({"integrated": "0"}, None), ({}, None)],
)  # fmt: skip
def test_integrated_or_discrete(settings: dict[str, str], expected: bool | None) -> None:
    assert launch_options(settings).plan.declared.integrated is expected


@pytest.mark.parametrize(("value", "on"), [("0", False), ("false", False), ("No", False), ("OFF", False),
                                           ("1", True), ("yes", True), ("", True)])  # fmt: skip
def test_predict_and_remember_are_off_only_when_said_so(value: str, on: bool) -> None:
    options = launch_options({"predict": value, "remember": value})
    assert (options.predict, options.remember) == (on, on)


@pytest.mark.parametrize(("value", "expected"), [("0", None), ("-1", None), ("2", 2), (None, 4)])
def test_attempts_zero_is_an_error(value: str | None, expected: int | None) -> None:
    settings = {} if value is None else {"attempts": value}
    if expected is None:
        assert usage(settings) == f"safe-llama: --attempts: {value!r} is not a whole number from 1 to 100"
    else:
        assert launch_options(settings).attempts == expected


def test_a_context_floor_below_one_is_an_error() -> None:
    assert (
        usage({"min_ctx": "0"}) == "safe-llama: --min-ctx: '0' is not a whole number of tokens from 1 to 2,147,483,647"
    )
    assert launch_options({"min_ctx": "1"}).plan.min_ctx == 1


@pytest.mark.parametrize(
    ("value", "share"),
    [("0.5", 0.5), (".33", 0.33), ("1", 1.0), (" 0.01 ", 0.01), ("0", None), ("1.5", None), ("0.5x", None),
     ("nan", None), ("-0.5", None), ("1e-1", None), ("½", None), ("0." + "1" * 20, None)],
)  # fmt: skip
def test_a_share_is_a_plain_decimal_from_a_hundredth_to_one(value: str, share: float | None) -> None:
    if share is None:
        assert usage({"share": value}, {"share": "SAFE_LLAMA_SHARE"}) == (
            f"safe-llama: SAFE_LLAMA_SHARE: {value!r} is not a share from 0.01 to 1 (e.g. 0.5)"
        )
    else:
        assert launch_options({"share": value}).plan.share == share


def test_a_number_that_is_not_one_names_where_it_was_set() -> None:
    assert (
        usage({"min_ctx": "4k"})
        == "safe-llama: --min-ctx: '4k' is not a whole number of tokens from 1 to 2,147,483,647"
    )
    assert usage({"attempts": "2.5"}, {"attempts": "SAFE_LLAMA_ATTEMPTS"}) == (
        "safe-llama: SAFE_LLAMA_ATTEMPTS: '2.5' is not a whole number from 1 to 100"
    )


def test_a_bad_ladder_or_count_names_the_variable_it_came_from() -> None:
    assert usage({"ladder": "ctx,bogus"}, {"ladder": "SAFE_LLAMA_LADDER"}).startswith(
        "safe-llama: SAFE_LLAMA_LADDER: unknown step 'bogus' (steps separated by commas, each one of "
    )
    assert usage({"attempts": "0"}, {"attempts": "SAFE_LLAMA_ATTEMPTS"}) == (
        "safe-llama: SAFE_LLAMA_ATTEMPTS: '0' is not a whole number from 1 to 100"
    )
    assert (
        usage({"min_ctx": "0"}, {"min_ctx": "SAFE_LLAMA_MIN_CTX"})
        == "safe-llama: SAFE_LLAMA_MIN_CTX: '0' is not a whole number of tokens from 1 to 2,147,483,647"
    )


def test_a_bad_size_names_where_it_was_set() -> None:
    assert (
        usage({"max_alloc": "4X"})
        == "safe-llama: --max-alloc: '4X' is not a size from 1 byte to 1024T (e.g. 4294959104, 512M, 4G)"
    )
    assert usage({"host_memory": "0"}, {"host_memory": "SAFE_LLAMA_HOST_MEMORY"}) == (
        "safe-llama: SAFE_LLAMA_HOST_MEMORY: '0' is not a size from 1 byte to 1024T (e.g. 4294959104, 512M, 4G)"
    )
    assert usage({"rpc_memory": "10.0.0.2=1G"}).startswith("safe-llama: --rpc-memory: '10.0.0.2=1G' is not HOST:PORT")


def test_plan_options_takes_kv_split() -> None:
    options = plan_options(
        ladder="ctx", min_ctx=None, profile=None, max_alloc=None, device_memory=None, integrated=None,
        host_memory=None, llama_bin=None, llama_version=None, kv_split=True,
    )  # fmt: skip
    assert options.kv_split is True and options.ladder == ("ctx",)


# ---------------------------------------------------------------- precedence, through launch_args' resolution


@pytest.fixture
def home(tmp_path: Path) -> dict[str, str]:
    """An environment whose config folder holds a config.toml with a [launcher] table."""
    (tmp_path / "safe-llama").mkdir()
    (tmp_path / "safe-llama" / "config.toml").write_text(
        '[launcher]\nmin_ctx = 1024\nattempts = 2\nhost_memory = "2G"\nremember = false\n'
    )
    return {"XDG_CONFIG_HOME": str(tmp_path), "XDG_CACHE_HOME": str(tmp_path / "cache")}


def resolved(given: dict[str, str], env: dict[str, str]) -> LaunchOptions:
    return launch_options(*launch_args.resolve_sourced(given, env))


def test_option_over_variable_over_config_file(home: dict[str, str]) -> None:
    from_file = resolved({}, home)
    assert (from_file.plan.min_ctx, from_file.attempts, from_file.remember) == (1024, 2, False)
    assert from_file.plan.declared.host_memory_bytes == 2 * GIB
    variables = {**home, "SAFE_LLAMA_MIN_CTX": "2048", "SAFE_LLAMA_HOST_MEMORY": "3G", "SAFE_LLAMA_REMEMBER": ""}
    from_env = resolved({}, variables)
    assert (from_env.plan.min_ctx, from_env.plan.declared.host_memory_bytes) == (2048, 3 * GIB)
    assert from_env.remember is False and from_env.attempts == 2  # an empty variable is not set
    given = resolved({"min_ctx": "4096", "host_memory": "4G"}, variables)
    assert (given.plan.min_ctx, given.plan.declared.host_memory_bytes, given.attempts) == (4096, 4 * GIB, 2)


def test_a_bad_value_names_the_variable_or_the_config_file(home: dict[str, str]) -> None:
    with pytest.raises(SafeLlamaError) as err:
        resolved({}, {**home, "SAFE_LLAMA_MIN_CTX": "many"})
    assert (err.value.status, err.value.message) == (
        2,
        "safe-llama: SAFE_LLAMA_MIN_CTX: 'many' is not a whole number of tokens from 1 to 2,147,483,647",
    )
    config = Path(home["XDG_CONFIG_HOME"]) / "safe-llama" / "config.toml"
    config.write_text('[launcher]\nmax_alloc = "lots"\n')
    with pytest.raises(SafeLlamaError) as err:
        resolved({}, home)
    assert err.value.status == 2
    assert err.value.message == f"safe-llama: {config} [launcher] max_alloc: 'lots' is not a size from 1 byte to " \
        "1024T (e.g. 4294959104, 512M, 4G)"  # fmt: skip
    with pytest.raises(SafeLlamaError) as err:  # the option given over the file: the option is named
        resolved({"max_alloc": "more"}, home)
    assert err.value.message.startswith("safe-llama: --max-alloc: 'more' is not a size")


def test_a_config_value_of_the_wrong_type_is_a_config_error(home: dict[str, str]) -> None:
    config = Path(home["XDG_CONFIG_HOME"]) / "safe-llama" / "config.toml"
    config.write_text("[launcher]\nattempts = 0\n")
    with pytest.raises(SafeLlamaError) as err:
        resolved({}, home)
    assert err.value.status is ExitStatus.BAD_CONFIG and int(err.value.status) == 66
    assert err.value.message == f"safe-llama: {config}: [launcher] attempts: 0 is not a whole number of at least 1"
