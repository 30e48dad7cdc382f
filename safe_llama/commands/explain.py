"""`safe-llama explain`: a llama.cpp log in; what failed, why, and what would fit (as command lines) out.

Owns reading a log of any llama.cpp tool (any verbosity, timestamps or not, colours, a leading `#` comment)
for the failure (through the signature table) and the facts around it (tool, model, context, backend),
the plain words (configs/explain.toml), the remedies from the log's numbers or from an exact plan, and
rendering. Pure but for `run_explain` at the bottom, which reads the log and the model's GGUF header; must
not probe this machine (no llama.cpp, no OpenCL or sysfs: the log's machine is the one planned for), load a
model, or hold planning policy (configs/planner.toml does).
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
import shlex
import sys
import tomllib
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from fractions import Fraction
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal, TextIO

from safe_llama.cmdline.llama_args import arg_table, parse, redact_argv, redact_env, rewrite
from safe_llama.device.binaries import TOOL_BINARY
from safe_llama.device.device_map import HostLimit, Sourced
from safe_llama.device.list_devices import parse_list_devices
from safe_llama.errors import ExitStatus, SafeLlamaError
from safe_llama.model.kv import block_size, pad, plan_kv, row_bytes
from safe_llama.plan.planner import (
    STATEFUL_ENV,
    Plan,
    Settings,
    Target,
    allocations,
    describe,
    kv_splits,
    plan,
    with_learned,
)
from safe_llama.plan.policy import Policy
from safe_llama.run.signatures import ESCAPES, Failure, Match, SignatureTable, classify, clean_line
from safe_llama.units import human

if TYPE_CHECKING:
    from safe_llama.run.prepare import Prepared

Status = Literal["explained", "no-failure", "unrecognised"]
EXIT_CODES: Mapping[Status, int] = {"explained": 0, "no-failure": 1, "unrecognised": 1}

# A log that names no limit does not say how much memory that run had: a remedy is sized at this share
# of the allocation that failed (the launcher's retry instead searches, one start after another).
SHRINK = Fraction(3, 4)
MAX_LINE = 16384  # as signatures.Scanner: a longer line is read on its first MAX_LINE characters
GRID = 256  # llama.cpp pads n_ctx up to a multiple of 256 (kv.PAD)
# The host budget planned against when the log names none: no limit; a retry's share of the failed KV stands in.
UNKNOWN_HOST = 1 << 60

_NEWLINE = re.compile(r"\r\n|\r|\n")
_LEVEL = re.compile(r"(?:\d+\.\d\d\.\d{3}\.\d{3} |^)(?P<level>[IWED]) ")

# Where a log names its model, most specific first (llama-model-loader.cpp, common.cpp, server.cpp, gguf.cpp).
_MODEL_PATH = (
    re.compile(
        r"llama_model_loader: loaded meta data with \d+ key-value pairs and \d+ tensors from (?P<p>.+?) \(version"
    ),
    re.compile(r"failed to create[_ ]context with model '(?P<p>[^']+)'"),
    re.compile(r"load_model: loading model '(?P<p>[^']+)'"),
    re.compile(r"failed to load model,? '(?P<p>[^']+)'"),
    re.compile(r"failed to open GGUF file '(?P<p>[^']+)'"),
    re.compile(r"llama_model_loader: failed to load model from (?P<p>.+)$"),
)
_N_CTX = re.compile(r"^llama_context: n_ctx\s+= (?P<n>\d+)")
_N_SEQ_MAX = re.compile(r"^llama_context: n_seq_max\s+= (?P<n>\d+)")
_CTX_VS_TRAIN = re.compile(r"n_ctx_seq \((?P<seq>\d+)\) [<>] n_ctx_train \((?P<train>\d+)\)")
_N_CTX_TRAIN = re.compile(r"n_ctx_train\s+= (?P<n>\d+)")
_KV_CREATING = re.compile(r"creating non-SWA KV cache, size = (?P<n>\d+) cells")
_KV_TYPES = re.compile(r"^llama_kv_cache: size = .*, K \((?P<k>\w+)\): .*, V \((?P<v>\w+)\)")
_USING_DEVICE = re.compile(r"using device (?P<name>\S+) \((?P<desc>.*)\)")
# The phase a line belongs to: an allocation failure with no stage of its own is named by it.
_PHASES = (
    ("context", re.compile(r"^llama_context:|^llama_kv_cache|^llama_init_from_model")),
    ("weights", re.compile(r"^load_tensors:|^llama_model_loader:|^llama_model_load|load_model: loading model")),
)
# Which tool printed the log. llama-cli runs a server inside, so its marks are looked for first.
_TOOL_MARKS = (
    ("cli", re.compile(r"llama_server exited with code|the server exited before becoming ready|^available commands:")),
    ("server", re.compile(r"^srv\s|^slot\s|llama_server:")),
    ("completion", re.compile(r"^llama_completion:|^generate: n_ctx")),
)
_BACKEND_MARKS = (
    ("openvino", re.compile(r"OpenVINO|OPENVINO\d|ggml-openvino|intel_gpu|\[GPU\] Exceeded")),
    ("cuda", re.compile(r"\bCUDA\d|cudaMalloc|ggml_cuda")),
    ("hip", re.compile(r"\bROCm\d|hipMalloc|hipError")),
    ("vulkan", re.compile(r"\bVulkan\d|ggml_vulkan")),
    ("sycl", re.compile(r"\bSYCL\d|ggml_sycl")),
    ("metal", re.compile(r"\bMTL\d|ggml_metal")),
    ("opencl", re.compile(r"GPUOpenCL|ggml_opencl")),
    ("cpu", re.compile(r"CPU buffer|ggml_aligned_malloc|ggml_backend_cpu")),
)
_GPU_DEVICE = re.compile(r"\[GPU\]|intel_gpu|GGML_OPENVINO_DEVICE=GPU|\bCUDA\d|\bROCm\d|\bVulkan\d|\bSYCL\d|\bMTL\d")
_STARTED = re.compile(r"listening on http|main: model loaded|^generate: n_ctx|^available commands:")
# ggml_abort's "file:line: message" (GGML_ASSERT goes through it too).
_ABORT = re.compile(r"^(?P<file>\S+\.(?:c|cc|cpp|cu|h|hpp|m|mm)):(?P<lineno>\d+): (?P<msg>.+)$")
# llama-cli's own errors on stdout ("Error: the server exited before becoming ready"): the cause is on stderr.
_STDOUT_ERROR = re.compile(r"(?:^|(?<=[\s\x08]))Error: .+")  # after a spinner: backspaces
_OPENVINO_REFUSED = re.compile(r"GGML_OPENVINO_DEVICE=(?P<device>\S+) is not available")
# A command line quoted in the log (a shell prompt, a header comment): NAME=value words, then the binary.
_COMMAND = re.compile(
    r"(?:^|[\s/'\"(])(?P<env>(?:[A-Za-z_][A-Za-z0-9_]*=\S*\s+)*)(?:\S*/)?(?:safe-)?llama-(?P<tool>cli|server|completion)"
    r"(?=\s|$)(?P<args>.*)$"
)
_SHELL_STOP = (";", "|", "||", "&&", "&", ">", "2>", "2>&1", ">>")
# The failed run's address-space limit, when the log quotes the shell line that set it (KiB, as bash takes it).
_ULIMIT_V = re.compile(r"\bulimit -v (?P<kib>\d+)\b")


# ---------------------------------------------------------------------------------------------------
# Words
# ---------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Words:
    """configs/explain.toml: plain words per signature, per category and for the unsigned cases."""

    signatures: Mapping[str, Mapping[str, str]]
    categories: Mapping[str, Mapping[str, str]]
    stages: Mapping[str, str]
    special: Mapping[str, Mapping[str, str]]  # abort, openvino-device-refused, unrecognised

    def for_signature(self, signature_id: str | None, category: str) -> Mapping[str, str]:
        own = self.signatures.get(signature_id or "", {})
        return {**self.categories.get(category, {}), **own}


def parse_words(text: str, where: str = "explain.toml") -> Words:
    try:
        raw = tomllib.loads(text)
    except tomllib.TOMLDecodeError as err:
        raise SafeLlamaError(f"safe-llama: {where}: {err}", ExitStatus.BAD_CONFIG) from None

    def table(value: Any, name: str) -> dict[str, Any]:
        if not isinstance(value, dict):
            raise SafeLlamaError(f"safe-llama: {where}: [{name}] must be a table", ExitStatus.BAD_CONFIG)
        return value

    def texts(value: Any, name: str) -> dict[str, str]:
        entries = table(value, name)
        bad = [k for k, v in entries.items() if not isinstance(v, str)]
        if bad:
            raise SafeLlamaError(f"safe-llama: {where}: {name}.{bad[0]} must be text", ExitStatus.BAD_CONFIG)
        return dict(entries)

    signatures = {k: texts(v, f"signature.{k}") for k, v in table(raw.get("signature", {}), "signature").items()}
    categories = {k: texts(v, f"category.{k}") for k, v in table(raw.get("category", {}), "category").items()}
    special = {k: texts(raw.get(k, {}), k) for k in ("abort", "openvino-device-refused", "unrecognised")}
    return Words(signatures, categories, texts(raw.get("stage", {}), "stage"), special)


def load_words(path: Path) -> Words:
    try:
        return parse_words(path.read_text(encoding="utf-8"), str(path))
    except OSError as err:
        raise SafeLlamaError(f"safe-llama: {path}: {err.strerror}", ExitStatus.BAD_CONFIG) from None


class _Fill(dict[str, str]):
    def __missing__(self, key: str) -> str:
        return "{" + key + "}"


def fill(text: str, values: Mapping[str, str]) -> str:
    return text.format_map(_Fill(values))


# ---------------------------------------------------------------------------------------------------
# Reading a log
# ---------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class LogFacts:
    """What a log says about the run besides its failure. `*_from` says which line said it."""

    tool: str | None = None
    tool_from: str = ""
    model_path: str | None = None
    model_from: str = ""
    n_ctx: int | None = None  # the cells llama.cpp used (its n_ctx, or n_ctx_seq x streams)
    n_ctx_from: str = ""
    n_ctx_train: int | None = None
    n_seq_max: int | None = None
    type_k: str | None = None
    type_v: str | None = None
    backend: str | None = None
    backend_from: str = ""
    on_gpu: bool | None = None
    device: str | None = None  # llama.cpp's device name (OPENVINO0, CUDA0), when a line names it
    integrated: bool | None = None
    command_tool: str | None = None
    command_args: tuple[str, ...] = ()  # the llama.cpp options of a command line quoted in the log
    command_env: Mapping[str, str] = field(default_factory=dict)
    command_from: str = ""
    started: bool = False  # the log shows the tool ready or generating
    address_space_limit: int | None = None  # bytes: a `ulimit -v` the log quotes for the failed run
    address_space_from: str = ""
    annotation_lines: int = 0  # leading '#' lines: read for a command line only


@dataclass(frozen=True)
class LogReading:
    facts: LogFacts
    matches: tuple[Match, ...]
    failure: Failure | None
    stage: str | None  # kv, compute, weights, output, context: what the failed allocation was for
    abort: str | None  # ggml_abort's message, when no signature decided
    refused_device: str | None  # GGML_OPENVINO_DEVICE=X that the OpenVINO backend refused
    available_devices: tuple[tuple[str, str], ...]  # what OpenVINO offered instead
    error_lines: tuple[str, ...]


def _level(raw: str) -> str | None:
    found = _LEVEL.search(ESCAPES.sub("", raw))
    return found.group("level") if found else None


def _known_args(tool: str, tokens: Sequence[str]) -> tuple[str, ...]:
    """The llama.cpp options among words of a quoted command line, with their values; other words dropped."""
    table = arg_table(tool)
    out: list[str] = []
    i = 0
    while i < len(tokens):
        entry = table.by_name.get(tokens[i].split("=", 1)[0] if tokens[i].startswith("--") else tokens[i])
        if entry is None:
            i += 1
            continue
        width = {"flag": 1, "bool": 1, "value": 2, "value2": 3}[entry[0].kind]
        if "=" in tokens[i] and tokens[i].startswith("--"):
            width = 1
        out.extend(tokens[i : i + width])
        i += width
    return tuple(out)


def parse_command(line: str) -> tuple[str, tuple[str, ...], dict[str, str]] | None:
    """A llama.cpp command line quoted in a log line: (tool, its options, NAME=value words before it)."""
    found = _COMMAND.search(line)
    if found is None:
        return None
    tool, text = found.group("tool"), found.group("args")
    try:
        words = shlex.split(text)
    except ValueError:  # an unbalanced quote: the command ends where the quoted shell text did
        words = re.split(r"['\"]", text, maxsplit=1)[0].split()
    tokens: list[str] = []
    for word in words:
        if word in _SHELL_STOP:
            break
        tokens.append(word.rstrip(";"))
        if word.endswith(";"):
            break
    env = dict(item.split("=", 1) for item in found.group("env").split())
    return tool, _known_args(tool, tokens), env


def read_log(text: str, table: SignatureTable) -> LogReading:
    """Everything explain needs from a log's text. Leading lines starting with '#' are a person's notes
    (as in tests/fixtures/logs/): they are never matched against signatures, only read for a command line."""
    lines = _NEWLINE.split(text)
    found: dict[str, Any] = {}
    matches: list[Match] = []
    errors: list[str] = []
    abort = refused = None
    available: tuple[tuple[str, str], ...] = ()
    phase: str | None = None
    phase_at_failure: str | None = None
    tools: set[str] = set()
    backends: list[tuple[str, str]] = []
    annotations = 0
    while annotations < len(lines) and lines[annotations].startswith("#"):
        command = parse_command(lines[annotations][1:])
        if command is not None:
            found["command"] = (*command, "the log's header comment")
        if (limit := _ULIMIT_V.search(lines[annotations])) is not None:
            found["ulimit"] = (int(limit.group("kib")) * 1024, f"ulimit -v {limit.group('kib')} in the header comment")
        annotations += 1
    for number, raw in enumerate(lines[annotations:], start=annotations + 1):
        line = clean_line(raw[:MAX_LINE])
        if not line:
            continue
        for name, pattern in _PHASES:
            if pattern.search(line):
                phase = name
        match = table.match_line(line)
        if match is not None:
            if match.category in ("alloc", "not_memory") and phase_at_failure is None:
                phase_at_failure = phase or "none"
            matches.append(match)
        level = _level(raw)
        aborted = _ABORT.match(line)
        stdout_error = _STDOUT_ERROR.search(line)
        if level == "E" or aborted:
            errors.append(line)
        elif stdout_error:
            errors.append(stdout_error.group(0))
        if aborted and abort is None:
            abort = aborted.group("msg")
        refusal = _OPENVINO_REFUSED.search(line)
        if refusal and refused is None:
            listed = parse_list_devices("", "\n".join(lines[number - 1 : number + 20]))
            refused, available = refusal.group("device"), listed.openvino_available
        _read_facts(line, number, found)
        tools.update(name for name, pattern in _TOOL_MARKS if pattern.search(line))
        backends.extend((name, f"line {number}") for name, pattern in _BACKEND_MARKS if pattern.search(line))
        if level is None and not match:
            command = parse_command(line)
            if command is not None:
                found["command"] = (*command, f"the command line on line {number}")
            if (limit := _ULIMIT_V.search(line)) is not None:
                found["ulimit"] = (int(limit.group("kib")) * 1024, f"ulimit -v {limit.group('kib')} on line {number}")
    facts = _facts(found, tools, backends, annotations)
    failure = classify(matches, None)
    return LogReading(
        facts=facts,
        matches=tuple(matches),
        failure=failure,
        stage=_PHASE_STAGE.get(phase_at_failure or "") if failure is not None and failure.memory else None,
        abort=abort,
        refused_device=refused,
        available_devices=available,
        error_lines=tuple(errors),
    )


def _read_facts(line: str, number: int, found: dict[str, Any]) -> None:
    """The facts one line states. A later line wins (--fit's dry runs print a set first), but the model:
    the first line naming it is the one loaded."""
    where = f"line {number}"
    if "model" not in found:
        for pattern in _MODEL_PATH:
            if (m := pattern.search(line)) is not None:
                found["model"] = (m.group("p").strip(), where)
                break
    if (m := _N_CTX.search(line)) is not None:
        found["n_ctx"] = (int(m.group("n")), f"{where} (llama_context: n_ctx)")
    elif (m := _CTX_VS_TRAIN.search(line)) is not None:
        found["n_ctx_seq"] = (int(m.group("seq")), f"{where} (n_ctx_seq)")
        found["n_ctx_train"] = int(m.group("train"))
    elif (m := _KV_CREATING.search(line)) is not None:
        found["kv_cells"] = (int(m.group("n")), f"{where} (KV cache cells)")
    if (m := _N_SEQ_MAX.search(line)) is not None:
        found["n_seq_max"] = int(m.group("n"))
    if (m := _N_CTX_TRAIN.search(line)) is not None:
        found["n_ctx_train"] = int(m.group("n"))
    if (m := _KV_TYPES.search(line)) is not None:
        found["types"] = (m.group("k"), m.group("v"))
    if (m := _USING_DEVICE.search(line)) is not None:
        found["device"] = (m.group("name"), "iGPU" in m.group("desc"))
    if _STARTED.search(line):
        found["started"] = True
    if _GPU_DEVICE.search(line):
        found["on_gpu"] = True


def _facts(found: Mapping[str, Any], tools: set[str], backends: list[tuple[str, str]], annotations: int) -> LogFacts:
    tool = next((name for name, _ in _TOOL_MARKS if name in tools), None)
    command = found.get("command")
    tool_from = "the log's lines" if tool else ""
    if tool is None and command is not None:
        tool, tool_from = command[0], command[3]
    n_ctx = found.get("n_ctx") or found.get("n_ctx_seq") or found.get("kv_cells")
    backend = next((b for b in backends if b[0] != "cpu"), backends[0] if backends else None)
    device = found.get("device")
    types = found.get("types")
    return LogFacts(
        tool=tool,
        tool_from=tool_from,
        model_path=found["model"][0] if "model" in found else None,
        model_from=found["model"][1] if "model" in found else "",
        n_ctx=n_ctx[0] if n_ctx else None,
        n_ctx_from=n_ctx[1] if n_ctx else "",
        n_ctx_train=found.get("n_ctx_train"),
        n_seq_max=found.get("n_seq_max"),
        type_k=types[0] if types else None,
        type_v=types[1] if types else None,
        backend=backend[0] if backend else None,
        backend_from=backend[1] if backend else "",
        on_gpu=True if found.get("on_gpu") else (False if backend and backend[0] == "cpu" else None),
        device=device[0] if device else None,
        integrated=True if device and device[1] else None,
        command_tool=command[0] if command else None,
        command_args=command[1] if command else (),
        command_env=command[2] if command else {},
        command_from=command[3] if command else "",
        started=bool(found.get("started")),
        annotation_lines=annotations,
        address_space_limit=found["ulimit"][0] if "ulimit" in found else None,
        address_space_from=found["ulimit"][1] if "ulimit" in found else "",
    )


_PHASE_STAGE = {"context": "context", "weights": "weights"}


# ---------------------------------------------------------------------------------------------------
# The failed run: what is known of its command line
# ---------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class FailedRun:
    """The failed command as far as it is known: explain's own arguments first, then the log."""

    tool: str
    tool_from: str
    args: tuple[str, ...]  # llama.cpp options, model and context included when known
    args_from: str
    env: Mapping[str, str]
    model_path: str | None
    model_from: str
    n_ctx: int | None  # the cells the failed allocation was sized for (padded, as llama.cpp did)
    n_ctx_from: str


def failed_run(facts: LogFacts, *, args: Sequence[str], model: str | None, tool: str | None) -> FailedRun:
    """Explicit values beat the log's lines, which beat a command line quoted in the log."""
    chosen_tool, tool_from = tool, "--tool"
    if chosen_tool is None:
        chosen_tool, tool_from = facts.tool, facts.tool_from
    if chosen_tool is None:
        chosen_tool, tool_from = "server", "not in the log: llama-server assumed"
    if args:
        base, args_from = tuple(args), "explain's arguments"
    elif facts.command_args and facts.command_tool == chosen_tool:
        base, args_from = facts.command_args, facts.command_from
    else:
        base, args_from = (), ""
    cmd = parse(chosen_tool, base, {})
    given_model = cmd.value("--model")
    model_path, model_from = model, "-m"
    if model_path is None and given_model is not None and args:
        model_path, model_from = str(given_model), "explain's arguments"
    if model_path is None and facts.model_path is not None:
        model_path, model_from = facts.model_path, facts.model_from
    if model_path is None and given_model is not None:
        model_path, model_from = str(given_model), args_from
    changes: dict[str, str | bool] = {}
    if model_path is not None and given_model is None:
        base = ("-m", model_path, *base)  # first, where people put it
        cmd = parse(chosen_tool, base, {})
    elif model_path is not None and given_model != model_path:
        changes["--model"] = model_path
    asked = cmd.value("--ctx-size")
    n_ctx, n_ctx_from = facts.n_ctx, facts.n_ctx_from
    if asked is not None and str(asked).isdigit() and int(str(asked)) > 0 and (args or n_ctx is None):
        n_ctx, n_ctx_from = pad(int(str(asked))), f"{args_from}: -c {asked}"
    if asked is None and n_ctx is not None:
        changes["--ctx-size"] = str(n_ctx)
    final = tuple(rewrite(cmd, changes))
    return FailedRun(
        tool=chosen_tool,
        tool_from=tool_from,
        args=final,
        args_from=args_from,
        env=dict(facts.command_env) if args_from == facts.command_from and args_from else {},
        model_path=model_path,
        model_from=model_from,
        n_ctx=n_ctx,
        n_ctx_from=n_ctx_from,
    )


def ready_command(
    run: FailedRun, changes: Mapping[str, str | bool], env: Mapping[str, str], *, argv: Sequence[str] | None = None
) -> str:
    """A command line to paste: environment, the tool, the failed run's options with the changes; redacted."""
    if argv is None:
        argv = rewrite(parse(run.tool, run.args, {}), changes)
    words = [f"{k}={shlex.quote(v)}" for k, v in redact_env({**run.env, **env}).items()]
    words.append(TOOL_BINARY[run.tool])
    words += [shlex.quote(a) for a in redact_argv(argv)]
    return " ".join(words)


# ---------------------------------------------------------------------------------------------------
# Remedies
# ---------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Remedy:
    step: str  # stateful, ctx, kv-q8, kv-q4, ngl, safe-llama, or a not-memory fix
    summary: str
    detail: str
    command: str | None  # ready to paste; None when the log lacks a number it needs
    env: Mapping[str, str] = field(default_factory=dict)
    argv_changes: Mapping[str, str | bool] = field(default_factory=dict)
    notes: tuple[str, ...] = ()


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

    @property
    def exit_code(self) -> int:
        return EXIT_CODES[self.status]


def _bytes(n: int | None) -> str:
    return "an unknown amount" if n is None else f"{n:,} bytes ({human(n)})"


def _where(failure: Failure, backend: str | None) -> str:
    buffer = failure.buffer or ""
    if buffer in ("", "CPU") and backend in (None, "cpu", "openvino") and failure.limit_bytes is None:
        return "host memory (RAM, a cgroup memory limit, or ulimit -v)"
    if failure.limit_bytes is not None:
        return "the device"
    return f"{buffer}'s memory" if buffer else "the device's memory"


def stage_of(reading: LogReading, words: Words) -> str | None:
    """What the failed allocation was for: a signature that says so, else the phase the log was in."""
    if reading.failure is None or not reading.failure.memory:
        return None
    for match in (m for m in reading.matches if m.category in ("alloc", "context")):
        stage = words.signatures.get(match.signature_id, {}).get("stage")
        if stage:
            return stage
    return reading.stage


def _probe_target(backend: str, version: str | None) -> Target:
    return Target(backend=backend, host_budget=Sourced(0, "declared", "unused"), binary_version=version)


def _type_bytes(type_name: str) -> Fraction:
    return Fraction(row_bytes(type_name, block_size(type_name)), block_size(type_name))


def _grid(budget: int | Fraction, bytes_at: int | Fraction, cells: int, unit: int = GRID) -> int:
    """The largest multiple of `unit` tokens whose bytes (bytes_at at `cells`, proportional) fit in budget."""
    if bytes_at <= 0:
        return 0
    return int(Fraction(budget) * cells / (Fraction(bytes_at) * unit)) * unit


def step_notes(
    step: str, backend: str, kv_bytes: int | None, policy: Policy, *, tool: str, model_known: bool
) -> list[str]:
    """The caveats of a remedy, the same whether it was planned or computed from the log."""
    if step == "stateful":
        held = f" ({human(kv_bytes)})" if kv_bytes is not None else ""
        slot = ", and llama-server runs a single slot (-np 1)" if tool == "server" else ""
        return [
            "not OpenVINO's default mode: the workaround verified in the original report",
            f"host RAM must then hold the KV cache{held}{slot}",
        ]
    notes = []
    if step in ("kv-q8", "kv-q4"):
        if not model_known:
            notes.append("a quantized K cache needs head sizes divisible by 32: not checked without the model")
        if backend == "openvino" and not policy.openvino_q8:
            notes.append("q8_0 was never verified on OpenVINO, so it is not offered there")
    return notes


@dataclass(frozen=True)
class _Numbers:
    """What the log's numbers say a remedy must fit: the failed allocation and the budget it must get under."""

    requested: int
    budget: Fraction  # the device's limit less the margin, or the retry rule's share of the failed allocation
    budget_words: str
    device_limit: bool
    n_ctx: int | None  # the cells the failed allocation was sized for
    backend: str
    types: tuple[str, str]  # K and V cache types of the failed run

    @property
    def bytes_per_element(self) -> Fraction:
        return (_type_bytes(self.types[0]) + _type_bytes(self.types[1])) / 2


def _numbers(failure: Failure, backend: str, run: FailedRun, facts: LogFacts, policy: Policy) -> _Numbers | None:
    requested, limit = failure.requested_bytes, failure.limit_bytes
    if requested is None:
        return None
    types = (facts.type_k or "f16", facts.type_v or "f16")
    if limit is not None and requested > limit:
        margin = int(policy.per_backend(policy.max_alloc_margin, backend))
        words = f"the limit less safe-llama's {human(margin)} margin ({limit - margin:,} bytes)"
        return _Numbers(requested, Fraction(limit - margin), words, True, run.n_ctx, backend, types)
    words = (
        f"{SHRINK.numerator}/{SHRINK.denominator} of the allocation that failed "
        "(how much memory that run had is not in the log)"
    )
    return _Numbers(requested, requested * SHRINK, words, False, run.n_ctx, backend, types)


def _stateful_remedy(n: _Numbers, run: FailedRun, facts: LogFacts, policy: Policy) -> Remedy | None:
    if n.backend != "openvino" or not n.device_limit:
        return None  # only OpenVINO moves the KV cache to the device, and only a device limit is escaped this way
    changes: dict[str, str | bool] = {"--parallel": "1"} if run.tool == "server" and facts.n_seq_max != 1 else {}
    env = {STATEFUL_ENV: "1"}
    return Remedy(
        "stateful",
        _STEP_SUMMARY["stateful"],
        "OpenVINO then makes no device object for the KV cache, so the device's per-allocation limit no longer "
        "applies to it",
        ready_command(run, changes, env),
        env,
        changes,
        tuple(step_notes("stateful", n.backend, n.requested, policy, tool=run.tool, model_known=False)),
    )


def _ctx_remedy(n: _Numbers, run: FailedRun, facts: LogFacts, policy: Policy) -> Remedy | None:
    if n.n_ctx is None:
        share = float(n.budget / n.requested)
        return Remedy(
            "ctx",
            f"a smaller context: at most {share:.2%} of the one that failed",
            f"the largest multiple of 256 tokens at or under {share:.2%} of the failed run's context keeps the "
            f"allocation within {n.budget_words}; the log does not say that context: give it to explain "
            "(safe-llama explain FILE -c N) for the exact number",
            None,
        )
    ctx = _grid(n.budget, n.requested, n.n_ctx)
    if ctx < GRID:
        return None
    changes: dict[str, str | bool] = {"--ctx-size": str(ctx)}
    return Remedy(
        "ctx",
        f"a smaller context: -c {ctx}",
        f"-c {ctx} is the largest multiple of 256 whose allocation ({_bytes(n.requested * ctx // n.n_ctx)}) stays "
        f"within {n.budget_words}",
        ready_command(run, changes, {}),
        {},
        changes,
        () if ctx >= policy.ctx_floor else (f"below safe-llama's floor of {policy.ctx_floor} tokens",),
    )


def _quant_remedy(quant: str) -> Callable[[_Numbers, FailedRun, LogFacts, Policy], Remedy | None]:
    step = "kv-q8" if quant == "q8_0" else "kv-q4"

    def remedy(n: _Numbers, run: FailedRun, facts: LogFacts, policy: Policy) -> Remedy | None:
        if n.backend == "openvino" and quant == "q8_0" and not policy.openvino_q8:
            return None
        if _type_bytes(quant) >= n.bytes_per_element:
            return None  # the cache is already this small
        factor = _type_bytes(quant) / n.bytes_per_element
        new = n.requested * factor
        share = f"{quant} takes {float(factor):.1%} of the {n.types[0]}/{n.types[1]} cache"
        changes: dict[str, str | bool] = {"--cache-type-k": quant, "--cache-type-v": quant, "--flash-attn": "on"}
        caveats = tuple(step_notes(step, n.backend, n.requested, policy, tool=run.tool, model_known=False))
        if new <= n.budget:
            summary = f"a quantized cache: {quant} K and V at the same context"
            detail = (
                f"{share}: {_bytes(round(new))}, within {n.budget_words}; flash attention on, as a quantized V "
                "cache requires"
            )
        elif n.n_ctx is not None:
            ctx = _grid(n.budget, new, n.n_ctx)
            if ctx < GRID:
                return None
            changes["--ctx-size"] = str(ctx)
            summary = f"a quantized cache: {quant} K and V at -c {ctx}"
            detail = f"{share}; -c {ctx} is the largest context whose cache stays within {n.budget_words}"
        else:
            at_most = float(n.budget / new)
            summary = f"a quantized cache ({quant}) and a context at most {at_most:.2%} of the one that failed"
            return Remedy(step, summary, share, None, {}, changes, caveats)
        return Remedy(step, summary, detail, ready_command(run, changes, {}), {}, changes, caveats)

    return remedy


# The ladder's steps that the log's numbers alone can compute (ngl needs the model's layer sizes).
_NUMBER_STEPS: Mapping[str, Callable[[_Numbers, FailedRun, LogFacts, Policy], Remedy | None]] = {
    "stateful": _stateful_remedy,
    "ctx": _ctx_remedy,
    "kv-q8": _quant_remedy("q8_0"),
    "kv-q4": _quant_remedy("q4_0"),
}


def number_remedies(
    failure: Failure, stage: str | None, facts: LogFacts, run: FailedRun, policy: Policy
) -> tuple[list[Remedy], list[str]]:
    """What would fit, from the log's numbers alone (no model): the failed allocation against the limit,
    step by step in the order of the backend's degrade ladder (configs/planner.toml)."""
    if stage not in (None, "kv", "context"):
        return _stage_remedies(stage, run), []
    backend = facts.backend or "cpu"
    numbers = _numbers(failure, backend, run, facts, policy)
    if numbers is None:
        return [], ["the log gives no size for the failed allocation: nothing to compute a context from"]
    notes = []
    if facts.type_k is None:
        notes.append("the KV cache types are not in the log (only at -lv 4): f16, llama.cpp's default, assumed")
    remedies = []
    for step in policy.ladder_for(backend, run.tool):
        compute = _NUMBER_STEPS.get(step)
        found = compute(numbers, run, facts, policy) if compute is not None else None
        if found is not None:
            remedies.append(found)
        elif step == "ngl" and facts.on_gpu:
            notes.append("fewer layers on the GPU (-ngl) is not computed: it needs the model's layer sizes (-m MODEL)")
    return remedies, notes


def _per_token(requested: int, n_ctx: int) -> str:
    per = Fraction(requested, n_ctx)
    if per.denominator == 1:
        return f"{requested:,} bytes = {int(per):,} bytes per token x {n_ctx} tokens"
    return f"{requested:,} bytes at {n_ctx} tokens, about {float(per):,.0f} bytes per token"


def _stage_remedies(stage: str, run: FailedRun) -> list[Remedy]:
    if stage == "compute":
        return [
            Remedy(
                "batch",
                "smaller batches or context",
                "the compute buffers grow with -ub (and -b) and with the context: llama.cpp's defaults are "
                "-b 2048 -ub 512",
                ready_command(run, {"--ubatch-size": "512", "--batch-size": "2048"}, {}),
                {},
                {"--ubatch-size": "512", "--batch-size": "2048"},
            )
        ]
    if stage == "weights":
        return [
            Remedy(
                "weights",
                "a smaller model file, or more memory",
                "the weights alone did not fit: a smaller quantization of the model (Q4_K_M instead of Q8_0, ...), "
                "fewer layers on a GPU (-ngl) when it was device memory, or a higher limit (ulimit -v, cgroup)",
                None,
            )
        ]
    return []


def plan_remedies(
    prepared: Prepared, target: Target, policy: Policy, failure: Failure, run: FailedRun, *, kv_failed: bool
) -> tuple[list[Remedy], list[str], Plan | None]:
    """What would fit, planned exactly from the model's facts against `target` (the limit learned from the
    log included): each step of the backend's ladder on its own, then the whole ladder (what safe-llama
    would launch). When the command fits this machine as asked, the failed run had less memory: if the KV
    cache was what failed (`kv_failed`), the plans stay under the share of it safe-llama's retry would take."""
    from safe_llama.run.prepare import final_argv

    notes: list[str] = []
    req = prepared.request
    ngl = req.n_gpu_layers
    user_ngl = int(ngl) if ngl is not None and ngl.lstrip("-").isdigit() and int(ngl) >= 0 else None
    user_fit = prepared.cmd.get("--fit") is not None
    as_asked = allocations(prepared.facts, Settings(kv=req.kv, n_gpu_layers=user_ngl), target, policy)
    if failure.memory and all(a.fits for a in as_asked):
        named = [a.limit_words for a in as_asked if a.limit < UNKNOWN_HOST // 2]
        notes.append(
            "as asked, the command fits "
            + (f"every limit the log names ({'; '.join(named)})" if named else "everything the log says of its machine")
            + ": that run had less memory than it needed (a ulimit -v, a cgroup limit, other programs), and how "
            "much is not in the log"
        )
        if not kv_failed:
            return [], notes, None
        failed_kv = plan_kv(prepared.facts, req.kv).total_bytes
        cap = int(failed_kv * SHRINK)
        notes.append(
            f"the plans keep the KV cache at or under {human(cap)}, {SHRINK.numerator}/{SHRINK.denominator} of "
            f"the {human(failed_kv)} that failed"
        )
        target = replace(target, kv_cap=cap)

    def attempt(ladder: Sequence[str] | None) -> Plan | None:
        try:
            return plan(prepared.facts, req.kv, target, policy, ladder=ladder, user_fit_set=user_fit, user_ngl=user_ngl)
        except SafeLlamaError as err:
            if err.status != ExitStatus.NOTHING_FITS:
                raise
            if ladder is None:
                notes.append(err.message.removeprefix("safe-llama: "))
            return None

    remedies: list[Remedy] = []
    kv_bytes = plan_kv(prepared.facts, req.kv).total_bytes
    for step in policy.ladder_for(target.backend, req.kv.tool):
        decided = attempt((step,))
        if decided is None or step not in [s.name for s in decided.steps]:
            continue
        argv = final_argv(replace(prepared, plan=decided, target=target))
        summary = _STEP_SUMMARY.get(step, step)
        if step == "ctx":
            summary += f": -c {decided.argv_changes.get('--ctx-size')}"
        remedies.append(
            Remedy(
                step,
                summary,
                _remedy_size(decided, step),
                ready_command(run, decided.argv_changes, decided.env_changes, argv=argv),
                dict(decided.env_changes),
                dict(decided.argv_changes),
                (*decided.notes, *step_notes(step, target.backend, kv_bytes, policy, tool=run.tool, model_known=True)),
            )
        )
    return remedies, notes, attempt(None)


def _remedy_size(decided: Plan, step: str) -> str:
    """The remedy's own size against the tightest limit the log names (not the size that failed); a step that
    moves the allocation off that limit (stateful) says what it did instead."""
    named = [a for a in decided.allocations if a.limit < UNKNOWN_HOST // 2]
    if named and step != "stateful":
        return describe(max(named, key=lambda a: a.bytes / max(a.limit, 1)))
    return "; ".join(s.reason for s in decided.steps if s.name == step)


_STEP_SUMMARY = {
    "stateful": "stateful execution: keep the KV cache in host RAM",
    "ctx": "a smaller context",
    "kv-q8": "a quantized cache: q8_0 K and V",
    "kv-q4": "a quantized cache: q4_0 K and V",
    "ngl": "fewer layers on the GPU",
}


def log_target(facts: LogFacts, failure: Failure, policy: Policy) -> tuple[Target, str | None]:
    """The machine that wrote the log, as far as the log tells: its backend and device, the limit its own
    error named, a `ulimit -v` it quotes. Nothing of this machine: explain may run anywhere."""
    backend = facts.backend or "cpu"
    on_gpu = bool(facts.on_gpu) and backend != "cpu"
    limits: tuple[HostLimit, ...] = ()
    budget = Sourced(UNKNOWN_HOST, "declared", "not in the log")
    if facts.address_space_limit is not None:
        budget = Sourced(facts.address_space_limit, "declared", facts.address_space_from)
        limits = (HostLimit("address space", budget),)
    target = Target(
        backend=backend,
        host_budget=budget,
        address_space_budget=bool(limits),
        on_gpu=on_gpu,
        integrated=bool(facts.integrated),
        device=facts.device,
        host_limits=limits,
        kv_f16_copies=on_gpu and backend in policy.kv_f16_copy_backends,
        cpu_repack_types=policy.cpu_repack_types,
    )
    target = with_learned(target, failure.limit_bytes if on_gpu else None)
    note = None
    if on_gpu and facts.integrated is None:
        note = "whether that GPU is integrated is not in the log: planned as a discrete one"
    return target, note


def _kv_identity(prepared: Prepared, requested: int | None) -> tuple[str | None, bool]:
    """When the failed allocation is exactly one of this model's KV caches, say so (and that it was whole)."""
    if requested is None:
        return None, False
    kv = plan_kv(prepared.facts, prepared.request.kv)
    for cache in kv.caches:
        if requested == cache.total_bytes:
            per_cell = cache.total_bytes // max(cache.cells * cache.n_stream, 1)
            kind = "" if len(kv.caches) == 1 else f"{cache.kind} "
            return (
                f"that is exactly this model's {kind}KV cache at this context: {cache.layers} layers x "
                f"{cache.cells} cells, K {cache.type_k} and V {cache.type_v}, {per_cell:,} bytes per token",
                True,
            )
    return None, False


def explain(
    reading: LogReading,
    run: FailedRun,
    words: Words,
    policy: Policy,
    *,
    source: str,
    prepared: Prepared | None = None,
    model_note: str | None = None,
) -> Explanation:
    """The explanation of a read log: the failure in words, why, and the remedies (planned from `prepared`,
    commands.prepare's result for the failed command, when given; else from the log's numbers)."""
    failure = reading.failure
    facts = reading.facts
    notes = [n for n in (model_note,) if n]
    if failure is None or (reading.refused_device is not None and not failure.memory):
        return _unsigned(reading, run, words, source, notes)
    binary = TOOL_BINARY[run.tool]
    stage = stage_of(reading, words)
    said = words.for_signature(failure.signature_id, failure.kind if failure.kind != "oom_killed" else "alloc")
    values = {
        "requested": _bytes(failure.requested_bytes),
        "limit": _bytes(failure.limit_bytes),
        "buffer": failure.buffer or "device",
        "where": _where(failure, facts.backend),
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
        identity, whole_cache = _kv_identity(prepared, failure.requested_bytes)
        if whole_cache and failure.limit_bytes is not None and target.kv_split is None:
            # the device was asked for a whole cache at once: this build does not split it, whatever its version
            target, one_buffer = replace(target, kv_split=False), True
        version = target.binary_version
        kv_failed = stage in ("kv", "context", None)
        planned, plan_notes, whole = plan_remedies(prepared, target, policy, failure, run, kv_failed=kv_failed)
        why += [identity] if identity else []
        remedies += [
            *planned,
            *([] if kv_failed else _stage_remedies(stage or "", run)),
            _safe_llama_remedy(run, whole),
        ]
        notes += plan_notes
    else:
        basis = "numbers"
        if failure.requested_bytes is not None and run.n_ctx is not None and stage in ("kv", "context", None):
            why.append(_per_token(failure.requested_bytes, run.n_ctx))
        computed, number_notes = number_remedies(failure, stage, facts, run, policy)
        remedies += [*computed, _safe_llama_remedy(run, None)]
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


def _safe_llama_remedy(run: FailedRun, whole: Plan | None) -> Remedy:
    args = " ".join(shlex.quote(a) for a in redact_argv(list(run.args)))
    if whole is not None and whole.steps:
        detail = "it would: " + "; ".join(s.reason for s in whole.steps)
    else:
        detail = (
            "it plans against this machine's limits, and after an allocation failure retries smaller, "
            "learning the device's limit from its message"
        )
    return Remedy("safe-llama", "or let safe-llama plan it", detail, f"safe-llama {run.tool} {args}".rstrip())


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
        if _STDOUT_ERROR.match(line):
            notes.append(f"{binary} prints the cause on stderr: explain that (run it with 2> FILE)")
    else:
        started = " and shows it started" if reading.facts.started else ""
        return Explanation(
            status="no-failure", source=source, what=f"no failure found: the log has no error line{started}",
            why=(), line=None, kind=None, signature_id=None, memory=False, stage=None, requested_bytes=None,
            limit_bytes=None, basis="none", remedies=(), notes=tuple(notes), run=run, log=reading.facts,
        )  # fmt: skip
    why = fill(said.get("why", ""), values)
    return Explanation(
        status=status, source=source, what=f"{binary} failed to start: " + fill(said.get("what", ""), values),
        why=(why,) if why and why != line else (), line=line, kind=kind, memory=False,
        signature_id=reading.failure.signature_id if reading.failure else None,
        stage=None, requested_bytes=None, limit_bytes=None, basis="none", remedies=tuple(remedies),
        notes=tuple(notes), run=run, log=reading.facts,
    )  # fmt: skip


# ---------------------------------------------------------------------------------------------------
# Rendering
# ---------------------------------------------------------------------------------------------------


def to_json(expl: Explanation) -> str:
    body = dataclasses.asdict(expl)
    return json.dumps({"schema": 1, **body, "exit_code": expl.exit_code}, indent=1, default=str)


def render_text(expl: Explanation) -> str:
    lines = [f"What   {expl.what}."]
    for number, reason in enumerate(expl.why):
        lines.append(f"{'Why' if number == 0 else '':<7}{reason[0].upper()}{reason[1:]}.")
    if expl.line:
        lines.append(f"Line   {expl.line}")
    run, log = expl.run, expl.log
    known = [f"tool {TOOL_BINARY[run.tool]} ({run.tool_from})"]
    if run.model_path:
        known.append(f"model {run.model_path} ({run.model_from})")
    if run.n_ctx:
        known.append(f"context {run.n_ctx} ({run.n_ctx_from})")
    if log.backend:
        known.append(f"backend {log.backend}{' GPU' if log.on_gpu else ''}")
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


def _read_input(file: str, stdin: Any) -> str:
    try:
        if file == "-":
            data: bytes = stdin.buffer.read() if hasattr(stdin, "buffer") else stdin.read()
        else:
            data = Path(file).read_bytes()
    except OSError as err:
        # a log that cannot be read is a bad argument (2), not a bad model (65)
        raise SafeLlamaError(f"safe-llama: explain: {file}: {err.strerror or err}", ExitStatus.USAGE) from None
    return data.decode("utf-8", errors="replace")


def _model_inputs(
    run: FailedRun, reading: LogReading, policy: Policy, env: Mapping[str, str]
) -> tuple[Prepared | None, str | None]:
    """The failed command with its model's facts (the GGUF header, when the file is here) and the log's
    machine as the target; or why not. Probes nothing: no llama.cpp, no OpenCL, no sysfs."""
    from safe_llama.cmdline.request import to_request
    from safe_llama.model.facts_cache import facts_for
    from safe_llama.run.prepare import Prepared, layout_for

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
    return Prepared(cmd, request, run.model_path, facts, target, None, None, None, None, layout, notes), None


def run_explain(
    *,
    file: str,
    args: Sequence[str] = (),
    model: str | None = None,
    tool: str | None = None,
    json_out: bool = False,
    env: Mapping[str, str] = os.environ,
    stdin: Any = None,
    out: TextIO | None = None,
) -> int:
    """`safe-llama explain`: read, explain, print; the exit code (0 explained, 1 nothing recognised)."""
    from safe_llama.paths import config_dir, configs_dir
    from safe_llama.plan.policy import load_policy
    from safe_llama.run.signatures import load_table

    text = _read_input(file, sys.stdin if stdin is None else stdin)
    table = load_table(Path(env["SAFE_LLAMA_SIGNATURES"]) if env.get("SAFE_LLAMA_SIGNATURES") else None)
    words = load_words(configs_dir(env) / "explain.toml")
    policy = load_policy(configs_dir(env) / "planner.toml", config_dir(env) / "config.toml")
    reading = read_log(text, table)
    run = failed_run(reading.facts, args=args, model=model, tool=tool)
    prepared = note = None
    if reading.failure is not None and reading.failure.memory:
        prepared, note = _model_inputs(run, reading, policy, env)
    expl = explain(reading, run, words, policy, source=file, prepared=prepared, model_note=note)
    stream = sys.stdout if out is None else out
    stream.write(to_json(expl) + "\n" if json_out else render_text(expl))
    return expl.exit_code
