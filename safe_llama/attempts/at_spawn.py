"""The hand-off at the spawn: a server under a cgroup limit hands its supervision to the small handed supervisor
as it starts llama-server, not once it is ready, so the full supervisor is never charged to the group while
llama-server fills its context. The plan counts that (plan/memory.py: the full supervisor's own charge when it
probed given back, the handed one's taken: policy handed_supervisor_bytes), and the handed supervisor watches the
start-up (process/starting.py): at ready it puts in place what the full one prepared (the remembered plan, the
ledger entry's READY state: each written beside its file now, renamed then) and tells systemd; a start that fails
goes back to the full safe-llama (attempts/resume.py), which plans, learns and retries with its own supervisor.

Where: `safe-llama server` run from safe-llama's console script (or a drop-in's), its first attempt, stdin no
terminal and 0, 1, 2 open (a unit, a container, a script), /health plain HTTP on a known port or socket, the
launcher's hand_off setting on, and a plan on the CPU under a cgroup limit (prepare: Probed.own_charge). No launch
record is written for such a start (each start plans: the early start would import the full supervisor beside a
running llama-server).

Owns that choice and the words the hand-off at the spawn adds; the exec is handed.py's, the start-up watch
starting.py's, the way back resume.py's.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING

from safe_llama.attempts import resume
from safe_llama.process.starting import AT_READY

if TYPE_CHECKING:
    from safe_llama.device.ledger import Entry
    from safe_llama.pipeline.prepare import LaunchOptions, Prepared


def eligible(
    tool: str, args: Sequence[str], env: Mapping[str, str], options: LaunchOptions, door: object | None
) -> bool:
    """Whether this launch can hand off as llama-server starts (see the module's docstring; the plan decides the
    rest: a cgroup limit, the CPU)."""
    from safe_llama.process.readiness import HealthProbe, probe_for

    if tool != "server" or not options.hand_off or door is None or not os.path.isabs(sys.executable or ""):
        return False
    try:
        for fd in (0, 1, 2):
            os.fstat(fd)  # open: the handed supervisor's own fds must not take their numbers
        if os.isatty(0):
            return False
    except OSError:
        return False
    probe = probe_for(tool, list(args), env)
    return isinstance(probe, HealthProbe) and not probe.https and (probe.port != 0 or probe.unix_socket is not None)


def planned(prepared: Prepared | None) -> bool:
    """The plan counted the hand-off at the spawn (prepare set Probed.own_charge: a cgroup limit, the CPU)."""
    return prepared is not None and prepared.plan is not None and prepared.target.own_charge > 0


def take_over(
    number: int,
    entry: Entry | None,
    store: tuple[str, Prepared, Mapping[str, str]] | None,
    ending: Callable[[], list[str] | None],
) -> tuple[list[str], Callable[[], list[str] | None]]:
    """The start words of a hand-off at the spawn (its ready actions prepared now), and the ending words, asked at
    the hand-off, which then also puts this process's own argv in its environment (resume.ARGV_ENV: the way back to
    it, not on the handed supervisor's command line)."""
    from dataclasses import replace

    from safe_llama.attempts.attempt import remembered_after_ready
    from safe_llama.device.reservations import READY

    words = ["start=1", f"status=ready (attempt {number})"]
    if store is not None:
        written = remembered_after_ready(*store, suffix=AT_READY)
        if written is not None:
            words.append(f"at_ready={written}")
    if entry is not None and entry.written and entry.launch is not None:
        try:
            entry.write(replace(entry.launch, state=READY), suffix=AT_READY)
            words.append(f"at_ready={entry.path}")
        except OSError:
            pass
    argv = resume.argv_words(sys.argv)

    def with_argv() -> list[str] | None:
        given = ending()
        if given is not None:
            os.environ[resume.ARGV_ENV] = argv  # the exec follows at once (the child has its environment already)
        return given

    return words, with_argv
