"""Small JSON files under the cache directory: written atomically, 0600, never through a symlink.

Owns the file discipline for everything safe-llama stores (model facts, probe results, remembered
plans); callers own the content. A corrupt or unreadable file reads as missing, with a warning.
"""

from __future__ import annotations

import contextlib
import json
import os
import sys
import tempfile
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


def write_json(path: Path, value: Any) -> None:
    """Write to a temp file in the same directory, fsync, then os.replace: readers see old or new."""
    _mkdirs(path.parent)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    try:
        with os.fdopen(fd, "w") as f:
            os.fchmod(f.fileno(), 0o600)
            json.dump(value, f, separators=(",", ":"))
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


def _mkdirs(folder: Path) -> None:
    """Create folder and its missing parents, each 0700 (mkdir(parents=True) gives parents 0755)."""
    missing = []
    while not folder.exists():
        missing.append(folder)
        folder = folder.parent
    for directory in reversed(missing):
        with contextlib.suppress(FileExistsError):
            directory.mkdir(mode=0o700)


def file_key(path: Path) -> str:
    """Identity of a file's current content for cache keys: real path, size, mtime, inode."""
    st = path.stat()
    return f"{path.resolve()}|{st.st_size}|{st.st_mtime_ns}|{st.st_ino}"
