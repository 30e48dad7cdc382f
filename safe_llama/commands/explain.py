"""`safe-llama explain`: a llama.cpp log in; what failed, why, and what would fit (as command lines) out.

Owns the explanation (the failure in plain words, why, the remedies chosen), its rendering as text or JSON
(every secret of the failed run masked) and the reading of its input (a file or a stream, a chunk at a time
into diagnosis.log_reading's LogReader: memory bounded whatever the log's size; --follow). The failed run is
diagnosis.failed_run's, the words diagnosis.explain_words', the remedies diagnosis.remedies' and
diagnosis.number_remedies'. Pure but for `run_explain` and the command's runner `main` at the bottom, which
read the log and the model's GGUF header; must not probe this machine (no llama.cpp, no OpenCL or sysfs: the
log's machine is the one planned for), load a model, or hold planning policy (configs/planner.toml does).

Over 400 lines on purpose: one command's explanation, its two renderings and the shell that feeds them, read
together; every rule they apply lives in diagnosis/.
"""

from __future__ import annotations

import dataclasses
import io
import json
import os
import select
import stat
import sys
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal, TextIO

from safe_llama.cmdline.launch_args import check_tool
from safe_llama.cmdline.llama_args import REDACTED, parse, redact_argv, redact_env, secret_values
from safe_llama.cmdline.own_options import TOOL_HINT, flag
from safe_llama.constants import TOOL_BINARY, scrub
from safe_llama.device.limits import Sourced
from safe_llama.diagnosis.explain_words import Words, fill, load_words
from safe_llama.diagnosis.failed_run import FailedRun, failed_run
from safe_llama.diagnosis.log_reading import STDOUT_ERROR, LogFacts, LogReader, LogReading
from safe_llama.diagnosis.number_remedies import number_remedies, per_token_words
from safe_llama.diagnosis.own_lines import OwnTable, load_own_table
from safe_llama.diagnosis.own_outcome import own_exit, recovered, where_words
from safe_llama.diagnosis.remedies import (
    Remedy,
    bytes_words,
    kv_identity,
    log_target,
    plan_remedies,
    ready_command,
    safe_llama_remedy,
    stage_remedies,
)
from safe_llama.errors import ExitStatus, SafeLlamaError
from safe_llama.plan.policy import Policy
from safe_llama.plan.target import Probed, Target, kv_splits
from safe_llama.units import human

if TYPE_CHECKING:
    from safe_llama.pipeline.prepare import Prepared

# recovered: a start failed and safe-llama's retry started it (the log shows it ready afterwards)
Status = Literal["explained", "recovered", "no-failure", "unrecognised"]
EXIT_CODES: Mapping[Status, ExitStatus] = {
    "explained": ExitStatus.OK,
    "recovered": ExitStatus.OK,
    "no-failure": ExitStatus.FAILED,
    "unrecognised": ExitStatus.FAILED,
}


@dataclass(frozen=True)
class Explanation:
    status: Status
    source: str
    what: str
    why: tuple[str, ...]
    line: str | None  # the deciding line of the log
    kind: str | None  # signatures.Failure.kind, or abort / openvino-device-refused
    signature_id: str | None
    memory: bool
    stage: str | None
    requested_bytes: int | None
    limit_bytes: int | None
    basis: Literal["plan", "numbers", "none"]  # where the remedies come from
    remedies: tuple[Remedy, ...]
    notes: tuple[str, ...]  # what could not be told, and what was assumed
    run: FailedRun
    log: LogFacts
    safe_llama_exit: int | None = None  # the exit code safe-llama left with, when its own line says

    @property
    def exit_code(self) -> int:
        return int(EXIT_CODES[self.status])


def stage_of(reading: LogReading, words: Words) -> str | None:
    """What the failed allocation was for: a signature that says so, else the phase the log was in."""
    if reading.failure is None or not reading.failure.memory:
        return None
    for match in (m for m in reading.matches if m.category in ("alloc", "context")):
        stage = words.signatures.get(match.signature_id, {}).get("stage")
        if stage:
            return stage
    return reading.stage


def _probe_target(backend: str, version: str | None) -> Probed:
    return Probed(backend=backend, host_budget=Sourced(0, "declared", "unused"), binary_version=version)


