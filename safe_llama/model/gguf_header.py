"""Reads a GGUF file's header (v2, v3, little-endian): key/value metadata and tensor infos, never tensor data.

Owns the GGUF binary layout and its validation: every count and length is checked against the bytes left in
the file and against llama.cpp's own caps before anything is allocated or looped over; what planning cannot use
(long strings, long arrays) is skipped without being read, and what is kept is charged against one budget, so a
header that declares gigabytes costs a bounded amount of memory. Every failure is one GGUFError line. Must not
interpret the metadata (model_facts does that) nor import numpy or the gguf package (0.3 s).

Over 400 lines on purpose: one binary format, one bounded reader; the value decoder, the reader's
bounds and the tensor-info checks share the same cursor and the same error.
"""

from __future__ import annotations

import os
import stat
import struct
import sys
from collections.abc import Mapping
from dataclasses import dataclass, field
from functools import cache
from io import FileIO
from types import MappingProxyType
from typing import NoReturn, Protocol, TypeAlias

from safe_llama.errors import ExitStatus, SafeLlamaError
from safe_llama.messages import MODEL_PROBLEM, PREFIX
from safe_llama.model.gguf_constants import constants

GGUF_MAGIC = b"GGUF"
SUPPORTED_VERSIONS = (2, 3)
DEFAULT_ALIGNMENT = 32  # GGUF_DEFAULT_ALIGNMENT in ggml/include/gguf.h
GGML_MAX_DIMS = 4
GGML_MAX_NAME = 64  # a tensor name must be shorter than this (ggml.h), or gguf_init fails
# llama.cpp's own caps (ggml/src/gguf.cpp): a longer string or array makes gguf_init fail, so it is refused here
GGUF_MAX_STRING_LENGTH = 1 << 30
GGUF_MAX_ARRAY_ELEMENTS = 1 << 30
# What is kept. Planning reads short strings and arrays of at most one entry per layer (LLAMA_MAX_LAYERS, 512):
# a longer value (a chat template, scores, token types, a vocabulary, merges) is skipped unread, its shape kept.
MAX_KEPT_STRING = 1 << 16  # bytes of one string value, or of one string array's items together
MAX_KEPT_NUMBERS = 1024  # items of one numeric array
MAX_KEPT_STRINGS = 1024  # items of one string array
MAX_KEY_LENGTH = 1 << 16  # a longer key name is refused: its value could not be told apart from another's
# The memory the kept metadata and tensor infos may take, estimated as they are kept; a header above it is
# refused. A real model keeps under 1 MiB (the bundled one 0.2 MiB; 10,000 tensor infos about 5 MiB).
MAX_KEPT_BYTES = 32 << 20
_KEY_COST = 200  # a key's two dict slots and str object, beyond its characters
_NUMBER_COST = 32  # an int or float object and its tuple slot
_TENSOR_COST = 600  # a TensorInfo, its shape, its name's set entry and the tuples on the way to it
INT64_MAX = (1 << 63) - 1

# Quantization sizes the installed gguf package gets wrong or lacks, taken from the pinned llama.cpp
# (ggml/src/ggml-common.h block_q8_1 and block_q2_0): gguf 0.19.0 says 40 bytes for Q8_1 and has no Q2_0.
_QUANT_SIZE_FIXES: dict[int, tuple[int, int]] = {9: (32, 36), 42: (64, 18)}

_CHUNK = 1 << 20  # bytes read at a time; the bundled model's header is about 6 MiB
_MAX_WINDOW = 1 << 23  # the most read at once, however long an array claims to be
_U32 = struct.Struct("<I")
_U64 = struct.Struct("<Q")
_ARRAY_HEAD = struct.Struct("<IQ")


@dataclass(frozen=True)
class SkippedArray:
    """An array too long to keep (a tokenizer's vocabulary, scores, merges): only its shape is known."""

    item_type: int  # a GGUFValueType number
    count: int


