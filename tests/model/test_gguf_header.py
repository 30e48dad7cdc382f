"""Tests for safe_llama.model.gguf_header: real files (the bundled model, tiny generated ones), every class of bad
file, and a fuzz test that mutates a real header and accepts only a parse or a one-line GGUFError."""

from __future__ import annotations

import os
import random
import struct
import time
import tracemalloc
from collections.abc import Callable
from pathlib import Path

import gguf
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from safe_llama.errors import ExitStatus
from safe_llama.model import gguf_header
from safe_llama.model.gguf_header import GGUFError, SkippedArray, read_header
from safe_llama.model.header_facts import model_facts
from tests.tiny_gguf import DEFAULT_WORDS, write_tiny_gguf

STRING, ARRAY, UINT32, FLOAT32, UINT8 = 8, 9, 4, 6, 0
F32, Q8_0 = 0, 8
# enough extra pieces that the token list is longer than MAX_KEPT_STRINGS and gets skipped
BIG_VOCAB = DEFAULT_WORDS + tuple(f"w{i}" for i in range(1200))


# --- a byte-level GGUF builder for hand-made files -------------------------------------------------


def u32(n: int) -> bytes:
    return struct.pack("<I", n)


def u64(n: int) -> bytes:
    return struct.pack("<Q", n)


def gstr(text: str | bytes) -> bytes:
    raw = text.encode() if isinstance(text, str) else text
    return u64(len(raw)) + raw


def kv(key: str, value_type: int, payload: bytes) -> bytes:
    return gstr(key) + u32(value_type) + payload


def kv_str(key: str, value: str) -> bytes:
    return kv(key, STRING, gstr(value))


def kv_u32(key: str, value: int) -> bytes:
    return kv(key, UINT32, u32(value))


def tensor(name: str, dims: tuple[int, ...], ggml_type: int = F32, offset: int = 0) -> bytes:
    return gstr(name) + u32(len(dims)) + b"".join(u64(d) for d in dims) + u32(ggml_type) + u64(offset)


def gguf_bytes(
    kvs: list[bytes],
    tensors: list[bytes] = (),  # type: ignore[assignment]
    *,
    data: bytes = b"",
    version: int = 3,
    n_kv: int | None = None,
    n_tensors: int | None = None,
    alignment: int = 32,
) -> bytes:
    head = b"GGUF" + u32(version) + u64(len(tensors) if n_tensors is None else n_tensors)
    head += u64(len(kvs) if n_kv is None else n_kv)
    body = head + b"".join(kvs) + b"".join(tensors)
    return body + bytes(-len(body) % alignment) + data


GOOD_KVS = [kv_str("general.architecture", "llama"), kv_u32("general.alignment", 32)]
GOOD = gguf_bytes(GOOD_KVS, [tensor("t", (32,))], data=bytes(128))


@pytest.fixture
def write(tmp_path: Path) -> Callable[[bytes], Path]:
    def _write(content: bytes) -> Path:
        path = tmp_path / "m.gguf"
        path.write_bytes(content)
        return path

    return _write


def test_hand_made_good_file(write: Callable[[bytes], Path]) -> None:
    path = write(GOOD)
    header = read_header(path)
    assert header.metadata == {"general.architecture": "llama", "general.alignment": 32}
    assert header.value_types == {"general.architecture": STRING, "general.alignment": UINT32}
    assert header.tensors == (gguf_header.TensorInfo("t", (32,), F32, 0, 128),)
    assert header.data_offset == len(GOOD) - 128
    assert (header.path, header.version, header.alignment, header.file_size) == (str(path), 3, 32, len(GOOD))


# --- every class of bad file ---------------------------------------------------------------------