def explain(
    reading: LogReading,
    run: FailedRun,
    words: Words,
    policy: Policy,
    *,
    source: str,
    prepared: Prepared | None = None,
    model_note: str | None = None,
    own_words: Mapping[str, Mapping[str, str]] | None = None,
) -> Explanation:
    """The explanation of a read log: the failure in words, why, and the remedies (planned from `prepared`,
    run.prepare's result for the failed command, when given; else from the log's numbers)."""
    failure = reading.failure
    facts = reading.facts
    notes = [n for n in (model_note,) if n]
    ending, retries = reading.own_exit, reading.retries
    if ending is not None or (retries and (reading.started_line or 0) > retries[-1].number):
        own = own_exit(reading, ending, run, words, own_words or {}) if ending else recovered(reading, run, words)
        return Explanation(
            status=own.status,
            source=source,
            what=own.what,
            why=own.why,
            line=own.line,
            kind="safe-llama" if ending else failure.kind if failure else None,
            signature_id=ending.pattern_id if ending else failure.signature_id if failure else None,
            memory=own.memory,
            stage=None if ending else stage_of(reading, words),
            requested_bytes=None if ending or not failure else failure.requested_bytes,
            limit_bytes=None if ending or not failure else failure.limit_bytes,
            basis="none",
            remedies=own.remedies,
            notes=(*notes, *own.notes),
            run=run,
            log=facts,
            safe_llama_exit=own.exit,
        )
    if retries:
        notes.append(
            f"safe-llama retried {len(retries)} time(s) ({retries[-1].groups.get('reason') or retries[-1].text}); "
            "the log ends before it shows the outcome"
        )
    if failure is None or (reading.refused_device is not None and not failure.memory):
        return _unsigned(reading, run, words, source, notes)
    binary = TOOL_BINARY[run.tool]
    stage = stage_of(reading, words)
    said = words.for_signature(failure.signature_id, failure.kind if failure.kind != "oom_killed" else "alloc")
    values = {
        "requested": bytes_words(failure.requested_bytes),
        "limit": bytes_words(failure.limit_bytes),
        "buffer": failure.buffer or "device",
        "where": where_words(failure, facts.backend),
        "tool": binary,
        "line": failure.line or "",
    }
    why = [fill(said.get("why", ""), values)]
    if stage is not None:
        why.append(f"the allocation was for {words.stages.get(stage, stage)}")
    if failure.requested_bytes is not None and failure.limit_bytes is not None:
        why.append(f"it is {failure.requested_bytes / failure.limit_bytes:.0%} of the limit")
    remedies: list[Remedy] = []
    basis: Literal["plan", "numbers", "none"] = "none"
    version: str | None = None
    one_buffer = False
    if not failure.memory:
        fix = said.get("fix")
        if fix:
            remedies.append(Remedy("fix", fill(fix, values), "", None))
    elif prepared is not None:
        basis = "plan"
        target, target_note = prepared.target, log_target(facts, failure, policy)[1]
        notes += [target_note] if target_note else []
        identity, whole_cache = kv_identity(prepared, failure.requested_bytes)
        if whole_cache and failure.limit_bytes is not None and target.kv_split is None:
            # the device was asked for a whole cache at once: this build does not split it, whatever its version
            target, one_buffer = replace(target, kv_split=False), True
        version = target.binary_version
        kv_failed = stage in ("kv", "context", None)
        planned, plan_notes, whole = plan_remedies(prepared, target, policy, failure, run, kv_failed=kv_failed)
        why += [identity] if identity else []
        remedies += [
            *planned,
            # shown when a plan fits (nothing fits: the notes say how much memory would)
            *([] if kv_failed or whole is None else stage_remedies(stage or "", run)),
            *([safe_llama_remedy(run, whole)] if whole is not None else []),
        ]
        notes += plan_notes
    else:
        basis = "numbers"
        if failure.requested_bytes is not None and run.n_ctx is not None and stage in ("kv", "context", None):
            why.append(per_token_words(failure.requested_bytes, run.n_ctx))
        computed, number_notes = number_remedies(failure, stage, facts, run, policy)
        remedies += [*computed, safe_llama_remedy(run, None)]
        notes += number_notes
        if run.model_path is None:
            notes.append("the log names no model: give it with -m MODEL for an exact plan")
    if failure.limit_bytes is not None and facts.backend == "openvino":
        why.append(_openvino_why(version, one_buffer, policy))
    if failure.memory and not run.args_from:
        notes.append("the failed command line is not in the log: the commands carry only what the log shows")
    if failure.memory and run.n_ctx is None:
        planned_at = "; planned at the model's own context, llama.cpp's default" if basis == "plan" else ""
        notes.append(f"the context the failed run asked for is not in the log (-lv 4 prints it){planned_at}")
    return Explanation(
        status="explained",
        source=source,
        what=f"{binary} failed to start: " + fill(said.get("what", "it stopped"), values),
        why=tuple(w for w in why if w and w != failure.line),
        line=failure.line,
        kind=failure.kind,
        signature_id=failure.signature_id,
        memory=failure.memory,
        stage=stage,
        requested_bytes=failure.requested_bytes,
        limit_bytes=failure.limit_bytes,
        basis=basis,
        remedies=tuple(remedies),
        notes=tuple(notes),
        run=run,
        log=facts,
    )