@dataclass(frozen=True)
class SkippedString:
    """A string value too long to keep (a chat template, a licence): only its length in bytes is known."""

    length: int


Scalar: TypeAlias = int | float | bool | str
MetadataValue: TypeAlias = Scalar | tuple[Scalar, ...] | SkippedArray | SkippedString


@dataclass(frozen=True)
class TensorInfo:
    name: str
    shape: tuple[int, ...]  # ne[0] first, as ggml and the file store it
    ggml_type: int
    offset: int  # from the start of the data section
    n_bytes: int


@dataclass(frozen=True, kw_only=True)
class GGUFHeader:
    """What the header of one GGUF file says. Every field but path and metadata has a default, so tests can
    build one from plain values."""

    path: str
    metadata: Mapping[str, MetadataValue]
    tensors: tuple[TensorInfo, ...] = ()
    version: int = 3
    alignment: int = DEFAULT_ALIGNMENT
    data_offset: int = 0  # file offset of the (aligned) tensor data section
    file_size: int = 0
    # GGUFValueType of each key as stored; empty for a header built by hand (then inferred from the value)
    value_types: Mapping[str, int] = field(default_factory=dict)

    def type_name(self, key: str) -> str:
        """The stored GGUF type of a key ("uint32", "string", "array"), for error messages."""
        stored = self.value_types.get(key)
        if stored is not None:
            return value_type_name(stored)
        value = self.metadata.get(key)
        if isinstance(value, bool):
            return "bool"
        if isinstance(value, int):
            return "integer"
        if isinstance(value, float):
            return "float32"
        if isinstance(value, str | SkippedString):
            return "string"
        if value is None:
            return "missing"
        return "array"


class GGUFError(SafeLlamaError):
    """A GGUF file that cannot be used: one line naming the file and the problem."""

    def __init__(self, path: str, problem: str) -> None:
        super().__init__(PREFIX + MODEL_PROBLEM.text(path=printable(path), problem=problem), ExitStatus.BAD_MODEL)
        self.path = path
        self.problem = problem


def printable(text: str, limit: int = 200) -> str:
    """Text from a file or a path, safe to put on one line of a terminal."""
    shown = text if text.isprintable() else ascii(text)[1:-1]
    return shown if len(shown) <= limit else shown[:limit] + "..."


def value_type_name(type_id: int) -> str:
    try:
        return constants().GGUFValueType(type_id).name.lower()  # type: ignore[no-any-return]
    except ValueError:
        return f"type {type_id}"


@cache
def _value_formats() -> dict[int, struct.Struct]:
    """The struct reading one value of each fixed-size GGUF value type."""
    v = constants().GGUFValueType
    chars = {
        v.UINT8: "B",
        v.INT8: "b",
        v.UINT16: "H",
        v.INT16: "h",
        v.UINT32: "I",
        v.INT32: "i",
        v.FLOAT32: "f",
        v.BOOL: "?",
        v.UINT64: "Q",
        v.INT64: "q",
        v.FLOAT64: "d",
    }
    return {int(t): struct.Struct("<" + c) for t, c in chars.items()}


@cache
def _quant_sizes() -> dict[int, tuple[int, int]]:
    """ggml type number -> (elements per block, bytes per block)."""
    sizes = {int(t): (int(b), int(s)) for t, (b, s) in constants().GGML_QUANT_SIZES.items()}
    sizes.update(_QUANT_SIZE_FIXES)
    return sizes


def _count(n: int) -> str:
    """A count from a file, readable when it is an absurd power of two (2^60 rather than 19 digits)."""
    if n >= 1 << 32 and n & (n - 1) == 0:
        return f"2^{n.bit_length() - 1}"
    return str(n)


class ByteSource(Protocol):
    """Where the header's bytes come from: a file, or a model's first bytes fetched over HTTP range requests
    (pipeline/remote_header.py); a failed read raises OSError."""

    def seek(self, pos: int, /) -> int: ...

    def read(self, size: int, /) -> bytes: ...


