"""Small JSON files under the cache directory: written atomically, 0600, never through a symlink, only in a
trusted place (trust.py: a folder someone else can write is neither read nor written, with one warning).

Owns the file discipline for everything safe-llama stores (model facts, probe results, remembered
plans, parsed TOML) and the kinds of entry `forget` clears; callers own the content. A corrupt or
unreadable file reads as missing, with a warning; a parsed TOML entry is checked by its sum and removed
when wrong.
"""

from __future__ import annotations

import contextlib
import json
import os
import sys
from pathlib import Path
from typing import Any

from safe_llama import trust

# what the cache holds that `forget` clears (everything but the pinned llama.cpp build and the bundled model):
# remembered plans, launch records, the no-model tables, parsed TOML, model facts, probe results, the models index
ENTRY_FOLDERS = ("plans", "launch", "args", "toml", "facts", "probe", "models")


def trusted_folder(folder: Path, doing: str) -> bool:
    """folder may be read or written (trust.problem); otherwise one warning, once, names it and why."""
    untrusted = trust.problem(folder)
    if untrusted is not None:
        trust.say_once(f"not using {folder}: {untrusted}", key=untrusted)
    return untrusted is None


def read_json(path: Path, *, warn: bool = True) -> Any | None:
    if not trusted_folder(path.parent, "reading"):
        return None
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except FileNotFoundError:
        return None
    except OSError as err:
        if warn:
            sys.stderr.write(f"safe-llama: warning: ignoring {path}: {err.strerror}\n")
        return None
    try:
        if not trust.private_file(fd):
            os.close(fd)
            trust.say_once(f"not reading {path}: another user can write it, or it is not yours")
            return None
        with os.fdopen(fd, "rb") as f:
            return json.loads(f.read())
    except (ValueError, OSError) as err:
        if warn:
            sys.stderr.write(f"safe-llama: warning: ignoring corrupt {path}: {str(err).splitlines()[0]}\n")
        return None


# Set by check_cache when the cache directory cannot be used: writes are skipped (the caller said so once).
_writes_off: list[str] = []


def check_cache(root: Path) -> str | None:
    """Make sure the cache root is a private (0700) directory this user can write; otherwise turn every
    later write off and return one line saying why (a launch then runs without caching or remembering).
    A root someone else can write (trust.problem) is neither made private nor used: what is in it may be theirs."""
    untrusted = trust.problem(root)
    if untrusted is not None:
        reason = f"cache directory {root} is not used ({untrusted})"
        _writes_off.append(reason)
        trust.said(untrusted)  # the caller says it: the reads then say nothing more
        return reason
    try:
        make_dirs(root)
        st = os.stat(root, follow_symlinks=False)
        if not os.path.isdir(root) or os.path.islink(root):
            raise NotADirectoryError(20, "not a directory")
        if st.st_uid == os.geteuid() and st.st_mode & 0o077:
            os.chmod(root, 0o700)
        if not os.access(root, os.W_OK | os.X_OK):
            raise PermissionError(13, "Permission denied")
    except OSError as err:
        reason = f"cache directory {root} is not usable ({err.strerror or err})"
        _writes_off.append(reason)
        return reason
    return None


def write_json(path: Path, value: Any) -> None:
    """Write to a temp file in the same directory, fsync, then os.replace: readers see old or new."""
    write_bytes(path, json.dumps(value, separators=(",", ":")).encode())


def write_bytes(path: Path, data: bytes) -> None:
    """write_json's discipline for bytes already made (a marshal record)."""
    if _writes_off or not trusted_folder(path.parent, "writing"):
        return
    make_dirs(path.parent)
    if not trusted_folder(path.parent, "writing"):  # made meanwhile by someone else, in a sticky folder
        return
    import tempfile  # only a write needs it (and random, which it imports)

    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as f:
            os.fchmod(f.fileno(), 0o600)
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


def make_dirs(folder: Path, mode: int = 0o700) -> None:
    """Create folder and its missing parents, each with `mode` (mkdir(parents=True) gives parents 0755);
    0755 only for the system-wide install that other users and the service read."""
    missing = []
    while not folder.exists():
        missing.append(folder)
        folder = folder.parent
    for directory in reversed(missing):
        try:
            directory.mkdir(mode=mode)
        except FileExistsError:
            continue
        if mode != 0o700:
            os.chmod(directory, mode)  # mkdir's mode is filtered by the umask (0700 survives any usual one)


def file_key(path: Path) -> str:
    """Identity of a file's current content for cache keys: real path, size, mtime, inode."""
    st = path.stat()
    return f"{path.resolve()}|{st.st_size}|{st.st_mtime_ns}|{st.st_ino}"


def digest(text: str, length: int = 64) -> str:
    """A hex digest for cache keys compared as digests (a launch's remembered plan, a probe's fingerprint)."""
    import hashlib

    return hashlib.blake2b(text.encode(), digest_size=32).hexdigest()[:length]


def cache_name(key: str) -> str:
    """The file name of a cache entry that holds its whole key and is used only when that key is the one asked
    for (a parsed config, a model's facts, a listing): a checksum of the key (zlib's crc32), not a digest, as
    two keys sharing a name only take turns (a miss, never a wrong hit). A plan's every cache is named so: no
    hashlib, whose OpenSSL is 2-3 ms of a plan's ~80."""
    import zlib

    return f"{zlib.crc32(key.encode('utf-8', 'surrogateescape')):08x}"


TOML_FORMAT = 3  # a kept parse: {"format", "key": the source's identity, "sum": the data's checksum, "data"}


def _toml_sum(data: Any) -> str:
    """A kept parse's checksum (zlib's crc32 of its canonical JSON): what a damaged or hand-edited entry fails."""
    import zlib

    return f"{zlib.crc32(json.dumps(data, sort_keys=True, separators=(',', ':')).encode()):08x}"


