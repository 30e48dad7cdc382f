"""RPC workers seen from the head: whether each `--rpc host:port` answers, which one stopped during a start,
and waiting (bounded) for one to come back, as systemd's Restart= brings a worker back.

Owns those TCP connects (nothing is sent: rpc-server logs a connection and closes it). Must not plan nor
decide the retry: launch.py does, with retry.worker_cap.
"""

from __future__ import annotations

import re
import socket
import time
from collections.abc import Callable, Sequence

from safe_llama.plan.target import RemoteDevice

_RPC_BUFFER = re.compile(r"^RPC\d*\[(?P<endpoint>.+)\]$")


def endpoint_of(buffer: str | None) -> str | None:
    """The worker a buffer type names ("RPC0[10.0.0.2:50052]": a worker refused an allocation), else None."""
    found = _RPC_BUFFER.match(buffer or "")
    return found.group("endpoint") if found else None


def answering(endpoint: str, timeout: float = 0.5) -> bool:
    """Whether host:port accepts a TCP connection now."""
    host, _, port = endpoint.rpartition(":")
    try:
        with socket.create_connection((host.strip("[]"), int(port)), timeout=timeout):
            return True
    except (OSError, ValueError):
        return False


def lost_worker(
    remote: Sequence[RemoteDevice], planned: Callable[[RemoteDevice], float], check: Callable[[str], bool] = answering
) -> tuple[RemoteDevice, bool] | None:
    """The worker that stopped: one that no longer answers (True: seen gone); when all answer again (one
    restarted at once), the one the plan filled most (`planned`: its share of its memory; False: inferred)."""
    if not remote:
        return None
    gone = [r for r in remote if not check(r.endpoint)]
    if gone:
        return max(gone, key=planned), True
    return max(remote, key=planned), False


def wait_back(endpoint: str, seconds: float, check: Callable[[str], bool] = answering, step: float = 0.2) -> bool:
    """Whether the worker answers within `seconds`."""
    deadline = time.monotonic() + seconds
    while True:
        if check(endpoint):
            return True
        if time.monotonic() >= deadline:
            return False
        time.sleep(step)
