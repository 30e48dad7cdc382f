"""systemd's notify protocol with the standard library only: one datagram per message.

Owns NOTIFY_SOCKET handling (path and abstract '@' sockets) and the watchdog interval. With no
NOTIFY_SOCKET it makes no socket calls at all. Must stay light (os; socket only to send): the handed supervisor
(handed.py) tells systemd through it while llama-server runs.
"""

from __future__ import annotations

import os

from safe_llama.process.fork_exec import WRAPPER_ONLY_ENV

TYPE_CHECKING = False  # typing.TYPE_CHECKING without importing typing (mypy reads the name)
if TYPE_CHECKING:
    import socket
    from collections.abc import Mapping


class Notifier:
    def __init__(self, env: Mapping[str, str] = os.environ) -> None:
        address = env.get("NOTIFY_SOCKET", "")
        self._address: str | bytes | None = None
        if address.startswith("@"):
            self._address = b"\0" + address[1:].encode()
        elif address.startswith("/"):
            self._address = address
        self._sock: socket.socket | None = None
        usec = env.get("WATCHDOG_USEC", "")
        pid = env.get("WATCHDOG_PID", "")
        watchdog_ours = not pid or pid == str(os.getpid())
        self.watchdog_interval: float | None = (
            int(usec) / 2e6 if usec.isdigit() and int(usec) > 0 and watchdog_ours else None
        )

    @property
    def enabled(self) -> bool:
        return self._address is not None

    def send(self, **fields: str | int) -> bool:
        """Send KEY=value lines as one datagram; False when there is nowhere to send or it failed."""
        if self._address is None:
            return False
        message = "\n".join(f"{k.upper()}={v}" for k, v in fields.items()).encode()
        import socket  # only with a notify socket

        try:
            if self._sock is None:
                self._sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC)
            self._sock.sendto(message, self._address)
        except OSError:
            return False
        return True

    def ready(self, status: str) -> bool:
        return self.send(ready=1, status=status)

    def status(self, text: str) -> bool:
        return self.send(status=text.replace("\n", " "))

    def extend_timeout(self, seconds: float) -> bool:
        return self.send(extend_timeout_usec=int(seconds * 1e6))

    def watchdog(self) -> bool:
        return self.send(watchdog=1)

    def stopping(self) -> bool:
        return self.send(stopping=1)

    def close(self) -> None:
        if self._sock is not None:
            self._sock.close()
            self._sock = None


def child_env(env: Mapping[str, str]) -> dict[str, str]:
    """The child's environment: the notify socket and watchdog are the wrapper's, not llama.cpp's."""
    return {k: v for k, v in env.items() if k not in WRAPPER_ONLY_ENV}
