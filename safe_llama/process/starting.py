"""The handed supervisor's start-up watch: a llama-server whose supervision was handed off as it started
(attempts/at_spawn.py, under a cgroup limit: the full supervisor is charged nothing while the server fills its
context) is watched here until it is ready, as the full supervisor would (readiness.HealthProbe's rule: /health
answers 200, then the task loop answers /slots, or the server has lived SERVE_SETTLE seconds since), systemd's start
timeout pushed out meanwhile; then the ready actions the full supervisor prepared (each a file put in place) and
systemd's READY=1, and from there the watchdog as handed.Watched feeds it. What the child wrote while it started is
kept (its last CAPTURE bytes per stream) for the full safe-llama that a failed start goes back to (attempts/resume.py).

Owns that start-up loop and the capture; must stay light (os, time; health, handed's Watched): it runs while
llama-server starts. Must not judge how a start ended (the resumed full safe-llama does, from the capture).
"""

from __future__ import annotations

import os
import time

from safe_llama.process import health
from safe_llama.process.handed import Watched

TYPE_CHECKING = False  # typing.TYPE_CHECKING without importing typing (mypy reads the name)
if TYPE_CHECKING:
    from collections.abc import Sequence

    from safe_llama.process.channels import Child
    from safe_llama.process.health import Health
    from safe_llama.process.relay import Relay
    from safe_llama.process.sdnotify import Notifier

CAPTURE = 1 << 18  # bytes of each stream's start-up output kept (its end: where a failure is said)
# seconds between questions while the server starts, as readiness.HealthProbe's: /slots is asked no sooner than this
# after /health first answered 200 (a server just above RLIMIT_AS can answer its first task, then abort creating a
# thread: tests/attempts/test_launch.py's sliver)
CHECK_EVERY = 0.2
SERVE_SETTLE = 1.0  # as readiness.SERVE_SETTLE: a server whose /slots cannot answer serves this long after loading
EXTEND_TIMEOUT = 30.0  # as attempts/attempt.py: systemd's start timeout pushed out by this, every EXTEND_EVERY
EXTEND_EVERY = 10.0
MODEL_LOADED = b": model loaded\n"  # the end of `srv  llama_server: model loaded`
AT_READY = ".at-ready"  # a ready action: the file FINAL + AT_READY is renamed to FINAL once the server is ready


class Starting(Watched):
    """Watched (relaying, forwarding, the watchdog once ready), ready only once llama-server serves."""

    def __init__(
        self,
        child: Child,
        kill_after: float,
        notifier: Notifier,
        address: Health,
        status: str,
        at_ready: Sequence[str],
    ) -> None:
        super().__init__(child, kill_after, notifier, address)
        self.watchdog_every = self.interval
        self.interval = None  # no watchdog before ready
        self.status = status
        self.at_ready = list(at_ready)
        self.ready = False
        self.loaded_at: float | None = None
        now = time.monotonic()
        self.next_start_check = now
        self.next_extend = now + EXTEND_EVERY
        self.start_check: health.Check | None = None
        self.captured: dict[str, bytearray] = {}
        self.slots = health.Health(address.path.removesuffix("/health") + "/slots", address.unix_socket,
                                   address.host, address.port)  # fmt: skip

    def seen(self, relay: Relay, data: bytes, now: float) -> None:
        if self.ready or relay.stream is None:
            return
        kept = self.captured.setdefault(relay.stream.value, bytearray())
        before = len(kept)
        kept += data
        # llama-server's own word that /health answers 200 (readiness._MODEL_LOADED): /slots at the next check
        if self.loaded_at is None and MODEL_LOADED in kept[max(0, before - len(MODEL_LOADED)) :]:
            self.loaded_at = now
        del kept[:-CAPTURE]

    def extra_fds(self) -> dict[int, int]:
        if self.ready:
            return super().extra_fds()
        if self.start_check is None or self.start_check.sock is None:
            return {}
        return {self.start_check.sock.fileno(): self.start_check.mask()}

    def on_event(self, fd: int, mask: int) -> None:
        if self.ready:
            super().on_event(fd, mask)
        elif self.start_check is not None:
            self.start_check.event(time.monotonic())

    def deadlines(self, now: float) -> list[float]:
        if self.ready:
            return super().deadlines(now)
        if self.returncode is not None:
            return []
        check = self.next_start_check if self.start_check is None else self.start_check.deadline
        return [check, self.next_extend]

    def timers(self, now: float) -> None:
        super().timers(now)  # Watched's: its watchdog is off (interval None) until ready
        if self.ready or self.returncode is not None:
            return
        if now >= self.next_extend:
            self.notifier.extend_timeout(EXTEND_TIMEOUT)
            self.next_extend = now + EXTEND_EVERY
        if self.start_check is None and now >= self.next_start_check:
            loaded = self.loaded_at is not None
            asked = self.slots if loaded else self.address
            assert asked is not None
            self.start_check = health.Check(asked, now, health.TIMEOUT)
        if self.start_check is not None and not self.start_check.done and now >= self.start_check.deadline:
            self.start_check.finish()
        if self.start_check is not None and self.start_check.done:
            status, self.start_check = self.start_check.status, None
            self.next_start_check = time.monotonic() + CHECK_EVERY
            if self.loaded_at is None:
                if status == 200:
                    self.loaded_at = now
            elif status == 200 or now - self.loaded_at >= SERVE_SETTLE:
                self._become_ready()

    def _become_ready(self) -> None:
        """The ready actions the full supervisor prepared, READY=1, then the watchdog (Watched's)."""
        self.ready = True
        self.captured.clear()
        for final in self.at_ready:
            try:  # noqa: SIM105 -- a ready action is bookkeeping: never the reason a ready server fails
                os.replace(final + AT_READY, final)
            except OSError:
                pass
        self.at_ready = []
        self.notifier.ready(self.status)
        self.interval = self.watchdog_every
        self.next_check = time.monotonic()

    def drop_at_ready(self) -> None:
        """The start failed: the ready actions prepared for it are removed."""
        for final in self.at_ready:
            try:  # noqa: SIM105 -- no contextlib: light
                os.unlink(final + AT_READY)
            except OSError:
                pass
        self.at_ready = []
