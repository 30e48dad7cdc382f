"""The gguf package's constants (quantization sizes, key names) without importing the gguf package.

`import gguf` pulls in numpy and the reader (about 0.3 s); its constants module needs only the
standard library, so it is loaded on its own by file path. Owns that loading; reads no GGUF files.
"""

from __future__ import annotations

import importlib.util
import sys
import threading
from functools import cache
from types import ModuleType

# sys.modules holds the module before it has finished executing: a second thread must wait, not use it
_LOADING = threading.Lock()


@cache
def constants() -> ModuleType:
    with _LOADING:
        return _load()


def _load() -> ModuleType:
    name = "safe_llama._gguf_constants"
    if name in sys.modules:
        return sys.modules[name]
    package = importlib.util.find_spec("gguf")
    if package is None or not package.submodule_search_locations:
        raise ImportError("the gguf package is not installed")
    path = f"{next(iter(package.submodule_search_locations))}/constants.py"
    spec = importlib.util.spec_from_file_location(name, path)
    if spec is None or spec.loader is None:
        raise ImportError(f"cannot load {path}")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module