class _Reader:
    """A forward-only cursor over the file, holding a window of it in one bytes object."""

    def __init__(self, file: ByteSource, path: str, size: int) -> None:
        self.file = file
        self.path = path
        self.size = size
        self.buf = b""
        self.base = 0  # file offset of buf[0]
        self.pos = 0  # file offset of the next byte to read
        self.context = "the header"
        self.kept = 0  # estimated bytes of memory kept so far (MAX_KEPT_BYTES)

    def fail(self, problem: str) -> NoReturn:
        raise GGUFError(self.path, problem)

    def truncated(self) -> NoReturn:
        self.fail(f"truncated at byte {self.size} while reading {self.context}")

    def remaining(self) -> int:
        return self.size - self.pos

    def keep(self, cost: int) -> None:
        """Charge what is about to be kept against MAX_KEPT_BYTES; refuse the header above it."""
        self.kept += cost
        if self.kept > MAX_KEPT_BYTES:
            self.fail(
                f"header claims more than {MAX_KEPT_BYTES >> 20} MiB of metadata and tensor infos, the most "
                f"safe-llama keeps (at {self.context}); real models need under 10 MiB"
            )

    def rewind(self, pos: int) -> None:
        """Go back to an offset already read; the window is dropped when it does not hold it."""
        if pos < self.base:
            self.buf = b""
            self.base = pos
        self.pos = pos

    def _fill(self, n: int, want: int = 0) -> None:
        """Make the window start at pos and hold at least n bytes (and want bytes, if the file has them)."""
        if n > self.size - self.pos:
            self.truncated()
        try:
            self.file.seek(self.pos)
            data = self.file.read(max(n, min(want or _CHUNK, self.size - self.pos)))
        except OSError as e:
            self.fail(f"read error at byte {self.pos}: {e.strerror or e}")
        if len(data) < n:  # the file shrank while we read it
            self.truncated()
        self.buf = data
        self.base = self.pos

    def take(self, st: struct.Struct) -> tuple[object, ...]:
        rel = self.pos - self.base
        if rel + st.size > len(self.buf):
            self._fill(st.size)
            rel = 0
        self.pos += st.size
        return st.unpack_from(self.buf, rel)

    def u32(self) -> int:
        rel = self.pos - self.base
        if rel + 4 > len(self.buf):
            self._fill(4)
            rel = 0
        self.pos += 4
        value: int = _U32.unpack_from(self.buf, rel)[0]
        return value

    def u64(self) -> int:
        rel = self.pos - self.base
        if rel + 8 > len(self.buf):
            self._fill(8)
            rel = 0
        self.pos += 8
        value: int = _U64.unpack_from(self.buf, rel)[0]
        return value

    def raw(self, n: int) -> bytes:
        rel = self.pos - self.base
        if rel + n > len(self.buf):
            self._fill(n)
            rel = 0
        self.pos += n
        return self.buf[rel : rel + n]

    def string_length(self) -> int:
        start = self.pos
        length = self.u64()
        if length > self.remaining():
            self.fail(f"string of {_count(length)} bytes at byte {start} exceeds the file ({self.context})")
        if length > GGUF_MAX_STRING_LENGTH:
            self.fail(
                f"string of {length} bytes at byte {start} is over llama.cpp's limit of "
                f"{GGUF_MAX_STRING_LENGTH} ({self.context})"
            )
        return length

    def string(self, limit: int = MAX_KEPT_STRING) -> str | SkippedString:
        """A string up to limit bytes, decoded and charged; a longer one skipped unread."""
        length = self.string_length()
        if length > limit:
            self.skip(length)
            return SkippedString(length)
        text = self.raw(length).decode("utf-8", errors="replace")
        self.keep(sys.getsizeof(text))
        return text

    def name(self, limit: int, what: str) -> str:
        """A key or tensor name of at most limit bytes; a longer one is refused before it is read."""
        start = self.pos
        length = self.string_length()
        if length > limit:
            self.fail(f"{what} of {_count(length)} bytes at byte {start} is over the {limit} allowed ({self.context})")
        text = self.raw(length).decode("utf-8", errors="replace")
        self.keep(sys.getsizeof(text))
        return text

    def skip(self, n: int) -> None:
        if n > self.remaining():
            self.truncated()
        self.pos += n

    def skip_strings(self, n: int) -> None:
        """Walk past n length-prefixed strings without decoding them: the hot loop of a large vocabulary."""
        start = self.pos
        unpack = _U64.unpack_from
        i = 0
        while i < n:
            buf = self.buf
            rel = self.pos - self.base
            stopped = i
            try:
                for stopped in range(i, n):  # noqa: B007 - says where the walk stopped
                    rel += unpack(buf, rel)[0] + 8
                stopped = n
            except (struct.error, OverflowError):
                pass  # the length prefix of that item is not in the window: refill from there
            i = stopped
            if self.base + rel > self.size or (i < n and self.size - (self.base + rel) < 8):
                self._diagnose_strings(start, n)
            self.pos = self.base + rel
            if i < n:
                # at least 8 bytes per item left, typically a few more
                self._fill(8, want=min(_MAX_WINDOW, max(_CHUNK, 24 * (n - i))))

    def _diagnose_strings(self, start: int, n: int) -> NoReturn:
        """The slow walk, only to name the string that runs past the end of the file."""
        context = self.context
        self.pos = start
        for i in range(n):
            self.context = f"{context}, string {i + 1} of {n}"
            self.skip(self.string_length())
        raise AssertionError("the fast walk failed but the slow walk did not")  # pragma: no cover


