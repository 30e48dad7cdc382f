"""Reading a llama.cpp log (any tool, any verbosity, timestamps or not, colours, a leading `#` comment): the
failure through the signature table, and the facts around it (tool, model, context, backend, a quoted command
line); then the failed command as far as it is known (`failed_run`). Pure: text in, values out; must not read
files, probe, plan or word anything for people.
"""

from __future__ import annotations

import re
import shlex
from collections import deque
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from safe_llama.backends.registry import gpu_marks, log_marks
from safe_llama.cmdline.llama_args import parse
from safe_llama.device.llama_listing import parse_list_devices
from safe_llama.diagnosis.own_lines import OwnLine, OwnTable, own_text
from safe_llama.diagnosis.signatures import (
    ESCAPES,
    MAX_LINE,
    Failure,
    Match,
    SignatureTable,
    classify,
    clean_line,
)

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
# Which tool printed the log. llama-cli runs a server inside, so its marks are looked for first. safe-llama's
# line for a model not downloaded yet names the binary that downloads it (before it prints anything).
_TOOL_MARKS = (
    (
        "cli",
        re.compile(
            r"llama_server exited with code|the server exited before becoming ready|^available commands:"
            r"|\bllama-cli downloads it\b"
        ),
    ),
    ("server", re.compile(r"^srv\s|^slot\s|llama_server:|\bllama-server downloads it\b")),
    ("completion", re.compile(r"^llama_completion:|^generate: n_ctx|\bllama-completion downloads it\b")),
)
_BACKEND_MARKS = tuple((name, re.compile(marks)) for name, marks in log_marks())
_GPU_DEVICE = re.compile(gpu_marks())
_STARTED = re.compile(r"listening on http|main: model loaded|^generate: n_ctx|^available commands:")
# ggml_abort's "file:line: message" (GGML_ASSERT goes through it too).
_ABORT = re.compile(r"^(?P<file>\S+\.(?:c|cc|cpp|cu|h|hpp|m|mm)):(?P<lineno>\d+): (?P<msg>.+)$")
# llama-cli's own errors on stdout ("Error: the server exited before becoming ready"): the cause is on stderr.
STDOUT_ERROR = re.compile(r"(?:^|(?<=[\s\x08]))Error: .+")  # after a spinner: backspaces
_OPENVINO_REFUSED = re.compile(r"GGML_OPENVINO_DEVICE=(?P<device>\S+) is not available")
# A command line quoted in the log (a shell prompt, a header comment): NAME=value words, then the binary.
_COMMAND = re.compile(
    r"(?:^|[\s/'\"(])(?P<env>(?:[A-Za-z_][A-Za-z0-9_]*=\S*\s+)*)(?:\S*/)?(?:safe-)?llama-(?P<tool>cli|server|completion)"
    r"(?=\s|$)(?P<args>.*)$"
)
_SHELL_STOP = (";", "|", "||", "&&", "&", ">", "2>", "2>&1", ">>")
# The failed run's address-space limit, when the log quotes the shell line that set it (KiB, as bash takes it).
_ULIMIT_V = re.compile(r"\bulimit -v (?P<kib>\d+)\b")


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
    own: tuple[OwnLine, ...] = ()  # safe-llama's own lines (its plan, retries, the line it exited with)
    started_line: int | None = None  # the last line showing the tool ready or generating

    @property
    def own_exit(self) -> OwnLine | None:
        """The line safe-llama exited with, when the log has one."""
        return next((o for o in reversed(self.own) if o.exit is not None), None)

    @property
    def retries(self) -> tuple[OwnLine, ...]:
        return tuple(o for o in self.own if o.kind == "retry")


def _level(raw: str) -> str | None:
    found = _LEVEL.search(ESCAPES.sub("", raw))
    return found.group("level") if found else None


def parse_command(line: str) -> tuple[str, tuple[str, ...], dict[str, str]] | None:
    """A llama.cpp command line quoted in a log line: (tool, its options as llama.cpp reads them, NAME=value
    words before it). Words llama.cpp would reject are dropped."""
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
    return tool, parse(tool, tokens, {}).known_argv, env


# What a reader keeps of a log however long it is: each category's first matches (the first alloc or
# not_memory line decides), the first error lines, safe-llama's last own lines, and the lines after an
# OpenVINO refusal that list its devices. Lines are cut at MAX_LINE: memory is bounded by these, not the log.
KEEP_MATCHES = 64  # per category
KEEP_ERRORS = 64
KEEP_OWN = 256
_DEVICE_LIST_LINES = 20