def _openvino_why(version: str | None, one_buffer: bool, policy: Policy) -> str:
    if one_buffer:
        return (
            "the device was asked for the whole KV cache (all layers, K and V) as one object: this build does not "
            "split it under the limit, the bug llama.cpp PR #29124 fixed"
        )
    if version is not None and kv_splits(_probe_target("openvino", version), policy):
        return f"this build ({version}) splits the KV cache under the limit, so a single tensor alone exceeds it"
    bug = (
        "llama.cpp PR #29124 ask OpenVINO for the whole KV cache (all layers, K and V) as one device object instead "
        "of pieces under the limit"
    )
    if version is None:
        return f"the log does not give the llama.cpp version: builds before {bug}"
    return f"this build ({version}) is older than the fix: builds before {bug}"


def _unsigned(reading: LogReading, run: FailedRun, words: Words, source: str, notes: list[str]) -> Explanation:
    """A failure the signature table does not explain well enough: OpenVINO refusing its device (with the
    devices it offers instead), an abort, error lines no signature knows, or no failure at all."""
    binary = TOOL_BINARY[run.tool]
    status: Status = "explained"
    remedies: list[Remedy] = []
    if reading.refused_device is not None:
        offered = ", ".join(f"{ov} ({name})" for ov, name in reading.available_devices) or "no device"
        values = {"device": reading.refused_device, "available": offered, "tool": binary, "line": ""}
        said = words.special["openvino-device-refused"]
        kind, line = "not_memory", f"GGML_OPENVINO_DEVICE={reading.refused_device} is not available"
        for ov, _ in reading.available_devices:
            env = {"GGML_OPENVINO_DEVICE": ov}
            remedies.append(Remedy("device", f"use OpenVINO's {ov} device", "", ready_command(run, {}, env), env))
        remedies.insert(0, Remedy("fix", fill(said.get("fix", ""), values), "", None))
    elif reading.abort is not None:
        values = {"line": reading.abort, "tool": binary}
        said = words.special["abort"]
        kind, line = "abort", reading.abort
        remedies.append(Remedy("fix", fill(said.get("fix", ""), values), "", None))
    elif reading.error_lines:
        values = {"line": reading.error_lines[0], "tool": binary}
        said = words.special["unrecognised"]
        kind, line, status = None, reading.error_lines[0], "unrecognised"
        notes.append("error lines: " + " | ".join(reading.error_lines[:5]))
        if STDOUT_ERROR.match(line):
            notes.append(f"{binary} prints the cause on stderr: explain that (run it with 2> FILE)")
    else:
        started = " and shows it started" if reading.facts.started else ""
        return Explanation(
            status="no-failure",
            source=source,
            what=f"no failure found: the log has no error line{started}",
            why=(),
            line=None,
            kind=None,
            signature_id=None,
            memory=False,
            stage=None,
            requested_bytes=None,
            limit_bytes=None,
            basis="none",
            remedies=(),
            notes=tuple(notes),
            run=run,
            log=reading.facts,
        )
    why = fill(said.get("why", ""), values)
    return Explanation(
        status=status,
        source=source,
        what=f"{binary} failed to start: " + fill(said.get("what", ""), values),
        why=(why,) if why and why != line else (),
        line=line,
        kind=kind,
        memory=False,
        signature_id=reading.failure.signature_id if reading.failure else None,
        stage=None,
        requested_bytes=None,
        limit_bytes=None,
        basis="none",
        remedies=tuple(remedies),
        notes=tuple(notes),
        run=run,
        log=reading.facts,
    )


# ---------------------------------------------------------------------------------------------------
# Rendering
# ---------------------------------------------------------------------------------------------------


def to_json(expl: Explanation, *, indent: int | None = 1) -> str:
    body = dataclasses.asdict(expl)
    return json.dumps({"schema": 1, **body, "exit_code": expl.exit_code}, indent=indent, default=str)


