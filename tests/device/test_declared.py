"""device.declared: the sizes a user declares (4G, 512M, 4294959104) read into DeclaredLimits; a bad one is a
one-line usage error naming where it was set (the option, SAFE_LLAMA_* or the config file)."""

from __future__ import annotations

from typing import Any

import pytest

from safe_llama.device.declared import declared_limits
from safe_llama.device.limits import NOTHING_DECLARED
from safe_llama.errors import ExitStatus, SafeLlamaError

MIB = 1 << 20
GIB = 1 << 30


def usage_error(**settings: Any) -> str:
    """The message of the usage error declared_limits raises for these settings."""
    with pytest.raises(SafeLlamaError) as err:
        declared_limits(**settings)
    assert err.value.status == ExitStatus.USAGE
    assert "\n" not in err.value.message
    return err.value.message


def test_nothing_declared() -> None:
    assert declared_limits() == NOTHING_DECLARED


def test_sizes_are_read_in_binary_units() -> None:
    declared = declared_limits(
        profile="intel-uhd-770", max_alloc="4294959104", device_memory="4G", host_memory="1.5g", integrated=True
    )
    assert declared.max_alloc_bytes == 4294959104
    assert declared.memory_bytes == 4 * GIB
    assert declared.host_memory_bytes == 3 * GIB // 2
    assert (declared.profile, declared.integrated) == ("intel-uhd-770", True)
    assert declared_limits(device_memory="512MiB").memory_bytes == 512 * MIB


@pytest.mark.parametrize(
    ("option", "setting"),
    [("--max-alloc", "max_alloc"), ("--device-memory", "device_memory"), ("--host-memory", "host_memory")],
)
def test_a_bad_size_names_its_option(option: str, setting: str) -> None:
    assert (
        usage_error(**{setting: "lots"})
        == f"safe-llama: {option}: 'lots' is not a size from 1 byte to 1024T (e.g. 4294959104, 512M, 4G)"
    )
    assert (
        usage_error(**{setting: "0"})
        == f"safe-llama: {option}: '0' is not a size from 1 byte to 1024T (e.g. 4294959104, 512M, 4G)"
    )
    assert usage_error(**{setting: "-1G"}).startswith(f"safe-llama: {option}: ")


def test_a_bad_size_names_where_it_was_set() -> None:
    with pytest.raises(SafeLlamaError) as err:
        declared_limits(host_memory="lots", origins={"host_memory": "SAFE_LLAMA_HOST_MEMORY"})
    assert err.value.message.startswith("safe-llama: SAFE_LLAMA_HOST_MEMORY: ")
    with pytest.raises(SafeLlamaError) as err:
        declared_limits(max_alloc="0", origins={"max_alloc": "config.toml max_alloc"})
    assert (
        err.value.message
        == "safe-llama: config.toml max_alloc: '0' is not a size from 1 byte to 1024T (e.g. 4294959104, 512M, 4G)"
    )


def test_origins_are_kept_for_the_report() -> None:
    declared = declared_limits(host_memory="8G", origins={"host_memory": "SAFE_LLAMA_HOST_MEMORY", "a": "b"})
    assert declared.origins == (("a", "b"), ("host_memory", "SAFE_LLAMA_HOST_MEMORY"))
    assert declared.origin("host_memory", "--host-memory") == "SAFE_LLAMA_HOST_MEMORY"
    assert declared.origin("max_alloc", "--max-alloc") == "--max-alloc"


def test_rpc_memory_is_read_per_worker() -> None:
    declared = declared_limits(rpc_memory="10.0.0.2:50052=12G, [::1]:50053=512M")
    assert declared.rpc_memory == (("10.0.0.2:50052", 12 << 30), ("[::1]:50053", 512 * MIB))
    assert declared_limits(rpc_memory="").rpc_memory == ()
    for bad in ("10.0.0.2:50052", "50052=1G", "=1G", "10.0.0.2:50052=lots", "10.0.0.2:50052=0"):
        assert "--rpc-memory" in usage_error(rpc_memory=bad)


def test_rpc_memory_says_its_form() -> None:
    assert usage_error(rpc_memory="a:1=1G,b=2G") == (
        "safe-llama: --rpc-memory: 'b=2G' is not HOST:PORT=SIZE (e.g. 10.0.0.2:50052=12G)"
    )
    assert usage_error(rpc_memory="w:1=x", origins={"rpc_memory": "SAFE_LLAMA_RPC_MEMORY"}).startswith(
        "safe-llama: SAFE_LLAMA_RPC_MEMORY: "
    )


def test_a_worker_named_twice_keeps_the_last_size() -> None:
    assert declared_limits(rpc_memory="w:1=1G,w:1=2G").rpc_memory == (("w:1", 2 * GIB),)