class LogReader:
    """Reads a log one line at a time (`feed`), keeping a bounded summary; `reading()` is what it says so
    far, at any point (a stream followed for days included). Leading lines starting with '#' are a
    person's notes (as in tests/fixtures/logs/): they are never matched against signatures, only read for
    a command line. safe-llama's own lines are named by own_table and never matched as llama.cpp's (a
    retry line quotes llama.cpp's failure)."""

    def __init__(self, table: SignatureTable, own_table: OwnTable | None = None) -> None:
        self._table = table
        self._own_table = own_table or OwnTable()
        self.lines = 0  # lines fed
        self._heading = True  # still in the leading '#' notes
        self._annotations = 0
        self._own: deque[OwnLine] = deque(maxlen=KEEP_OWN)
        self._started_line: int | None = None
        self._found: dict[str, Any] = {}
        self._matches: list[Match] = []
        self._per_category: dict[str, int] = {}
        self._errors: list[str] = []
        self._abort: str | None = None
        self._refused: str | None = None
        self._refusal_lines: list[str] | None = None  # the lines after a refusal, until the device list is read
        self._available: tuple[tuple[str, str], ...] = ()
        self._phase: str | None = None
        self._phase_at_failure: str | None = None
        self._tools: set[str] = set()
        self._backends: dict[str, str] = {}  # backend -> the first line that named it, in order

    def feed(self, raw: str) -> None:
        """One line of the log (without its newline)."""
        self.lines += 1
        number = self.lines
        if self._heading and raw.startswith("#"):
            command = parse_command(raw[1:])
            if command is not None:
                self._found["command"] = (*command, "the log's header comment")
            if (limit := _ULIMIT_V.search(raw)) is not None:
                self._found["ulimit"] = (
                    int(limit.group("kib")) * 1024,
                    f"ulimit -v {limit.group('kib')} in the header comment",
                )
            self._annotations += 1
            return
        self._heading = False
        if self._refusal_lines is not None:
            self._refusal_lines.append(raw[:MAX_LINE])
            if len(self._refusal_lines) > _DEVICE_LIST_LINES:
                self._read_device_list()
        line = clean_line(raw[:MAX_LINE])
        if not line:
            return
        said = own_text(line)
        if said is not None:
            self._own.append(self._own_table.match(said, number))
            self._tools.update(name for name, pattern in _TOOL_MARKS if pattern.search(said))
            return
        for name, pattern in _PHASES:
            if pattern.search(line):
                self._phase = name
        match = self._table.match_line(line)
        if match is not None:
            if match.category in ("alloc", "not_memory") and self._phase_at_failure is None:
                self._phase_at_failure = self._phase or "none"
            if self._per_category.get(match.category, 0) < KEEP_MATCHES:
                self._per_category[match.category] = self._per_category.get(match.category, 0) + 1
                self._matches.append(match)
        level = _level(raw)
        aborted = _ABORT.match(line)
        stdout_error = STDOUT_ERROR.search(line)
        if len(self._errors) < KEEP_ERRORS and (level == "E" or aborted):
            self._errors.append(line)
        elif len(self._errors) < KEEP_ERRORS and stdout_error:
            self._errors.append(stdout_error.group(0))
        if aborted and self._abort is None:
            self._abort = aborted.group("msg")
        refusal = _OPENVINO_REFUSED.search(line)
        if refusal and self._refused is None:
            self._refused, self._refusal_lines = refusal.group("device"), [raw[:MAX_LINE]]
        _read_facts(line, number, self._found)
        if _STARTED.search(line):
            self._started_line = number
        self._tools.update(name for name, pattern in _TOOL_MARKS if pattern.search(line))
        for name, pattern in _BACKEND_MARKS:
            if name not in self._backends and pattern.search(line):
                self._backends[name] = f"line {number}"
        if level is None and not match:
            command = parse_command(line)
            if command is not None:
                self._found["command"] = (*command, f"the command line on line {number}")
            if (limit := _ULIMIT_V.search(line)) is not None:
                self._found["ulimit"] = (
                    int(limit.group("kib")) * 1024,
                    f"ulimit -v {limit.group('kib')} on line {number}",
                )

    def _read_device_list(self) -> None:
        if self._refusal_lines is not None:
            self._available = parse_list_devices("", "\n".join(self._refusal_lines)).openvino_available
            self._refusal_lines = None

    @property
    def failed(self) -> bool:
        """Whether the log so far shows something to explain: a failure line, an abort, an error line, an
        OpenVINO refusal, safe-llama's own exit."""
        return bool(classify(self._matches, None) or self._abort or self._errors or self._refused) or any(
            o.exit is not None for o in self._own
        )

    def reading(self) -> LogReading:
        """What the log says so far."""
        if self._refusal_lines is not None:  # so far, the log ends within the device list
            self._available = parse_list_devices("", "\n".join(self._refusal_lines)).openvino_available
        matches = tuple(self._matches)
        failure = classify(matches, None)
        return LogReading(
            facts=_facts(self._found, self._tools, list(self._backends.items()), self._annotations),
            matches=matches,
            failure=failure,
            # what the deciding line itself says it was for (a KV tensor's name) over the phase it came in
            stage=(failure.stage or _PHASE_STAGE.get(self._phase_at_failure or ""))
            if failure is not None and failure.memory
            else None,
            abort=self._abort,
            refused_device=self._refused,
            available_devices=self._available,
            error_lines=tuple(self._errors),
            own=tuple(self._own),
            started_line=self._started_line,
        )


def read_log(text: str, table: SignatureTable, own_table: OwnTable | None = None) -> LogReading:
    """Everything explain needs from a log's whole text (LogReader, fed every line)."""
    reader = LogReader(table, own_table)
    for line in _NEWLINE.split(text):
        reader.feed(line)
    return reader.reading()


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
