"""startup.py keeps the compiled code of dataclass methods between runs: the classes behave exactly as without
it, the second run compiles nothing, and a cache file others could write is not loaded."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from safe_llama.startup import _load, cache_file
from tests import ROOT

SCRIPT = """
import dataclasses, json, sys
from safe_llama import startup
installed = startup.install({"XDG_CACHE_HOME": sys.argv[1]})
compiled = []
real_compile = compile
def counting(*a, **k):
    compiled.append(1)
    return real_compile(*a, **k)
import builtins
builtins.compile = counting

@dataclasses.dataclass(frozen=True)
class Point:
    x: int
    y: int = 2
    tags: tuple[str, ...] = dataclasses.field(default_factory=tuple)

p = Point(1)
try:
    p.x = 5
    frozen = False
except dataclasses.FrozenInstanceError:
    frozen = True
print(json.dumps({"installed": installed, "compiled": len(compiled), "repr": repr(p), "eq": p == Point(1, 2),
                  "hash": hash(p) == hash(Point(1)), "frozen": frozen, "replaced": repr(dataclasses.replace(p, y=3))}))
"""


def _run(cache: Path) -> dict[str, object]:
    import json

    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    done = subprocess.run([sys.executable, "-c", SCRIPT, str(cache)], env=env, capture_output=True, text=True,
                          timeout=60, check=True)  # fmt: skip
    result: dict[str, object] = json.loads(done.stdout)
    return result


def test_classes_behave_the_same_and_the_second_run_compiles_nothing(tmp_path: Path) -> None:
    first = _run(tmp_path)
    if not first["installed"]:  # a Python whose dataclasses are not the ones startup.py knows: nothing to test
        assert first["compiled"] == 0
        return
    assert isinstance(first["compiled"], int) and first["compiled"] > 0
    assert (tmp_path / "safe-llama" / "python").is_dir()
    second = _run(tmp_path)
    assert second["compiled"] == 0
    expected = {"repr": "Point(x=1, y=2, tags=())", "eq": True, "hash": True, "frozen": True,
                "replaced": "Point(x=1, y=3, tags=())"}  # fmt: skip
    for run in (first, second):
        assert {k: run[k] for k in expected} == expected


def test_a_cache_file_others_can_write_is_not_loaded(tmp_path: Path) -> None:
    _run(tmp_path)
    path = cache_file(tmp_path / "safe-llama" / "python")
    if not path.exists():
        return  # not installed on this Python
    assert _load(path)
    path.chmod(0o666)
    assert _load(path) == {}
    path.write_bytes(b"not marshal data")
    path.chmod(0o644)
    assert _load(path) == {}


def test_another_create_fn_is_left_alone(tmp_path: Path) -> None:
    """A Python whose dataclasses._create_fn differs (3.13 rewrote it) gets no cache and no change."""
    code = (
        "import dataclasses\n"
        "def _create_fn(name, args, body, *, globals=None, locals=None, return_type=None):\n"
        "    return 'a different text'\n"
        "dataclasses._create_fn = _create_fn\n"
        "from safe_llama import startup\n"
        f"print(startup.install({{'XDG_CACHE_HOME': {str(tmp_path)!r}}}), dataclasses._create_fn is _create_fn)\n"
    )
    done = subprocess.run([sys.executable, "-c", code], env={**os.environ, "PYTHONPATH": str(ROOT)},
                          capture_output=True, text=True, timeout=60, check=True)  # fmt: skip
    assert done.stdout.split() == ["False", "True"]