def _open(path: str) -> tuple[FileIO, int]:
    """Open a regular file for reading without ever blocking (a FIFO would hang a plain open)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    except FileNotFoundError:
        raise GGUFError(path, "no such file") from None
    except PermissionError:
        raise GGUFError(path, "permission denied") from None
    except IsADirectoryError:
        raise GGUFError(path, "is a directory, not a GGUF file") from None
    except OSError as e:
        raise GGUFError(path, f"cannot open: {e.strerror or e}") from None
    try:
        st = os.fstat(fd)
        if stat.S_ISDIR(st.st_mode):
            raise GGUFError(path, "is a directory, not a GGUF file")
        if not stat.S_ISREG(st.st_mode):
            raise GGUFError(path, "not a regular file")
        return FileIO(fd, "rb"), st.st_size
    except BaseException:
        os.close(fd)
        raise


def read_header(path: str | os.PathLike[str]) -> GGUFHeader:
    """Read and validate the header of a GGUF file; GGUFError (exit status BAD_MODEL) if it is unusable."""
    name = os.fspath(path)
    file, size = _open(name)
    with file:
        return _parse(_Reader(file, name, size))


def read_header_from(source: ByteSource, name: str, size: int) -> GGUFHeader:
    """The header of a GGUF file of `size` bytes read from `source` (named `name` in every error), with the
    same bounds as a file's."""
    return _parse(_Reader(source, name, size))


