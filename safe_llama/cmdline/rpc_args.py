"""The command line of llama.cpp's RPC worker (tools/rpc/rpc-server.cpp, built as ggml-rpc-server): where it
listens and what it serves. Its parser is its own (not common/arg.cpp): -H/--host, -p/--port (std::stoi),
-t/--threads, -d/--device, -c/--cache, -h/--help.

Owns that reading; must not judge the values (the worker itself refuses bad ones, and its message and exit
code reach the user unchanged)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import NamedTuple

from safe_llama.cmdline.llama_args import stoi

DEFAULT_HOST = "127.0.0.1"  # rpc_server_params in the pinned source
DEFAULT_PORT = 50052
_VALUED = {
    "-H": "host",
    "--host": "host",
    "-p": "port",
    "--port": "port",
    "-t": "threads",
    "--threads": "threads",
    "-d": "device",
    "--device": "device",
}


class RpcServerArgs(NamedTuple):
    host: str
    port: int | None  # None: a port the worker will refuse (it says so itself)
    devices: tuple[str, ...]
    help: bool


def parse_rpc_args(args: Sequence[str]) -> RpcServerArgs:
    """The listen address and devices as the worker reads them (the last of repeated options wins)."""
    values: dict[str, str] = {}
    wants_help = False
    i = 0
    while i < len(args):
        arg = args[i]
        if arg in ("-h", "--help"):
            wants_help = True
        elif arg in _VALUED and i + 1 < len(args):
            values[_VALUED[arg]] = args[i + 1]
            i += 1
        i += 1
    port: int | None = DEFAULT_PORT
    if "port" in values:
        try:
            port = stoi(values["port"])
        except ValueError:
            port = None
    devices = tuple(d for d in values.get("device", "").split(",") if d)
    return RpcServerArgs(values.get("host", DEFAULT_HOST), port, devices, wants_help)
