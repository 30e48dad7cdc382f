"""Which places safe-llama trusts, and the shape of what it reads back from them.

Owns the rule for a trusted place, as OpenSSH's StrictModes: every component of the path (and of the path
its symlinks lead to) is owned by root or this user and writable by neither group nor others, but a
root-owned sticky folder above it (/tmp), where no one can rename or remove another's entry; and the
shape check of a kept entry (a marshal'd dict), which removes a bad one with a warning naming it.
Must stay light (os, stat, sys, marshal): the early start calls it before anything else is imported; takes
paths as values and reads no environment.
"""

from __future__ import annotations

import marshal
import os
import stat
import sys

TYPE_CHECKING = False  # typing.TYPE_CHECKING without importing typing (mypy reads the name)
if TYPE_CHECKING:
    from collections.abc import Mapping
    from typing import Any

# a path found trusted once stays so for this process: every component is this user's or root's, so no one
# else can change it (a path with a missing component is looked at again: what makes it may be someone else)
_trusted: set[str] = set()
_said: set[str] = set()  # problems already reported on stderr (each once per process)


def _component_problem(path: str, st: os.stat_result, uid: int, last: bool) -> str | None:
    if st.st_uid not in (0, uid):
        return f"{path} is owned by uid {st.st_uid}, not by you (uid {uid}) or root"
    if stat.S_ISLNK(st.st_mode):
        return None  # a symlink's own mode means nothing; where it leads is checked on its own
    writable = st.st_mode & 0o022
    if not writable:
        return None
    if not last and st.st_uid == 0 and st.st_mode & stat.S_ISVTX and stat.S_ISDIR(st.st_mode):
        return None  # /tmp: a sticky folder lets no one rename or remove another's entry
    who = " and ".join(w for w, bit in (("group", 0o020), ("others", 0o002)) if st.st_mode & bit)
    return f"{path} is writable by {who} ({stat.filemode(st.st_mode)})"


def _walk(path: str, uid: int) -> tuple[str | None, bool]:
    """The first untrusted component of path (None: none), and whether every component exists."""
    parts = path.split(os.sep)
    current = os.sep
    for i, part in enumerate(parts):
        if part:
            current = os.path.join(current, part)
        elif i:
            continue
        try:
            st = os.lstat(current)
        except (FileNotFoundError, NotADirectoryError):  # what cannot be made there fails where it is made
            return None, False
        except OSError as err:
            return f"{current} cannot be checked ({err.strerror})", True
        found = _component_problem(current, st, uid, last=i == len(parts) - 1)
        if found is not None:
            return found, True
    return None, True


def problem(path: str | os.PathLike[str]) -> str | None:
    """What makes path untrusted, in words that name the component ("/tmp/x is writable by others (...)");
    None when it is trusted. A path that does not exist yet is judged by the components that do."""
    given = os.path.abspath(os.fspath(path))
    if given in _trusted:
        return None
    uid = os.geteuid()
    found, complete = _walk(given, uid)
    if found is None:
        real = os.path.realpath(given)
        if real != given:
            found, whole = _walk(real, uid)
            complete = complete and whole
    if found is None and complete:
        _trusted.add(given)
    return found


def say_once(line: str, key: str | None = None) -> None:
    """A warning on stderr, once per process (per key: the problem it reports) however many reads run into it."""
    if (line if key is None else key) not in _said:
        said(line if key is None else key)
        sys.stderr.write(f"safe-llama: warning: {line}\n")


def said(key: str) -> None:
    """Note a problem as reported (its caller said it its own way)."""
    _said.add(key)


def private_file(fd: int, uid: int | None = None) -> bool:
    """The open file is this user's and no one else can write it."""
    st = os.fstat(fd)
    return stat.S_ISREG(st.st_mode) and st.st_uid == (os.geteuid() if uid is None else uid) and not st.st_mode & 0o022