def _another_key(entry: Any, identity: str) -> bool:
    """A well-formed kept parse of another file, or of another version of it, that shares this one's name
    (cache_name): not damaged, only not this one's (rewritten, without a warning)."""
    return (
        isinstance(entry, dict)
        and entry.get("format") == TOML_FORMAT
        and isinstance(entry.get("key"), str)
        and entry["key"] != identity
    )


def load_toml(path: Path, keep_in: Path | None = None) -> dict[str, Any]:
    """A TOML file's tables. keep_in: a cache folder where the parsed form is kept as JSON (its path, size and
    mtime in the key), so the next run reads JSON instead of importing tomllib and parsing (about 8 ms a
    launch); callers pass it for safe-llama's own files (the packaged configs, the user's config), never for
    others (a test's would pile up). Such a file is read only from a trusted place (trust.problem), and a kept
    parse only when its key and sum hold: another key's entry under the same name (cache_name) is a miss,
    rewritten; one of this key whose sum is wrong is removed with a warning naming it. OSError when the file
    cannot be read; ValueError (tomllib.TOMLDecodeError) when it is not TOML or lies in an untrusted place."""
    cached = None
    if keep_in is not None:
        untrusted = trust.problem(Path(path).parent)
        if untrusted is not None:
            raise ValueError(f"not read: {untrusted}")
        st = os.stat(path)
        identity = f"{os.path.abspath(path)}|{st.st_size}|{st.st_mtime_ns}|{st.st_ino}"
        cached = keep_in / "toml" / f"{cache_name(identity)}.json"
        entry = read_json(cached, warn=False)
        if entry is not None and not _another_key(entry, identity):
            data = entry.get("data") if isinstance(entry, dict) else None
            wrong = (
                not isinstance(data, dict)
                or entry.get("format") != TOML_FORMAT
                or entry.get("key") != identity
                or entry.get("sum") != _toml_sum(data)
            )
            if not wrong:
                return data  # type: ignore[return-value]
            trust.drop_bad(str(cached), f"a parsed copy of {path} that does not match it")
    import tomllib

    data = tomllib.loads(Path(path).read_text())
    if cached is not None:
        # dates and times are not JSON (none in safe-llama's files); an unwritable cache: parsed again next time
        with contextlib.suppress(OSError, TypeError, ValueError):
            write_json(cached, {"format": TOML_FORMAT, "key": identity, "sum": _toml_sum(data), "data": data})
    return data


def clear_entries(root: Path) -> dict[str, int]:
    """Remove every kind of entry `forget` clears (ENTRY_FOLDERS), safely beside other processes doing the
    same: each folder is first renamed to a name of this process's own (one rename wins; a loser finds
    nothing), then removed. The number of files each held; nothing in an untrusted root (a warning says so)."""
    import shutil

    removed = dict.fromkeys(ENTRY_FOLDERS, 0)
    if not trusted_folder(root, "clearing"):
        return removed

    def gone_already(function: Any, name: str, info: Any) -> None:
        if not isinstance(info[1], FileNotFoundError):  # one that vanished: another forget's leftover run
            raise info[1]

    leftovers = [f for f in root.glob(".forgetting-*") if _dead(f.name.rsplit("-", 1)[-1])] if root.is_dir() else []
    for name in ENTRY_FOLDERS:
        folder = root / name
        if folder.is_symlink() or not folder.is_dir():
            continue  # never follow one (and none is made here)
        mine = root / f".forgetting-{name}-{os.getpid()}"
        try:
            os.rename(folder, mine)
        except FileNotFoundError:
            continue  # another forget took it
        removed[name] = sum(len(files) for _, _, files in os.walk(mine))
        leftovers.append(mine)
    for folder in leftovers:
        shutil.rmtree(folder, onerror=gone_already)
    return removed


def _dead(pid: str) -> bool:
    """The forget that renamed a folder to a name with this pid is gone (killed before it removed it)."""
    try:
        os.kill(int(pid), 0)
    except ProcessLookupError:
        return True
    except (ValueError, OSError):
        return False
    return False


def _json_entry_problem(path: Path, kind: str) -> str | None:
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError as err:
        return f"cannot be read ({err.strerror})"
    try:
        if not trust.private_file(fd):
            os.close(fd)
            return "not a file of yours that only you can write"
        with os.fdopen(fd, "rb") as f:
            data = json.loads(f.read())
    except (ValueError, OSError) as err:
        return f"not JSON ({str(err).splitlines()[0]})"
    if not isinstance(data, dict):
        return f"not a table ({type(data).__name__})"
    if kind == "toml" and (
        data.get("format") != TOML_FORMAT
        or not isinstance(data.get("data"), dict)
        or data.get("sum") != _toml_sum(data["data"])
    ):
        return "a parsed config whose sum does not match"
    return None


def check_entries(root: Path) -> list[str]:
    """What is wrong with the entries kept under root, one line each naming the file (doctor's check);
    changes nothing."""
    untrusted = trust.problem(root)
    if untrusted is not None:
        return [f"{root} is not used: {untrusted}"]
    found = []
    for kind in ENTRY_FOLDERS:
        folder = root / kind
        if folder.is_symlink() or not folder.is_dir():
            continue
        for path in sorted(folder.iterdir()):
            if path.name.startswith("."):
                continue  # a write in progress (write_bytes' temporary file)
            if kind in ("args", "launch"):
                shape = trust.SHAPES["secret-options" if path.name == "secret-options" else kind]
                wrong = trust.read_entry(str(path), shape)[1]
            else:
                wrong = _json_entry_problem(path, kind)
            if wrong is not None:
                found.append(f"{path}: {wrong}")
    return found
