"""Issue 33: a GGUF header that declares gigabytes (long strings, many long arrays, in a sparse file) costs
`plan` a bounded amount of memory; what is above llama.cpp's own caps or the reader's budget is one line,
exit 65. Memory is measured as the peak RSS (VmHWM) of a child process that reads the files."""

from __future__ import annotations

import json
import os
import resource
import struct
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from safe_llama.errors import ExitStatus
from safe_llama.model import gguf_header
from safe_llama.model.gguf_header import GGUFError, SkippedArray, SkippedString, read_header
from tests.tiny_gguf import write_tiny_gguf

CEILING = 64 << 20  # bytes of peak RSS above the reading child's own, whatever the header declares
STRING, ARRAY, UINT8, FLOAT32 = 8, 9, 0, 6

# Reads the paths given on stdin, one per line, each answered with a JSON line: the outcome and VmHWM.
CHILD = r"""
import json, sys
from safe_llama.model.header_facts import model_facts
from safe_llama.model.gguf_header import GGUFError, read_header

def hwm():
    for line in open("/proc/self/status"):
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) * 1024

model_facts(read_header(sys.argv[1]))
print(json.dumps({"hwm": hwm()}), flush=True)
for path in sys.stdin:
    try:
        model_facts(read_header(path.rstrip("\n")))
        outcome = "ok"
    except GGUFError as err:
        outcome = "error: " + str(err)
    except BaseException as err:
        outcome = f"crash: {type(err).__name__}: {err}"
    print(json.dumps({"outcome": outcome, "hwm": hwm()}), flush=True)
"""


def gstr(raw: bytes) -> bytes:
    return struct.pack("<Q", len(raw)) + raw


class Reader:
    """The child process that reads headers, and its peak RSS after reading a small model (its baseline)."""

    def __init__(self, warm: Path) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, "-c", CHILD, str(warm)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
            preexec_fn=lambda: resource.setrlimit(resource.RLIMIT_AS, (4 << 30, 4 << 30)),
        )
        baseline = self._answer()["hwm"]
        assert isinstance(baseline, int)
        self.baseline = baseline

    def _answer(self) -> dict[str, object]:
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline()
        assert line, f"the reading child died (exit {self.proc.wait()})"
        answer: dict[str, object] = json.loads(line)
        return answer

    def read(self, path: Path) -> tuple[str, int]:
        """The outcome ("ok", "error: ...", "crash: ...") and the peak RSS above the baseline."""
        assert self.proc.stdin is not None
        self.proc.stdin.write(f"{path}\n")
        self.proc.stdin.flush()
        answer = self._answer()
        hwm = answer["hwm"]
        assert isinstance(hwm, int)
        return str(answer["outcome"]), hwm - self.baseline


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_tiny_gguf(tmp_path_factory.mktemp("tiny") / "tiny.gguf")


@pytest.fixture(scope="module")
def reader(tiny: Path) -> Iterator[Reader]:
    child = Reader(tiny)
    yield child
    assert child.proc.stdin is not None
    child.proc.stdin.close()
    child.proc.wait(timeout=10)


def inflate(tiny: Path, out: Path, extras: list[tuple[bytes, int]]) -> Path:
    """The tiny model with extra keys first: each (bytes written, then a hole of that many bytes), every
    key's name padded so that the extras keep the tensor data aligned. A sparse file: holes cost no disk."""
    original = tiny.read_bytes()
    n_tensors, n_kv = struct.unpack_from("<QQ", original, 8)
    with out.open("wb") as f:
        f.write(original[:8] + struct.pack("<QQ", n_tensors, n_kv + len(extras)))
        for i, (head, hole) in enumerate(extras):
            key = b"junk.%06d" % i
            key += b"x" * (-(8 + len(key) + len(head) + hole) % 32)
            f.write(gstr(key) + head)
            f.seek(hole, os.SEEK_CUR)
        f.write(original[24:])
    return out


def long_string(n: int) -> tuple[bytes, int]:
    return struct.pack("<IQ", STRING, n), n


def float_array(n: int) -> tuple[bytes, int]:
    return struct.pack("<IIQ", ARRAY, FLOAT32, n), 4 * n


# --- the rows ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "extras",
    [
        pytest.param([long_string(64 << 20)] * 16, id="16-strings-of-64MiB"),
        pytest.param([float_array(65536)] * 512, id="512-arrays-of-65536-floats"),
    ],
)
def test_declared_gigabytes_cost_bounded_memory(
    tiny: Path, reader: Reader, tmp_path: Path, extras: list[tuple[bytes, int]]
) -> None:
    path = inflate(tiny, tmp_path / "big.gguf", extras)
    assert path.stat().st_size > 128 << 20 and path.stat().st_blocks * 512 < 8 << 20  # sparse
    outcome, rss = reader.read(path)
    assert outcome == "ok"
    assert rss < CEILING, f"{rss >> 20} MiB above the baseline (the old reader took 1.1-1.4 GB)"