def _parse(r: _Reader) -> GGUFHeader:
    if r.size < 4:
        r.fail(f"not a GGUF file ({r.size} bytes long)")
    magic = r.raw(4)
    if magic != GGUF_MAGIC:
        r.fail(f"not a GGUF file (magic {magic!r})")
    r.context = "the GGUF version"
    version = r.u32()
    if version != 0 and version & 0xFFFF == 0:
        r.fail(f"big-endian GGUF files are not supported (version field 0x{version:08x})")
    if version == 1:
        r.fail("GGUF version 1 is no longer supported by llama.cpp")
    if version not in SUPPORTED_VERSIONS:
        r.fail(f"unsupported GGUF version {_count(version)}")
    r.context = "the tensor and key counts"
    n_tensors = r.u64()
    n_kv = r.u64()
    # Lower bounds on the bytes each entry needs: a key has a length, at least one byte, a type and a
    # value of at least one byte; a tensor info has a name length, n_dims, a type and an offset.
    if n_kv * 14 > r.remaining():
        r.fail(f"header claims {_count(n_kv)} keys but only {r.remaining()} bytes follow")
    if n_kv * 14 + n_tensors * 24 > r.remaining():
        r.fail(f"header claims {_count(n_tensors)} tensors but only {r.remaining()} bytes follow")

    metadata, value_types = _read_metadata(r, n_kv)
    alignment = _alignment(r, metadata, value_types)
    raw_tensors = _read_tensor_infos(r, n_tensors)

    data_offset = -(-r.pos // alignment) * alignment
    if n_tensors and data_offset > r.size:
        r.context = "the padding before the tensor data"
        r.truncated()
    tensors = _tensor_infos(r, raw_tensors, alignment, data_offset)
    return GGUFHeader(
        path=r.path,
        version=version,
        metadata=MappingProxyType(metadata),
        tensors=tensors,
        alignment=alignment,
        data_offset=data_offset,
        file_size=r.size,
        value_types=MappingProxyType(value_types),
    )


def _read_metadata(r: _Reader, n_kv: int) -> tuple[dict[str, MetadataValue], dict[str, int]]:
    formats = _value_formats()
    string_type = constants().GGUFValueType.STRING
    array_type = constants().GGUFValueType.ARRAY
    metadata: dict[str, MetadataValue] = {}
    value_types: dict[str, int] = {}
    for i in range(n_kv):
        where = f"key {i + 1} of {n_kv}"
        r.context = where
        key = r.name(MAX_KEY_LENGTH, "key name")
        r.keep(_KEY_COST)
        if not key:
            r.fail(f"{where} has an empty name")
        if key in metadata:
            r.fail(f"duplicate key {printable(key)} ({where})")
        r.context = f"{where} ({printable(key, 80)})"
        value_type = r.u32()
        value: MetadataValue
        if value_type == array_type:
            value = _read_array(r, key, formats, string_type, array_type)
        elif value_type == string_type:
            value = r.string()
        elif value_type in formats:
            scalar: Scalar = r.take(formats[value_type])[0]  # type: ignore[assignment]
            r.keep(_NUMBER_COST)
            value = scalar
        else:
            r.fail(f"key {printable(key)} has invalid value type {value_type}")
        metadata[key] = value
        value_types[key] = value_type
    return metadata, value_types


def _read_array(
    r: _Reader, key: str, formats: dict[int, struct.Struct], string_type: int, array_type: int
) -> tuple[Scalar, ...] | SkippedArray:
    start = r.pos
    item_type, count = r.take(_ARRAY_HEAD)
    assert isinstance(item_type, int) and isinstance(count, int)
    if item_type == string_type:
        if count * 8 > r.remaining():
            r.fail(f"array {printable(key)} of {_count(count)} strings at byte {start} exceeds the file")
        _array_cap(r, key, count, start)
        items_at = r.pos
        r.skip_strings(count)
        if count > MAX_KEPT_STRINGS or r.pos - items_at - 8 * count > MAX_KEPT_STRING:
            return SkippedArray(item_type, count)
        # short enough to keep: read again, now that the walk has checked every length
        r.rewind(items_at)
        strings = tuple(str(r.string(limit=GGUF_MAX_STRING_LENGTH)) for _ in range(count))
        r.keep(sys.getsizeof(strings))
        return strings
    if item_type == array_type:
        r.fail(f"key {printable(key)} is an array of arrays, which llama.cpp does not accept")
    if item_type not in formats:
        r.fail(f"key {printable(key)} is an array of invalid value type {item_type}")
    item = formats[item_type]
    if count * item.size > r.remaining():
        r.fail(f"array {printable(key)} of {_count(count)} items at byte {start} exceeds the file")
    _array_cap(r, key, count, start)
    if count > MAX_KEPT_NUMBERS:
        r.skip(count * item.size)
        return SkippedArray(item_type, count)
    r.keep(sys.getsizeof(()) + count * _NUMBER_COST)
    items: tuple[Scalar, ...] = r.take(struct.Struct(f"<{count}{item.format[1:]}"))  # type: ignore[assignment]
    return items


def _array_cap(r: _Reader, key: str, count: int, start: int) -> None:
    if count > GGUF_MAX_ARRAY_ELEMENTS:
        r.fail(
            f"array {printable(key)} of {count} items at byte {start} is over llama.cpp's limit of "
            f"{GGUF_MAX_ARRAY_ELEMENTS}"
        )


def _alignment(r: _Reader, metadata: Mapping[str, MetadataValue], value_types: Mapping[str, int]) -> int:
    key = "general.alignment"
    if key not in metadata:
        return DEFAULT_ALIGNMENT
    if value_types[key] != constants().GGUFValueType.UINT32:
        r.fail(f"key {key} has type {value_type_name(value_types[key])}, expected uint32")
    alignment = metadata[key]
    assert isinstance(alignment, int)
    if alignment == 0 or alignment & (alignment - 1):
        r.fail(f"key {key} is {alignment}, not a power of 2")
    return alignment


_RawTensor: TypeAlias = tuple[str, tuple[int, ...], int, int]


def _read_tensor_infos(r: _Reader, n_tensors: int) -> list[_RawTensor]:
    seen: set[str] = set()
    raw: list[_RawTensor] = []
    dims_structs = [struct.Struct(f"<{n}Q") for n in range(GGML_MAX_DIMS + 1)]
    for i in range(n_tensors):
        r.context = f"tensor info {i + 1} of {n_tensors}"
        r.keep(_TENSOR_COST)
        name = r.name(GGML_MAX_NAME - 1, "tensor name")
        if name in seen:
            r.fail(f"duplicate tensor name {printable(name)}")
        seen.add(name)
        r.context = f"tensor info {i + 1} of {n_tensors} ({printable(name)})"
        n_dims = r.u32()
        if n_dims > GGML_MAX_DIMS:
            r.fail(f"tensor {printable(name)} has {_count(n_dims)} dimensions, at most {GGML_MAX_DIMS}")
        shape: tuple[int, ...] = r.take(dims_structs[n_dims])  # type: ignore[assignment]
        elements = 1
        for dim in shape:
            elements *= dim
            if dim > INT64_MAX or elements > INT64_MAX:
                r.fail(f"tensor {printable(name)} has an impossible shape {shape}")
        ggml_type = r.u32()
        offset = r.u64()
        raw.append((name, shape, ggml_type, offset))
    return raw


def _tensor_infos(r: _Reader, raw: list[_RawTensor], alignment: int, data_offset: int) -> tuple[TensorInfo, ...]:
    sizes = _quant_sizes()
    expected = 0
    tensors = []
    for name, shape, ggml_type, offset in raw:
        shown = printable(name)
        if ggml_type not in sizes:
            r.fail(f"tensor {shown} has unknown ggml type {ggml_type}")
        block_size, type_size = sizes[ggml_type]
        if shape and shape[0] % block_size:
            r.fail(f"tensor {shown} has rows of {shape[0]} elements, not a multiple of its {block_size}-block")
        elements = 1
        for dim in shape:
            elements *= dim
        n_bytes = elements // block_size * type_size
        if offset != expected:
            r.fail(f"tensor {shown} has data offset {offset}, expected {expected}")
        end = data_offset + offset + n_bytes
        if end > r.size:
            r.fail(f"truncated: tensor {shown} ends at byte {end} but the file has {r.size} bytes")
        expected += -(-n_bytes // alignment) * alignment
        tensors.append(TensorInfo(name, shape, ggml_type, offset, n_bytes))
    return tuple(tensors)