def render_text(expl: Explanation) -> str:
    lines = [f"What   {expl.what}."]
    for number, reason in enumerate(expl.why):
        lines.append(f"{'Why' if number == 0 else '':<7}{reason[0].upper()}{reason[1:]}.")
    if expl.line:
        lines.append(f"Line   {expl.line}")
    run, log = expl.run, expl.log
    assumed = run.tool_from.startswith("not in the log") and expl.kind == "safe-llama"
    known = [] if assumed else [f"tool {TOOL_BINARY[run.tool]} ({run.tool_from})"]
    if run.model_path:
        known.append(f"model {run.model_path} ({run.model_from})")
    if run.n_ctx:
        known.append(f"context {run.n_ctx} ({run.n_ctx_from})")
    if log.backend:
        known.append(f"backend {log.backend}{' GPU' if log.on_gpu else ''}")
    if known:
        lines.append("Log    " + "; ".join(known))
    if expl.remedies:
        heading = {
            "plan": "What would fit (planned exactly from the model):",
            "numbers": "What would fit (from the log's numbers; -m MODEL plans exactly):",
            "none": "What to do:",
        }[expl.basis]
        lines += ["", heading]
        for number, remedy in enumerate(expl.remedies, start=1):
            lines.append(f"  {number}. {remedy.summary}")
            if remedy.detail:
                lines.append(f"     {remedy.detail}")
            if remedy.command:
                lines.append(f"     $ {remedy.command}")
            lines += [f"     note: {note}" for note in remedy.notes]
    if expl.notes:
        lines.append("")
        lines += [f"note: {note}" for note in expl.notes]
    return "\n".join(lines) + "\n"


# ---------------------------------------------------------------------------------------------------
# The shell: reading the input, the exact plan
# ---------------------------------------------------------------------------------------------------


CHUNK = 1 << 20  # bytes read at a time: with the reader's bounded summary, explain's memory whatever the log's size
FIFO_WAIT_S = 5.0  # how long a named FIFO may stay without a writer before explain gives up on it
FOLLOW_IDLE_S = 2.0  # --follow: a failure is explained once its log has been quiet this long
USAGE = "safe-llama explain [--json] [--follow] [-m MODEL] [--tool TOOL] [LOG|-] [LLAMA.CPP ARGS...]"
_KINDS = (
    (stat.S_ISREG, "a regular file"),
    (stat.S_ISFIFO, "a FIFO"),
    (stat.S_ISSOCK, "a socket"),
    (stat.S_ISCHR, "a character device"),
    (stat.S_ISBLK, "a block device"),
    (stat.S_ISDIR, "a directory"),
)


def _kind(mode: int) -> str:
    return next((name for test, name in _KINDS if test(mode)), "not a file")


def _refuse(name: str, why: str) -> SafeLlamaError:
    # a log that cannot be read is a bad argument (2), not a bad model (65)
    return SafeLlamaError(f"safe-llama: explain: {name}: {why}", ExitStatus.USAGE)


def _stdin_fd(stdin: Any) -> int | None:
    try:
        return int(stdin.fileno())
    except (AttributeError, OSError, ValueError, io.UnsupportedOperation):
        return None


