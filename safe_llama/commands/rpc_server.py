"""`safe-llama rpc-server [args]`: llama.cpp's RPC worker (ggml-rpc-server) run the way a service needs it:
its arguments and output untouched, signals passed on once, its exit code exact, READY=1 to systemd when it
listens, and one line when the worker will offer the head more memory than this machine lets it use.

The worker reports its devices' memory to the head (the CPU device: all of the host's RAM) and has no option
to say less; a cgroup's memory.max or memory.limit_in_bytes is invisible to it. safe-llama says so at start,
with the figure, so the head can be told (see README, "Several machines").

Owns the worker's launch; must not plan anything (the head plans) nor change the worker's arguments."""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence

from safe_llama.attempts.say import Say
from safe_llama.cmdline.rpc_args import parse_rpc_args
from safe_llama.device.binaries import find_binary
from safe_llama.device.probe_host import probe_host
from safe_llama.process import supervise
from safe_llama.process.channels import check_not_nested
from safe_llama.process.readiness import ListenProbe
from safe_llama.process.sdnotify import Notifier, child_env
from safe_llama.process.startup import StartupWatcher
from safe_llama.units import human


def memory_note(advertised: int, limit: int | None, limit_name: str, endpoint: str = "HOST:PORT") -> str | None:
    """The line for a worker whose advertised memory is above what it may use here; None when it is not."""
    if limit is None or limit >= advertised:
        return None
    return (
        f"rpc-server offers the head {human(advertised)} (host RAM) but {limit_name} lets it use {human(limit)}: "
        f"declare it on the head (safe-llama --rpc-memory {endpoint}={limit // (1 << 20)}M ...), which then "
        "gives this worker a share it can hold"
    )


def run_rpc_server(args: Sequence[str], env: Mapping[str, str] = os.environ) -> int:
    check_not_nested(env)
    binary = find_binary("rpc-server", env=env)
    parsed = parse_rpc_args(args)
    if parsed.help or parsed.port is None:
        os.execv(binary, [str(binary), *args])  # noqa: S606 -- llama.cpp's own answer: usage, errors
    say = Say(env)
    host = probe_host()
    limit, name = None, ""
    if host.cgroup is not None and host.cgroup.max_bytes is not None:
        limit, name = host.cgroup.max_bytes, f"its cgroup ({host.cgroup.limit_dir})"
    where = f"{parsed.host}:{parsed.port}"
    if not parsed.devices or any(d.upper().startswith("CPU") for d in parsed.devices):
        note = memory_note(host.total_bytes, limit, name, where)
        if note:
            say(note, "warning")
    notifier = Notifier(env)

    def listening() -> None:  # the worker's failures are its own messages and exit code: nothing is scanned
        notifier.ready(f"listening on {where}")

    try:
        outcome = supervise.supervise_child(
            [binary, *args], child_env(env), watcher=StartupWatcher(None, listening), probe=ListenProbe(parsed.port)
        )
    finally:
        notifier.close()
    if not outcome.ready and outcome.user_stop_signal is None:
        say(f"rpc-server stopped before it listened on {where} (exit {outcome.exit_code})", "error")
    return outcome.exit_code
