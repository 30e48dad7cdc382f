"""The head's view of RPC workers: which answers, which stopped, waiting for one to come back."""

from __future__ import annotations

import socket
import threading
import time

import pytest

from safe_llama.device.limits import Sourced
from safe_llama.plan.target import RemoteDevice
from safe_llama.process.workers import answering, endpoint_of, lost_worker, wait_back
from tests.llama_run import free_port

MIB = 1 << 20


def _remote(name: str, port: int) -> RemoteDevice:
    return RemoteDevice(name, f"127.0.0.1:{port}", 0, Sourced(100 * MIB, "declared", "test"))


def test_answering_is_a_real_connect() -> None:
    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen()
        port = server.getsockname()[1]
        assert answering(f"127.0.0.1:{port}")
    assert not answering(f"127.0.0.1:{port}")
    assert not answering("no-port-here")


def test_the_worker_that_stopped_is_named() -> None:
    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen()
        up = _remote("RPC0", server.getsockname()[1])
        down = _remote("RPC1", free_port())
        fullest = {"RPC0": 0.9, "RPC1": 0.5}
        assert lost_worker([up, down], lambda r: fullest[r.name]) == (down, True)
        # all answer again (restarted at once): the fullest, and the answer says it is inferred
        assert lost_worker([up], lambda r: fullest[r.name]) == (up, False)
    assert lost_worker([], lambda r: 0.0) is None


@pytest.mark.slow
def test_wait_back_is_bounded_and_sees_a_restart() -> None:
    port = free_port()
    started = time.monotonic()
    assert not wait_back(f"127.0.0.1:{port}", 0.3, step=0.05)
    assert time.monotonic() - started < 2
    server = socket.socket()

    def come_back() -> None:
        time.sleep(0.3)
        server.bind(("127.0.0.1", port))
        server.listen()

    thread = threading.Thread(target=come_back)
    thread.start()
    try:
        assert wait_back(f"127.0.0.1:{port}", 10, step=0.05)
    finally:
        thread.join()
        server.close()


def test_a_buffer_name_says_which_worker_refused() -> None:
    assert endpoint_of("RPC0[127.0.0.1:50121]") == "127.0.0.1:50121"
    assert endpoint_of("RPC1[[::1]:50052]") == "[::1]:50052"
    assert endpoint_of("CUDA0") is None and endpoint_of(None) is None