HUGE_STRING_AT = 24 + len(b"".join(GOOD_KVS)) + 8 + len("general.name") + 4
SKIP_ARRAY_HEAD = 24 + 8 + 1 + 4 + 4 + 8  # the header, key "x", its type, item type and count
LAST_STRING_AT = SKIP_ARRAY_HEAD + 1999 * len(gstr("a"))
BAD_FILES = [
    pytest.param(b"", "not a GGUF file (0 bytes long)", id="empty"),
    pytest.param(b"PK\x03\x04" + bytes(60), r"not a GGUF file (magic b'PK\x03\x04')", id="zip"),
    pytest.param(b"GGU", "not a GGUF file (3 bytes long)", id="short"),
    pytest.param(b"GGUF" + bytes(2), "truncated at byte 6 while reading the GGUF version", id="no-version"),
    pytest.param(gguf_bytes(GOOD_KVS, version=7), "unsupported GGUF version 7", id="version-7"),
    pytest.param(gguf_bytes(GOOD_KVS, version=0), "unsupported GGUF version 0", id="version-0"),
    pytest.param(gguf_bytes(GOOD_KVS, version=1), "GGUF version 1 is no longer supported", id="version-1"),
    pytest.param(
        b"GGUF" + struct.pack(">I", 3) + struct.pack(">QQ", 0, 1) + bytes(40),
        "big-endian GGUF files are not supported (version field 0x03000000)",
        id="big-endian",
    ),
    pytest.param(
        b"GGUF" + u32(3) + u64(0),
        "truncated at byte 16 while reading the tensor and key counts",
        id="no-counts",
    ),
    pytest.param(gguf_bytes(GOOD_KVS, n_kv=2**60), "header claims 2^60 keys but only", id="huge-key-count"),
    pytest.param(gguf_bytes(GOOD_KVS, n_tensors=2**40), "header claims 2^40 tensors but only", id="huge-tensor-count"),
    pytest.param(gguf_bytes(GOOD_KVS, n_kv=3, alignment=1), "while reading key 3 of 3", id="missing-key"),
    pytest.param(
        gguf_bytes([*GOOD_KVS, gstr("general.name") + u32(STRING) + u64(2**62) + b"x"]),
        f"string of 2^62 bytes at byte {HUGE_STRING_AT} exceeds the file (key 3 of 3 (general.name))",
        id="huge-string",
    ),
    pytest.param(
        gguf_bytes([*GOOD_KVS, gstr("x") + u32(ARRAY) + u32(STRING) + u64(2**62)]),
        "array x of 2^62 strings at byte",
        id="huge-string-array",
    ),
    pytest.param(
        gguf_bytes([*GOOD_KVS, gstr("x") + u32(ARRAY) + u32(FLOAT32) + u64(2**61)]),
        "array x of 2^61 items at byte",
        id="huge-number-array",
    ),
    pytest.param(
        gguf_bytes([kv("x", ARRAY, u32(STRING) + u64(2000) + gstr("a") * 1999 + u64(10**9) + bytes(8))]),
        f"string of 1000000000 bytes at byte {LAST_STRING_AT} exceeds the file (key 1 of 1 (x), string 2000",
        id="skipped-array-string-too-long",
    ),
    pytest.param(
        gguf_bytes([kv("x", ARRAY, u32(STRING) + u64(2000) + gstr("a") * 1999 + b"\x01")], alignment=1),
        f"truncated at byte {LAST_STRING_AT + 1} while reading key 1 of 1 (x), string 2000 of 2000",
        id="skipped-array-truncated",
    ),
    pytest.param(
        gguf_bytes([kv("general.alignment", STRING, gstr("32"))]),
        "key general.alignment has type string, expected uint32",
        id="alignment-string",
    ),
    pytest.param(
        gguf_bytes([kv_u32("general.alignment", 24)]),
        "key general.alignment is 24, not a power of 2",
        id="alignment-24",
    ),
    pytest.param(gguf_bytes([kv_u32("a", 1), kv_u32("a", 2)]), "duplicate key a (key 2 of 2)", id="duplicate-key"),
    pytest.param(gguf_bytes([kv_u32("", 1)]), "key 1 of 1 has an empty name", id="empty-key"),
    pytest.param(gguf_bytes([kv("a", 13, u32(0))]), "key a has invalid value type 13", id="bad-value-type"),
    pytest.param(gguf_bytes([kv("a", ARRAY, u32(ARRAY) + u64(0))]), "key a is an array of arrays", id="nested-array"),
    pytest.param(
        gguf_bytes([kv("a", ARRAY, u32(42) + u64(0))]),
        "key a is an array of invalid value type 42",
        id="bad-array-type",
    ),
    pytest.param(
        gguf_bytes(GOOD_KVS, [tensor("t", (32,), ggml_type=99)], data=bytes(128)),
        "tensor t has unknown ggml type 99",
        id="unknown-ggml-type",
    ),
    pytest.param(
        gguf_bytes(GOOD_KVS, [tensor("t", (1, 1, 1, 1, 1))], data=bytes(32)),
        "tensor t has 5 dimensions, at most 4",
        id="five-dims",
    ),
    pytest.param(
        gguf_bytes(GOOD_KVS, [tensor("t", (2**62, 2**62))]),
        "tensor t has an impossible shape",
        id="shape-overflow",
    ),
    pytest.param(
        gguf_bytes(GOOD_KVS, [tensor("t", (33,), ggml_type=Q8_0)], data=bytes(64)),
        "tensor t has rows of 33 elements, not a multiple of its 32-block",
        id="partial-block",
    ),
    pytest.param(
        gguf_bytes(GOOD_KVS, [tensor("t", (32,), offset=64)], data=bytes(256)),
        "tensor t has data offset 64, expected 0",
        id="bad-offset",
    ),
    pytest.param(
        gguf_bytes(GOOD_KVS, [tensor("t", (32,)), tensor("t", (32,), offset=128)], data=bytes(256)),
        "duplicate tensor name t",
        id="duplicate-tensor",
    ),
    pytest.param(
        gguf_bytes(GOOD_KVS, [tensor("n" * 64, (32,))], data=bytes(128)),
        "tensor name of 64 bytes at byte 102 is over the 63 allowed",
        id="long-tensor-name",
    ),
    pytest.param(
        gguf_bytes(GOOD_KVS, [tensor("t", (32,))], data=bytes(100)),
        "truncated: tensor t ends at byte",
        id="tensor-data-truncated",
    ),
    pytest.param(
        gguf_bytes(GOOD_KVS, [tensor("t", (32,))])[:-40],
        "while reading tensor info 1 of 1",
        id="tensor-info-truncated",
    ),
    pytest.param(
        gguf_bytes(GOOD_KVS, [tensor("t", (32,))], alignment=1)[:-1],
        "while reading tensor info 1 of 1 (t)",
        id="tensor-offset-truncated",
    ),
]


