"""Small JSON files under the cache directory: written atomically, 0600, never through a symlink.

Owns the file discipline for everything safe-llama stores (model facts, probe results, remembered
plans); callers own the content. A corrupt or unreadable file reads as missing, with a warning.
"""

from __future__ import annotations

import contextlib
import json
import os
import sys
from pathlib import Path
from typing import Any


def read_json(path: Path, *, warn: bool = True) -> Any | None:
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except FileNotFoundError:
        return None
    except OSError as err:
        if warn:
            sys.stderr.write(f"safe-llama: warning: ignoring {path}: {err.strerror}\n")
        return None
    try:
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
    later write off and return one line saying why (a launch then runs without caching or remembering)."""
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
    if _writes_off:
        return
    make_dirs(path.parent)
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
    """A hex digest for cache keys and file names."""
    import hashlib

    return hashlib.blake2b(text.encode(), digest_size=32).hexdigest()[:length]


def load_toml(path: Path, keep_in: Path | None = None) -> dict[str, Any]:
    """A TOML file's tables. keep_in: a cache folder where the parsed form is kept as JSON (its path, size and
    mtime in the key), so the next run reads JSON instead of importing tomllib and parsing (about 8 ms a
    launch); callers pass it for safe-llama's own files (the packaged configs, the user's config), never for
    others (a test's would pile up). OSError when the file cannot be read; ValueError
    (tomllib.TOMLDecodeError) when it is not TOML."""
    cached = None
    if keep_in is not None:
        st = os.stat(path)
        key = digest(f"{os.path.abspath(path)}|{st.st_size}|{st.st_mtime_ns}|{st.st_ino}", 32)
        cached = keep_in / "toml" / f"{key}.json"
        data = read_json(cached, warn=False)
        if isinstance(data, dict):
            return data
    import tomllib

    data = tomllib.loads(Path(path).read_text())
    if cached is not None:
        # dates and times are not JSON (none in safe-llama's files); an unwritable cache: parsed again next time
        with contextlib.suppress(OSError, TypeError, ValueError):
            write_json(cached, data)
    return data
