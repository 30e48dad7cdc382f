"""What keeps safe-llama's own start short: a cache of the code Python cannot cache itself.

Python keeps every module's compiled code in __pycache__, but not the methods @dataclass writes at import
(__init__, __eq__, __repr__, __hash__, __setattr__ of each class: 65 classes on a launch, ~90 ms of compiling
on a 2-core machine). Their source text is the same on every run, so their compiled code is kept here, in
safe-llama's cache folder, one file per Python version and bytecode magic, read with marshal as Python reads
__pycache__ (same trust: a folder only this user can write). Where the standard library's private
`dataclasses._create_fn` is not the one this was written for (Python 3.13 rewrote it), nothing is changed.

Owns that cache; must not change what any class does (the same text is compiled, with the same globals).
"""

from __future__ import annotations

import atexit
import os
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

# dataclasses._create_fn(name, args, body, *, globals=None, locals=None, return_type=MISSING) in 3.10-3.12,
# and the literals its text is built from (3.11; 3.12 names the return type __dataclass_return_type__): any
# other function leaves dataclasses alone
_SIGNATURE = ("name", "args", "body", "globals", "locals", "return_type")
_LITERALS = ("", ",", "\n", " def ", "(", ")", ":\n", ", ", "def __create_fn__(", "):\n", "\n return ", "__create_fn__")
_RETURN_NAMES = ("_return_type", "__dataclass_return_type__")


def cache_file(folder: Path, part: str = "") -> Path:
    from importlib.util import MAGIC_NUMBER

    tag = f"{sys.implementation.cache_tag}-{MAGIC_NUMBER.hex()}"
    return folder / f"dataclass-methods-{part + '-' if part else ''}{tag}.marshal"


def install(env: Mapping[str, str] = os.environ, part: str = "") -> bool:
    """Serve dataclass methods from the cache from now on; False when this Python's dataclasses differ (then
    nothing changes). An unusable cache folder only means compiling as Python would. part: a path that
    creates few of the classes keeps its own, smaller file (an early start's supervisor: "early"), as
    loading all of them would cost more than compiling its own."""
    import dataclasses

    create = getattr(dataclasses, "_create_fn", None)
    code = getattr(create, "__code__", None)
    if code is None or code.co_varnames[: len(_SIGNATURE)] != _SIGNATURE or sys.implementation.name != "cpython":
        return False
    literals = [c for c in code.co_consts if isinstance(c, str)]
    returns = [n for n in _RETURN_NAMES if n in literals and f"->{n}" in literals]
    if len(returns) != 1 or [c for c in literals if c not in (returns[0], f"->{returns[0]}")] != list(_LITERALS):
        return False
    return_name = returns[0]
    from safe_llama.paths import cache_dir

    path = cache_file(cache_dir(env) / "python", part)
    codes = _load(path)
    before = len(codes)
    used: set[str] = set()
    missing = dataclasses.MISSING

    def _create_fn(
        name: str,
        args: list[str],
        body: list[str],
        *,
        globals: dict[str, Any] | None = None,
        locals: dict[str, Any] | None = None,
        return_type: Any = missing,
    ) -> Any:
        # the text below is built exactly as dataclasses._create_fn builds it (CPython 3.10-3.12)
        if locals is None:
            locals = {}
        return_annotation = ""
        if return_type is not missing:
            locals[return_name] = return_type
            return_annotation = f"->{return_name}"
        joined = ",".join(args)
        lines = "\n".join(f"  {b}" for b in body)
        txt = f" def {name}({joined}){return_annotation}:\n{lines}"
        txt = f"def __create_fn__({', '.join(locals.keys())}):\n{txt}\n return {name}"
        used.add(txt)
        compiled = codes.get(txt)
        if compiled is None:
            compiled = codes[txt] = compile(txt, "<string>", "exec")
        ns: dict[str, Any] = {}
        exec(compiled, globals, ns)  # noqa: S102 -- what dataclasses itself runs, compiled once
        return ns["__create_fn__"](**locals)

    dataclasses._create_fn = _create_fn  # type: ignore[attr-defined]

    def save() -> None:
        if len(codes) != before:
            # entries of classes gone (an older safe-llama) are dropped once they far outnumber this run's
            kept = codes if len(codes) <= 4 * len(used) + 512 else {t: codes[t] for t in used}
            _store(path, kept)

    atexit.register(save)
    return True


def _load(path: Path) -> dict[str, Any]:
    import marshal

    try:
        with path.open("rb") as f:
            st = os.fstat(f.fileno())
            if st.st_uid != os.getuid() or st.st_mode & 0o022:
                return {}  # only a file this user wrote and no one else can: code is loaded from it
            data = marshal.load(f)  # noqa: S302 -- as Python loads __pycache__, from a file checked above
    except (OSError, EOFError, ValueError, TypeError):
        return {}
    return data if isinstance(data, dict) else {}


def _store(path: Path, codes: dict[str, Any]) -> None:
    import marshal

    try:
        path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        tmp = path.with_name(f"{path.name}.{os.getpid()}.tmp")
        with tmp.open("wb") as f:
            marshal.dump(codes, f)
        os.replace(tmp, path)
    except OSError:
        return  # an unwritable cache: the next start compiles again, as Python would
