"""The hand-off of a ready llama-server's supervision to the small handed supervisor (process/handed.py), and that
process's end.

Owns the words of what the end needs (the launch's ledger entry, remember_kill's figures, an early start's record) and
the end itself (main): the lines and actions run_attempt, the launch's loop and run_attempts' cleanup take after a
ready llama.cpp ends, in their order. Must stay light at import (the handed process imports it while llama-server
runs): the end imports what it uses once the child is gone.
"""

from __future__ import annotations

import os

TYPE_CHECKING = False  # typing.TYPE_CHECKING without importing typing (mypy reads the name)
if TYPE_CHECKING:
    from collections.abc import Callable, Mapping, Sequence

    from safe_llama.attempts.say import Say
    from safe_llama.process.channels import Child
    from safe_llama.process.health import Health
    from safe_llama.process.sdnotify import Notifier


def ending_words(
    env: Mapping[str, str],
    *,
    ledger: str | None = None,
    kill: tuple[int, int | None, int] | None = None,
    digest: str | None = None,
    record: str | None = None,
) -> list[str] | None:
    """The end's words: the ledger entry to remove, remember_kill's figures (the plan's KV, its learned largest
    allocation, its host budget) and the key they are kept under, the early start's record to drop. None where the
    handed process would refuse one (read here as it reads them): no hand-off then."""
    out = []
    if ledger is not None:
        out.append(f"ledger={ledger}")
    if kill is not None:
        kv, max_alloc, budget = kill
        out.append(f"kill={kv},{'-' if max_alloc is None else max_alloc},{budget}")
        if digest is not None:
            out.append(f"digest={digest}")
    if record is not None:
        out.append(f"record={record}")
    try:
        Ending(out, env)
    except ValueError:
        return None
    return out


class Ending:
    """The end's words, read and checked against where such files live."""

    def __init__(self, given: Sequence[str], env: Mapping[str, str]) -> None:
        from safe_llama.constants import cache_root

        self.ledger: str | None = None
        self.kill: tuple[int, int | None, int] | None = None
        self.digest: str | None = None
        self.record: str | None = None
        for word in given:
            name, _, value = word.partition("=")
            if name == "ledger" and value.endswith(f"/{os.getpid()}.json") and os.path.isabs(value):
                self.ledger = value
            elif name == "kill" and self.kill is None:
                self.kill = _figures(value)
            elif name == "digest" and len(value) <= 128 and value.isalnum() and value.isascii():
                self.digest = value
            elif (
                name == "record"
                and os.path.dirname(value) == os.path.join(cache_root(env), "launch")
                and value.endswith(".marshal")
            ):
                self.record = value
            else:
                raise ValueError(f"the hand-off's ending word {word[:60]!r} is not one it takes")


def _figures(value: str) -> tuple[int, int | None, int]:
    words = value.split(",")
    if len(words) != 3 or not all(w == "-" or (w.isascii() and w.isdigit() and len(w) <= 20) for w in words):
        raise ValueError(f"the hand-off's kill figures {value[:60]!r} are not three whole numbers")
    if words[0] == "-" or words[2] == "-":
        raise ValueError(f"the hand-off's kill figures {value[:60]!r} lack the KV or the budget")
    return int(words[0]), None if words[1] == "-" else int(words[1]), int(words[2])


def main(args: Sequence[str]) -> int:
    """The handed process: supervise the child to its end, then end as the full safe-llama would have; a child
    handed off as it started (attempts/at_spawn.py) that ended before it was ready goes back to the full safe-llama
    (attempts/resume.py), on its own argv (resume.ARGV_ENV)."""
    from safe_llama.attempts import resume
    from safe_llama.process import handed

    env = os.environ
    end = list(args).index(handed.END) if handed.END in args else len(args)
    supervision = handed.read_words(args[:end])
    argv = resume.take_argv() if supervision.start else None
    ending = Ending(args[end + 1 :], env)
    watched: Callable[[Child, float, Notifier, Health | None], handed.Watched] = handed.Watched
    if supervision.start:
        from safe_llama.process.starting import Starting

        health, status, at_ready = supervision.health, supervision.status, supervision.at_ready
        assert health is not None

        def watched(child: Child, kill_after: float, notifier: Notifier, _: Health | None) -> handed.Watched:
            return Starting(child, kill_after, notifier, health, status, at_ready)

    steady = handed.supervise(supervision, env, lambda line: _say(env)(line, "warning"), watched)
    assert steady.returncode is not None
    evidence = None
    say = _say(env)
    failed_start = not steady.ready and steady.user_stop is None and steady.returncode != 0 and bool(argv)
    if steady.killed_unasked():  # only now the full code's judgement is imported: the child is gone
        from safe_llama.device.probe_host import OomWatch, judge_kill, oom_counters
        from safe_llama.messages import KILLED_NO_EVIDENCE

        watch = OomWatch(
            supervision.pid, supervision.since, supervision.counters, supervision.group, supervision.group_counter
        )
        evidence, why = judge_kill(watch, oom_counters(), alone={os.getpid()})
        if evidence is None:
            say(KILLED_NO_EVIDENCE.text(tool=supervision.tool, pid=supervision.pid, why=why), "warning")
    if not steady.ready:
        from safe_llama.process.starting import Starting

        assert isinstance(steady, Starting)
        steady.drop_at_ready()  # never ready: what it was to put in place is not true
        if failed_start and argv:
            try:
                path: str | None = resume.write(env, steady.returncode, evidence, steady.captured)
            except OSError:
                path = None
            if path is not None:
                resume.exec_full(argv, path)  # returns only when the exec failed: this process ends as below
    steady.notifier.stopping()
    if evidence is not None:
        _killed_for_memory(ending, evidence, env, say)
    if ending.ledger is not None:
        try:  # noqa: SIM105 -- as ledger.Entry.remove
            os.unlink(ending.ledger)
        except OSError:
            pass
    from safe_llama.process.steady import exit_code_for

    return exit_code_for(steady.returncode)


def _killed_for_memory(ending: Ending, evidence: str, env: Mapping[str, str], say: Say) -> None:
    """As the launch's loop (remember_kill) and an early start's (its record dropped) take a ready child's OOM kill."""
    if ending.record is not None:
        from safe_llama.remembered import fast_record

        fast_record.drop(ending.record)
    if ending.kill is not None:
        from safe_llama.attempts.attempt import remember_kill

        kv, max_alloc, budget = ending.kill
        remember_kill(kv, max_alloc, budget, ending.digest, evidence, env, say)


def _say(env: Mapping[str, str]) -> Say:
    from safe_llama.attempts.say import Say

    return Say(env)
