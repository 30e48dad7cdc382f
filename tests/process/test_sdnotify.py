"""systemd's notify protocol: a datagram receiver stands in for systemd (path and abstract sockets)."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from safe_llama.process.sdnotify import Notifier, child_env
from tests.llama_run import free_port, healthy


class Receiver:
    """Collects every datagram; on READY=1 it records whether /health answered 200 at that moment."""

    def __init__(self, address: str, port: int | None = None) -> None:
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        self.sock.bind(b"\0" + address[1:].encode() if address.startswith("@") else address)
        self.sock.settimeout(0.2)
        self.address = address
        self.port = port
        self.messages: list[tuple[float, str]] = []
        self.health_at_ready: bool | None = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                data = self.sock.recv(4096).decode()
            except TimeoutError:
                continue
            except OSError:
                return
            if "READY=1" in data and self.port is not None:
                self.health_at_ready = healthy(self.port)
            self.messages.append((time.monotonic(), data))

    def names(self) -> list[str]:
        return [line.split("=", 1)[0] for _, data in self.messages for line in data.splitlines()]

    def close(self) -> None:
        self._stop.set()
        self._thread.join(2)
        self.sock.close()


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["path", "abstract"])
def test_one_datagram_per_message(tmp_path: Path, kind: str) -> None:
    address = str(tmp_path / "notify") if kind == "path" else f"@safe-llama-test-{os.getpid()}"
    rx = Receiver(address)
    try:
        n = Notifier({"NOTIFY_SOCKET": address, "WATCHDOG_USEC": "3000000"})
        assert n.enabled and n.watchdog_interval == 1.5
        assert n.ready("up") and n.status("two\nlines") and n.extend_timeout(2.5) and n.watchdog() and n.stopping()
        time.sleep(0.5)
        assert [d for _, d in rx.messages] == [
            "READY=1\nSTATUS=up", "STATUS=two lines", "EXTEND_TIMEOUT_USEC=2500000", "WATCHDOG=1", "STOPPING=1",
        ]  # fmt: skip
    finally:
        rx.close()


def test_no_socket_no_calls(monkeypatch: pytest.MonkeyPatch) -> None:
    def refuse(*args: object, **kwargs: object) -> None:
        raise AssertionError("a socket was created without NOTIFY_SOCKET")

    monkeypatch.setattr(socket, "socket", refuse)
    n = Notifier({})
    assert not n.enabled and n.watchdog_interval is None
    assert not n.ready("x") and not n.watchdog() and not n.stopping()


def test_watchdog_for_another_pid_is_not_ours() -> None:
    assert Notifier({"NOTIFY_SOCKET": "/x", "WATCHDOG_USEC": "1000", "WATCHDOG_PID": "1"}).watchdog_interval is None


def test_child_env_drops_notify_variables() -> None:
    env = {"NOTIFY_SOCKET": "/run/x", "WATCHDOG_USEC": "1", "WATCHDOG_PID": "2", "KEEP": "1"}
    assert child_env(env) == {"KEEP": "1"}


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["path", "abstract"])
def test_real_server_notify_sequence(
    tmp_path: Path, kind: str, llama_bin: Path, bundled_model: Path, clean_env: dict[str, str]
) -> None:
    port = free_port()
    address = str(tmp_path / "notify") if kind == "path" else f"@safe-llama-seq-{os.getpid()}"
    rx = Receiver(address, port)
    env = {
        **clean_env,
        "NOTIFY_SOCKET": address,
        "WATCHDOG_USEC": "1000000",
        "SAFE_LLAMA_BIN_DIR": str(llama_bin),
        "XDG_CACHE_HOME": str(tmp_path / "cache"),
    }
    proc = subprocess.Popen(
        [sys.executable, "-m", "safe_llama", "server", "-m", str(bundled_model), "-c", "4096", "--port", str(port)],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    try:
        deadline = time.monotonic() + 60
        while "READY" not in rx.names() and time.monotonic() < deadline:
            time.sleep(0.05)
        assert rx.health_at_ready is True, "READY=1 came before /health answered 200"
        time.sleep(2.2)
        pings = rx.names().count("WATCHDOG")
        assert pings >= 3
        # the child: NOTIFY_SOCKET is not in its environment
        child = int(subprocess.run(["pgrep", "-P", str(proc.pid)], capture_output=True, text=True).stdout.split()[0])
        environ = Path(f"/proc/{child}/environ").read_bytes().split(b"\0")
        assert not any(e.startswith((b"NOTIFY_SOCKET=", b"WATCHDOG_USEC=")) for e in environ)
        # a server that stops answering gets no more watchdog pings
        os.kill(child, signal.SIGSTOP)
        time.sleep(1.0)
        before = rx.names().count("WATCHDOG")
        time.sleep(2.5)
        assert rx.names().count("WATCHDOG") == before
        os.kill(child, signal.SIGCONT)
        time.sleep(1.5)
        assert rx.names().count("WATCHDOG") > before
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(30) == 0
        time.sleep(0.3)
    finally:
        if proc.poll() is None:
            proc.kill()
        rx.close()
    keys = rx.names()
    assert keys[0] == "STATUS" and keys[1] == "EXTEND_TIMEOUT_USEC"
    assert keys.index("READY") < keys.index("WATCHDOG")
    assert keys[-1] == "STOPPING"
    print("notify sequence:", " ".join(dict.fromkeys(keys)), f"({pings} watchdog pings in 2.2 s)")