@pytest.mark.parametrize(("content", "problem"), BAD_FILES)
def test_bad_file(write: Callable[[bytes], Path], content: bytes, problem: str) -> None:
    path = write(content)
    with pytest.raises(GGUFError) as caught:
        read_header(path)
    message = str(caught.value)
    assert message.startswith(f"safe-llama: {path}: ")
    assert problem in message
    assert "\n" not in message
    assert caught.value.status == ExitStatus.BAD_MODEL


def test_missing_file(tmp_path: Path) -> None:
    with pytest.raises(GGUFError, match=r"^safe-llama: .*/nope\.gguf: no such file$"):
        read_header(tmp_path / "nope.gguf")


def test_directory(tmp_path: Path) -> None:
    with pytest.raises(GGUFError, match=r"is a directory, not a GGUF file$"):
        read_header(tmp_path)


def test_fifo_is_refused_without_blocking(tmp_path: Path) -> None:
    fifo = tmp_path / "pipe.gguf"
    os.mkfifo(fifo)
    with pytest.raises(GGUFError, match=r"not a regular file$"):
        read_header(fifo)


def test_permission_denied(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # Tests run as root, which no file mode stops, so the refusal is simulated at the one door.
    def deny(path: str, flags: int, mode: int = 0o777) -> int:
        raise PermissionError(13, "Permission denied", path)

    monkeypatch.setattr(os, "open", deny)
    with pytest.raises(GGUFError, match=r"m\.gguf: permission denied$"):
        read_header(tmp_path / "m.gguf")


def test_unprintable_path_and_key_stay_on_one_line(tmp_path: Path) -> None:
    path = tmp_path / "a\nb.gguf"
    path.write_bytes(gguf_bytes([kv_u32("k\x1b[31m\n", 1), kv_u32("k\x1b[31m\n", 2)]))
    with pytest.raises(GGUFError) as caught:
        read_header(path)
    assert "\n" not in str(caught.value) and "\x1b" not in str(caught.value)
    assert "a\\nb.gguf" in str(caught.value)


# --- arrays: kept, skipped, and the skip walk across window refills --------------------------------


def test_array_limits(write: Callable[[bytes], Path]) -> None:
    limit_n, limit_s = gguf_header.MAX_KEPT_NUMBERS, gguf_header.MAX_KEPT_STRINGS
    kvs = [
        kv("n.kept", ARRAY, u32(UINT8) + u64(limit_n) + bytes(limit_n)),
        kv("n.skipped", ARRAY, u32(UINT8) + u64(limit_n + 1) + bytes(limit_n + 1)),
        kv("s.kept", ARRAY, u32(STRING) + u64(limit_s) + gstr("ab") * limit_s),
        kv("s.skipped", ARRAY, u32(STRING) + u64(limit_s + 1) + gstr("ab") * (limit_s + 1)),
        kv("bools", ARRAY, u32(7) + u64(3) + b"\x01\x00\x01"),
        kv_str("after", "ok"),
    ]
    header = read_header(write(gguf_bytes(kvs)))
    assert header.metadata["n.kept"] == (0,) * limit_n
    assert header.metadata["n.skipped"] == SkippedArray(UINT8, limit_n + 1)
    assert header.metadata["s.kept"] == ("ab",) * limit_s
    assert header.metadata["s.skipped"] == SkippedArray(STRING, limit_s + 1)
    assert header.metadata["bools"] == (True, False, True)
    assert header.metadata["after"] == "ok"


@pytest.mark.parametrize(("chunk", "window"), [(8, 8), (13, 64), (1 << 20, 1 << 26)])
def test_string_walk_across_refills(
    write: Callable[[bytes], Path], monkeypatch: pytest.MonkeyPatch, chunk: int, window: int
) -> None:
    lengths = [(i * 7919) % 300 for i in range(5000)]
    strings = b"".join(gstr(bytes(n)) for n in lengths)
    path = write(gguf_bytes([kv("big", ARRAY, u32(STRING) + u64(len(lengths)) + strings), kv_str("after", "ok")]))
    monkeypatch.setattr(gguf_header, "_CHUNK", chunk)
    monkeypatch.setattr(gguf_header, "_MAX_WINDOW", window)
    header = read_header(path)
    assert header.metadata == {"big": SkippedArray(STRING, 5000), "after": "ok"}


# --- against gguf.GGUFReader on a generated model ------------------------------------------------


@pytest.fixture(scope="module")
def tiny_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("tiny") / "tiny.gguf"
    return write_tiny_gguf(path, arch="gemma3", n_layer=3, n_embd=32, head_dim=8, n_ff=32, vocab=BIG_VOCAB,
                           sliding_window=64)  # fmt: skip


def test_matches_gguf_reader(tiny_model: Path) -> None:
    header = read_header(tiny_model)
    reader = gguf.GGUFReader(tiny_model)
    fields = {name: field for name, field in reader.fields.items() if not name.startswith("GGUF.")}
    assert list(header.metadata) == list(fields)
    for name, field in fields.items():
        ours = header.metadata[name]
        assert header.value_types[name] == field.types[0]
        if isinstance(ours, SkippedArray):
            assert (ours.item_type, ours.count) == (field.types[-1], len(field.data))
        elif isinstance(ours, tuple):
            assert list(ours) == field.contents()
        else:
            assert ours == field.contents()
    assert header.alignment == reader.alignment
    assert header.data_offset == reader.data_offset
    assert len(header.tensors) == len(reader.tensors)
    for ours_t, theirs in zip(header.tensors, reader.tensors, strict=True):
        assert ours_t.name == theirs.name
        assert ours_t.shape == tuple(int(d) for d in theirs.shape)
        assert ours_t.ggml_type == theirs.tensor_type
        assert header.data_offset + ours_t.offset == theirs.data_offset
        assert ours_t.n_bytes == theirs.n_bytes
    assert isinstance(header.metadata["tokenizer.ggml.tokens"], SkippedArray)


def test_bundled_model(bundled_model: Path) -> None:
    started = time.perf_counter()
    header = read_header(bundled_model)
    elapsed = time.perf_counter() - started
    md = header.metadata
    assert md["general.architecture"] == "gemma3"
    assert md["gemma3.block_count"] == 18
    assert md["gemma3.attention.sliding_window"] == 512
    assert md["tokenizer.ggml.tokens"] == SkippedArray(STRING, 262144)
    assert md["tokenizer.ggml.scores"] == SkippedArray(FLOAT32, 262144)
    assert len(header.tensors) == 236
    assert header.alignment == 32
    assert header.file_size == bundled_model.stat().st_size
    embd = next(t for t in header.tensors if t.name == "token_embd.weight")
    assert (embd.shape, embd.ggml_type, embd.n_bytes) == ((640, 262144), Q8_0, 640 * 262144 // 32 * 34)
    last = max(header.tensors, key=lambda t: t.offset)
    assert header.data_offset + last.offset + last.n_bytes <= header.file_size
    assert header.file_size - (header.data_offset + last.offset + last.n_bytes) < header.alignment
    assert elapsed < 1.0, f"reading the bundled header took {elapsed:.3f} s"  # typically ~0.02 s


# --- fuzzing -------------------------------------------------------------------------------------


@st.composite
def mutated(draw: st.DrawFn, seed: tuple[bytes, int]) -> bytes:
    """Bytes flipped, counts and lengths replaced with huge or small values, or the file cut short, at
    positions spread evenly over the header (hypothesis' own integers favour the first few bytes)."""
    original, header_end = seed
    rnd = random.Random(draw(st.integers(0, 2**32)))
    data = bytearray(original)
    for _ in range(draw(st.integers(1, 4))):
        kind = draw(st.sampled_from(["flip", "huge", "small", "truncate"]))
        at = rnd.randrange(max(1, min(len(data), header_end + 64)))
        if kind == "flip":
            data[at : at + 1] = bytes([data[at] ^ rnd.randrange(1, 256)]) if at < len(data) else b""
        elif kind in ("huge", "small"):
            values = [2**62, 2**64 - 1, 2**60, 2**63, 2**32] if kind == "huge" else [0, 1, 2, 7, 65537, 2000]
            data[at : at + 8] = u64(rnd.choice(values))
        else:
            del data[at:]
    return bytes(data)


def _run_mutated(tmp_dir: Path, content: bytes) -> None:
    path = tmp_dir / "fuzz.gguf"
    path.write_bytes(content)
    tracemalloc.start()
    started = time.perf_counter()
    try:
        header = read_header(path)
        model_facts(header)
    except GGUFError as err:
        assert "\n" not in str(err) and str(err).startswith("safe-llama: ")
    finally:
        _, peak = tracemalloc.get_traced_memory()
        tracemalloc.stop()
    assert time.perf_counter() - started < 2.0
    assert peak < 16 << 20, f"{peak} bytes allocated for a {len(content)}-byte file"


@pytest.fixture(scope="module")
def fuzz_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("fuzz")


@pytest.fixture(scope="module", params=["big-vocab", "small-vocab"])
def fuzz_seed(request: pytest.FixtureRequest, tiny_model: Path, fuzz_dir: Path) -> tuple[bytes, int]:
    """A header mostly vocabulary (string-array walks), and one mostly keys and tensor infos."""
    model = tiny_model
    if request.param == "small-vocab":
        model = write_tiny_gguf(fuzz_dir / "small.gguf", n_layer=4, n_embd=32, head_dim=8, n_ff=32, vocab=("▁hi",))
    return model.read_bytes(), read_header(model).data_offset


@pytest.mark.slow
@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_fuzzed_headers_fail_cleanly(data: st.DataObject, fuzz_seed: tuple[bytes, int], fuzz_dir: Path) -> None:
    _run_mutated(fuzz_dir, data.draw(mutated(fuzz_seed)))


@pytest.mark.parametrize("value", [2**62, 2**64 - 1, 2**32 + 5])
def test_every_u64_slot_of_a_small_header(fuzz_dir: Path, value: int) -> None:
    content = gguf_bytes([*GOOD_KVS, kv("s", ARRAY, u32(STRING) + u64(3) + gstr("a") * 3)],
                         [tensor("t", (32,))], data=bytes(128))  # fmt: skip
    for at in range(len(content) - 8):
        mutated_content = content[:at] + u64(value) + content[at + 8 :]
        _run_mutated(fuzz_dir, mutated_content)