def _chunks(file: str, stdin: Any, *, idle_s: float | None, wait_s: float) -> Iterator[bytes]:
    """The log's bytes, CHUNK at a time, from a regular file or a stream (stdin as `-`, a pipe, a named FIFO
    with a writer); with idle_s, b"" each time nothing new came for idle_s seconds. Refused with one line:
    stdin a terminal (the usage instead), a device, a directory, a FIFO no process writes to."""
    if file == "-":
        fd = _stdin_fd(stdin)
        if fd is None:  # a file object given by a caller (tests)
            source = stdin.buffer if hasattr(stdin, "buffer") else stdin
            while chunk := source.read(CHUNK):
                yield chunk if isinstance(chunk, bytes) else chunk.encode()
            return
        if os.isatty(fd):
            raise _refuse("stdin", f"a terminal, not a log: give a log file, or pipe one in (usage: {USAGE})")
        kind = _kind(os.fstat(fd).st_mode)
        if kind not in ("a regular file", "a FIFO", "a socket"):
            raise _refuse("stdin", f"{kind}, not a log: give a log file, or pipe one in (usage: {USAGE})")
        yield from _read_fd(fd, idle_s)
        return
    try:
        # non-blocking: opening a FIFO nobody writes to would wait forever
        fd = os.open(file, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError as err:
        raise _refuse(file, err.strerror or str(err)) from None
    try:
        kind = _kind(os.fstat(fd).st_mode)
        if kind == "a FIFO":
            poller = select.poll()
            poller.register(fd, select.POLLIN)
            if not poller.poll(wait_s * 1000):
                raise _refuse(
                    file, f"a FIFO no process wrote to in {wait_s:g} s: give a log file, or pipe the log into `-`"
                )
        elif kind != "a regular file":
            raise _refuse(file, f"{kind}, not a log: give a log file, or pipe a stream into `safe-llama explain -`")
        os.set_blocking(fd, True)
        yield from _read_fd(fd, idle_s)
    finally:
        os.close(fd)


def _read_fd(fd: int, idle_s: float | None) -> Iterator[bytes]:
    poller = select.poll()
    poller.register(fd, select.POLLIN)
    while True:
        if idle_s is not None and not poller.poll(idle_s * 1000):
            yield b""
            continue
        try:
            chunk = os.read(fd, CHUNK)
        except OSError as err:
            raise _refuse("stdin" if fd == 0 else str(fd), err.strerror or str(err)) from None
        if not chunk:
            return
        yield chunk


def _model_inputs(
    run: FailedRun, reading: LogReading, policy: Policy, env: Mapping[str, str]
) -> tuple[Prepared | None, str | None]:
    """The failed command with its model's facts (the GGUF header, when the file is here) and the log's
    machine as the target; or why not. Probes nothing: no llama.cpp, no OpenCL, no sysfs."""
    from safe_llama.cmdline.request import to_request
    from safe_llama.model.facts_cache import facts_for
    from safe_llama.pipeline.prepare import Prepared, layout_for

    failure = reading.failure
    if run.model_path is None or failure is None:
        return None, None
    if not os.path.isfile(run.model_path):
        return None, (
            f"the log names the model {run.model_path}, which is not on this machine: working from the log's "
            "numbers (give it with -m MODEL to plan exactly)"
        )
    try:
        cmd = parse(run.tool, list(run.args), run.env)
        request = to_request(cmd)
        facts = facts_for(run.model_path, env)
        layout, notes = layout_for(request, None, env)
    except SafeLlamaError as err:
        if err.status in (ExitStatus.USAGE, ExitStatus.BAD_CONFIG):
            raise
        return None, f"no exact plan ({err.message.removeprefix('safe-llama: ')}): working from the log's numbers"
    target, _ = log_target(reading.facts, failure, policy)
    said = None
    if not target.on_gpu and reading.facts.address_space_limit is None:
        target, said = _this_machine(target, policy)
    return Prepared(cmd, request, run.model_path, facts, target, None, None, None, None, layout, notes), said


def _this_machine(logged: Target, policy: Policy) -> tuple[Target, str]:
    """A host log that names no memory limit: this machine's limits instead (RAM, cgroup, ulimit -v: what a
    command pasted here meets), and the line that says which."""
    from safe_llama.device.host_budget import host_budget
    from safe_llama.device.probe_host import probe_host
    from safe_llama.plan.target import target_policy

    budget = host_budget(probe_host())
    probed = replace(
        logged.probed,
        host_budget=budget.budget_bytes,
        address_space_budget=any(limit.kind == "address space" for limit in budget.limits)
        or "RLIMIT_AS" in budget.budget_bytes.detail,
        host_limits=budget.limits,
    )
    limit = budget.budget_bytes
    return Target.of(probed, target_policy(policy, probed), logged.lessons), (
        f"the log names no memory limit: planned against this machine's, {human(limit.value)} ({limit.detail})"
    )


def _program(tool: str, env: Mapping[str, str]) -> str:
    """What a remedy's command runs: the llama.cpp tool a launch here would run, by its full path, else
    safe-llama's drop-in (a bare llama-server is on no PATH after the set-up)."""
    from safe_llama.device.binaries import find_binary

    try:
        return str(find_binary(tool, env=env))
    except SafeLlamaError:
        return f"safe-llama-{tool}"


def own_words(table: OwnTable) -> dict[str, Mapping[str, str]]:
    """explain's words for safe-llama's own lines, by the line's id."""
    return {entry.id: entry.words for entry in table.patterns}


def redacted_text(expl: Explanation, text: str) -> str:
    """A rendering of expl with every secret of the failed run masked wherever it shows: the values of its
    secret options (explain's arguments, the command line the log quotes) and secret variables, in its
    command lines, notes and the log's quoted lines alike (in JSON, as JSON spells them too)."""
    run, log = expl.run, expl.log
    values = secret_values(run.args, run.tool, run.env) | secret_values(
        log.command_args, log.command_tool or run.tool, log.command_env
    )
    spelled = {json.dumps(value)[1:-1] for value in values}
    return scrub(text, values | spelled, REDACTED)


def redacted(expl: Explanation) -> Explanation:
    """expl with the failed run's secret options and variables masked in its own fields."""
    run, log = expl.run, expl.log
    return replace(
        expl,
        run=replace(run, args=tuple(redact_argv(run.args, run.tool)), env=redact_env(run.env)),
        log=replace(
            log,
            command_args=tuple(redact_argv(log.command_args, log.command_tool or run.tool)),
            command_env=redact_env(log.command_env),
        ),
    )


def rendered(expl: Explanation, json_out: bool, *, lines: bool = False) -> str:
    """expl as printed: text, JSON (one line each with `lines`, as --follow prints), secrets masked."""
    shown = redacted(expl)
    text = (to_json(shown, indent=None if lines else 1) + "\n") if json_out else render_text(shown)
    return redacted_text(expl, text)


def run_explain(
    *,
    file: str,
    args: Sequence[str] = (),
    model: str | None = None,
    tool: str | None = None,
    json_out: bool = False,
    follow: bool = False,
    env: Mapping[str, str] = os.environ,
    stdin: Any = None,
    out: TextIO | None = None,
    wait_s: float = FIFO_WAIT_S,
    idle_s: float = FOLLOW_IDLE_S,
) -> int:
    """`safe-llama explain`: read, explain, print; the exit code (0 explained, 1 nothing recognised). The log
    streams through a LogReader: memory stays bounded whatever its size. With follow, each failure is
    explained once the stream has been quiet for idle_s seconds after it (and at its end), then reading
    starts afresh; the exit code is the last explanation's (1 when there was none)."""
    from safe_llama.diagnosis.signatures import Lines, load_table
    from safe_llama.paths import config_dir, configs_dir
    from safe_llama.plan.policy import load_policy

    table = load_table(Path(env["SAFE_LLAMA_SIGNATURES"]) if env.get("SAFE_LLAMA_SIGNATURES") else None)
    words = load_words(configs_dir(env) / "explain.toml")
    policy = load_policy(configs_dir(env) / "planner.toml", config_dir(env) / "config.toml")
    own_table = load_own_table(configs_dir(env) / "own-lines.toml")
    stream = sys.stdout if out is None else out
    chunks = _chunks(file, sys.stdin if stdin is None else stdin, idle_s=idle_s if follow else None, wait_s=wait_s)
    reader, lines = LogReader(table, own_table), Lines()

    def explained(reading: LogReading) -> Explanation:
        run = failed_run(reading.facts, args=args, model=model, tool=tool)
        run = replace(run, program=_program(run.tool, env))
        prepared = note = None
        if reading.failure is not None and reading.failure.memory:
            prepared, note = _model_inputs(run, reading, policy, env)
        return explain(
            reading, run, words, policy, source=file, prepared=prepared, model_note=note, own_words=own_words(own_table)
        )

    if not follow:
        for chunk in chunks:
            for line in lines.feed(chunk):
                reader.feed(line)
        for line in lines.close():
            reader.feed(line)
        expl = explained(reader.reading())
        stream.write(rendered(expl, json_out))
        return expl.exit_code
    code = int(ExitStatus.FAILED)
    for chunk in chunks:
        for line in lines.feed(chunk):
            reader.feed(line)
        if not chunk and reader.failed:
            expl = explained(reader.reading())
            stream.write(rendered(expl, json_out, lines=True) + ("" if json_out else "\n"))
            stream.flush()
            code, reader = expl.exit_code, LogReader(table, own_table)
    for line in lines.close():
        reader.feed(line)
    if reader.failed:
        expl = explained(reader.reading())
        stream.write(rendered(expl, json_out, lines=True))
        code = expl.exit_code
    return code


def main(settings: Mapping[str, str], words: list[str]) -> int:
    """The command's runner (cmdline.own_options.COMMANDS): `explain`'s options as entry.py read them, then
    the log file and the failed run's arguments."""
    tool = settings.get("tool")
    return run_explain(
        file=words[0] if words else "-",
        args=words[1:],
        model=settings.get("model"),
        tool=None if tool is None else check_tool(tool, TOOL_HINT),
        json_out=bool(flag(settings, "json")),
        follow=bool(flag(settings, "follow")),
    )