def test_plan_on_declared_gigabytes(tiny: Path, tmp_path: Path) -> None:
    """The whole `plan` command: it plans the model, and its peak RSS is the tiny model's."""
    path = inflate(tiny, tmp_path / "big.gguf", [long_string(64 << 20)] * 16)

    def peak(model: Path) -> int:
        env = {**os.environ, "XDG_CACHE_HOME": str(tmp_path / f"cache-{model.stem}"), "SAFE_LLAMA_REMEMBER": "0"}
        plan = [sys.executable, "-m", "safe_llama", "plan", "--json", "server", "-m", str(model), "-c", "1024"]
        wrapper = "import resource, subprocess, sys; subprocess.run(sys.argv[1:], check=True, capture_output=True);"
        wrapper += "print(resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss)"
        done = subprocess.run([sys.executable, "-c", wrapper, *plan], env=env, capture_output=True, text=True)
        assert done.returncode == 0, done.stderr
        return int(done.stdout) * 1024

    assert peak(path) < peak(tiny) + CEILING


# --- llama.cpp's caps and the reader's budget: one line, exit 65 -------------------------------------


def test_string_over_llama_cpp_limit(tiny: Path, tmp_path: Path) -> None:
    path = inflate(tiny, tmp_path / "huge.gguf", [long_string((1 << 30) + 1)])
    with pytest.raises(GGUFError) as caught:
        read_header(path)
    assert caught.value.status == ExitStatus.BAD_MODEL
    assert "string of 1073741825 bytes at byte 47 is over llama.cpp's limit of 1073741824" in str(caught.value)


def test_array_over_llama_cpp_limit(tiny: Path, tmp_path: Path) -> None:
    n = (1 << 30) + 1
    path = inflate(tiny, tmp_path / "huge.gguf", [(struct.pack("<IIQ", ARRAY, UINT8, n), n)])
    with pytest.raises(GGUFError) as caught:
        read_header(path)
    assert "of 1073741825 items at byte 75 is over llama.cpp's limit of 1073741824" in str(caught.value)


def test_long_values_are_skipped_unread(tiny: Path, tmp_path: Path) -> None:
    n = gguf_header.MAX_KEPT_STRING + 1
    header = read_header(inflate(tiny, tmp_path / "m.gguf", [long_string(n), float_array(100_000)]))
    skipped = [value for key, value in header.metadata.items() if key.startswith("junk.")]
    assert skipped == [SkippedString(n), SkippedArray(FLOAT32, 100_000)]
    assert header.metadata["general.architecture"] == "llama"


def test_too_much_to_keep(tiny: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Many small arrays, each worth keeping: above the budget the header is refused, naming where."""
    monkeypatch.setattr(gguf_header, "MAX_KEPT_BYTES", 1 << 20)
    path = inflate(tiny, tmp_path / "m.gguf", [float_array(1000)] * 100)
    with pytest.raises(GGUFError) as caught:
        read_header(path)
    message = str(caught.value)
    assert caught.value.status == ExitStatus.BAD_MODEL and "\n" not in message
    assert "header claims more than 1 MiB of metadata and tensor infos, the most safe-llama keeps (at key " in message


def test_key_name_over_the_cap(tiny: Path, tmp_path: Path) -> None:
    original = tiny.read_bytes()
    n_tensors, n_kv = struct.unpack_from("<QQ", original, 8)
    long_key = gstr(b"k" * (gguf_header.MAX_KEY_LENGTH + 1)) + struct.pack("<IB", UINT8, 0)
    path = tmp_path / "m.gguf"
    path.write_bytes(original[:8] + struct.pack("<QQ", n_tensors, n_kv + 1) + long_key + original[24:])
    with pytest.raises(GGUFError) as caught:
        read_header(path)
    assert "key name of 65537 bytes at byte 24 is over the 65536 allowed (key 1 of " in str(caught.value)


# --- fuzzing: any shape of declared sizes stays under the ceiling -----------------------------------

ENTRY = st.one_of(
    st.tuples(st.just("string"), st.integers(0, 1 << 31)),
    st.tuples(st.just("numbers"), st.integers(0, 1 << 28)),
    st.tuples(st.just("strings"), st.integers(0, 1 << 21)),
)


@pytest.mark.slow
@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(entries=st.lists(ENTRY, min_size=1, max_size=64), lie=st.integers(-2, 2))
def test_fuzzed_declared_sizes(
    tiny: Path, reader: Reader, tmp_path: Path, entries: list[tuple[str, int]], lie: int
) -> None:
    """Strings up to 2 GiB, numeric arrays up to 2^28 items, string arrays up to 2^21 (empty) items, in
    any mix, and a key count that may be off: only a parse or a one-line GGUFError, under the ceiling."""
    extras = []
    for kind, n in entries:
        if kind == "string":
            extras.append(long_string(n))
        elif kind == "numbers":
            extras.append(float_array(n))
        else:
            extras.append((struct.pack("<IIQ", ARRAY, STRING, n), 8 * n))
    path = inflate(tiny, tmp_path / "fuzz.gguf", extras)
    if lie:
        with path.open("r+b") as f:
            f.seek(16)
            n_kv = struct.unpack("<Q", f.read(8))[0]
            f.seek(16)
            f.write(struct.pack("<Q", max(0, n_kv + lie)))
    outcome, rss = reader.read(path)
    assert outcome == "ok" or outcome.startswith("error: safe-llama: "), outcome
    assert "\n" not in outcome
    assert rss < CEILING, f"{rss >> 20} MiB above the baseline for {entries}"
    path.unlink()
