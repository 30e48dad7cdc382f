"""The RPC worker's own command line, as tools/rpc/rpc-server.cpp reads it."""

from __future__ import annotations

from safe_llama.cmdline.rpc_args import DEFAULT_HOST, DEFAULT_PORT, parse_rpc_args


def test_defaults_and_spellings() -> None:
    assert parse_rpc_args([]) == (DEFAULT_HOST, DEFAULT_PORT, (), False)
    parsed = parse_rpc_args(["-H", "10.0.0.2", "--port", "6000", "-d", "CUDA0,CPU", "-t", "4", "-c"])
    assert parsed == ("10.0.0.2", 6000, ("CUDA0", "CPU"), False)
    assert parse_rpc_args(["--host", "10.1.2.3", "-p", "1", "-p", "2"]).port == 2  # the last one wins
    assert parse_rpc_args(["-p", "7000x"]).port == 7000  # std::stoi
    assert parse_rpc_args(["-p", "x"]).port is None  # the worker refuses it itself
    assert parse_rpc_args(["--help"]).help