def shape_problem(data: object, shape: Mapping[str, type | tuple[type, ...]]) -> str | None:
    """What is wrong with a kept entry's shape (a dict holding every key of shape, each of its types); None
    when it is right. bool is not taken for int."""
    if not isinstance(data, dict):
        return f"not a table ({type(data).__name__})"
    for key, kinds in shape.items():
        if key not in data:
            return f"no {key!r}"
        value = data[key]
        wanted = kinds if isinstance(kinds, tuple) else (kinds,)
        if not isinstance(value, wanted) or (isinstance(value, bool) and bool not in wanted):
            return f"{key!r} is {type(value).__name__}, not {' or '.join(k.__name__ for k in wanted)}"
    return None


def drop_bad(path: str, why: str) -> None:
    """Remove a kept entry of the wrong shape, saying which and why (one line); another process may have
    removed it first."""
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass
    except OSError as err:
        say_once(f"{path}: {why}; it cannot be removed ({err.strerror})")
        return
    say_once(f"removed {path}: {why}")


_SEQUENCE = (list, tuple)
# the shapes of the marshal'd entries kept in the cache, by folder (their writers own what the values mean:
# remembered/passthrough.py the no-model tables, remembered/fast_record.py the launch records and the secret options)
SHAPES: dict[str, dict[str, type | tuple[type, ...]]] = {
    "args": {"names": dict, "env": _SEQUENCE},
    "launch": {
        "format": int,
        "tool": str,
        "salt": bytes,
        "binary": str,
        "argv": _SEQUENCE,
        "extra_env": dict,
        "lines": _SEQUENCE,
        "status": str,
        "files": _SEQUENCE,
        "contents": _SEQUENCE,
        "env": _SEQUENCE,
        "env_present": _SEQUENCE,
        "env_prefixes": _SEQUENCE,
        "host": (*_SEQUENCE, type(None)),
        "counters": _SEQUENCE,
        "cgroup": (int, type(None)),
        "device": (*_SEQUENCE, type(None)),
        "others": str,
        "book": _SEQUENCE,
    },
    "secret-options": {"options": _SEQUENCE},
    "resume": {"format": int, "pid": int, "returncode": int, "evidence": str, "outputs": _SEQUENCE},
}


def read_entry(path: str, shape: Mapping[str, type | tuple[type, ...]]) -> tuple[dict[str, Any] | None, str | None]:
    """A marshal'd entry and what is wrong with it, changing nothing: (the entry, None) when it is this
    user's, in a trusted folder, of the shape; (None, None) when it is not there; (None, why) otherwise."""
    folder = os.path.dirname(os.path.abspath(path))
    untrusted = problem(folder)
    if untrusted is not None:
        return None, untrusted
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except FileNotFoundError:
        return None, None
    except OSError as err:
        return None, f"cannot be read ({err.strerror})"
    try:
        if not private_file(fd):
            return None, "not a file of yours that only you can write"
        with os.fdopen(fd, "rb") as f:
            fd = -1
            data = marshal.load(f)  # noqa: S302 -- a file only this user can write, in a place only they can
    except (EOFError, ValueError, TypeError):
        return None, "not a marshal'd table"
    except OSError as err:
        return None, f"cannot be read ({err.strerror})"
    finally:
        if fd >= 0:
            os.close(fd)
    wrong = shape_problem(data, shape)
    return (None, f"the entry's shape is wrong ({wrong})") if wrong is not None else (data, None)


def load_entry(path: str, shape: Mapping[str, type | tuple[type, ...]]) -> dict[str, Any] | None:
    """A marshal'd dict kept in a trusted folder by this user, of the given shape (SHAPES); None otherwise:
    not there, or in an untrusted place or someone else's (left alone, a warning says so once), or of a bad
    shape or content (removed, with a warning naming it)."""
    data, wrong = read_entry(path, shape)
    if wrong is None:
        return data
    folder = os.path.dirname(os.path.abspath(path))
    if problem(folder) is not None:
        say_once(f"not using {folder}: {wrong}", key=wrong)
    elif wrong.startswith(("not a marshal", "the entry's shape")):
        drop_bad(path, wrong)
    else:
        say_once(f"not reading {path}: {wrong}")
    return None
