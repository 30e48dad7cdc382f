"""Finding the real llama.cpp binary for a tool, never safe-llama itself.

Owns the search order: an explicit path or directory, SAFE_LLAMA_BIN_DIR, the config's bin_dir, PATH,
then the pinned build (the user's cache, then the system-wide install), used only from a trusted place
(trust.problem: every component root's or the user's, none writable by others; a place the user named is
theirs to choose). Takes PATH and env as values; only stats files.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from pathlib import Path

from safe_llama import trust
from safe_llama.constants import TOOL_BINARY
from safe_llama.device.self_check import is_self as _is_self
from safe_llama.device.self_check import own_paths
from safe_llama.errors import ExitStatus, SafeLlamaError
from safe_llama.paths import pinned_bin_dirs


def find_binary(
    tool: str,
    *,
    env: Mapping[str, str],
    explicit: str | None = None,
    explicit_from: str = "--llama-bin",
    config_bin_dir: str | None = None,
    own: Sequence[str] | None = None,
) -> Path:
    """The real binary for `tool`; 127 when there is none, 126 when it is not executable."""
    return locate_binary(
        tool, env=env, explicit=explicit, explicit_from=explicit_from, config_bin_dir=config_bin_dir, own=own
    )[0]


def locate_binary(
    tool: str,
    *,
    env: Mapping[str, str],
    explicit: str | None = None,
    explicit_from: str = "--llama-bin",
    config_bin_dir: str | None = None,
    own: Sequence[str] | None = None,
) -> tuple[Path, str]:
    """The real binary for `tool` and where it was found (the reason it was chosen). explicit_from: where
    `explicit` was set (the option, the SAFE_LLAMA_BIN_DIR variable, the config file), named by an error."""
    name = TOOL_BINARY[tool]
    own = own_paths() if own is None else own
    candidates: list[tuple[str, Path]] = []
    if explicit:
        given = Path(explicit)
        candidates.append((explicit_from, given / name if given.is_dir() else given))
    if env.get("SAFE_LLAMA_BIN_DIR"):
        candidates.append(("SAFE_LLAMA_BIN_DIR", Path(env["SAFE_LLAMA_BIN_DIR"]) / name))
    if config_bin_dir:
        candidates.append(("config bin_dir", Path(config_bin_dir) / name))
    for source, path in candidates:  # explicit choices: a wrong one is an error, not a fallback
        if not path.exists():
            from safe_llama.messages import BINARY_NO_SUCH_FILE  # the templates, where one is said

            raise BINARY_NO_SUCH_FILE.error(ExitStatus.NOT_FOUND, path=path, source=source)
        if _is_self(str(path), own):
            raise SafeLlamaError(
                f"safe-llama: {path} ({source}) is safe-llama itself, not llama.cpp", ExitStatus.NOT_FOUND
            )
        if not os.access(path, os.X_OK) or path.is_dir():
            raise SafeLlamaError(f"safe-llama: {path} ({source}): not executable", ExitStatus.NOT_EXECUTABLE)
        return path, source
    for directory in env.get("PATH", "").split(os.pathsep):
        found = os.path.join(directory, name)  # shutil.which's test on POSIX (shutil imports the compression modules)
        if directory and os.path.isfile(found) and os.access(found, os.X_OK) and not _is_self(found, own):
            return Path(found), "PATH"
    places = pinned_bin_dirs("cpu", env)
    for where, folder in places:
        pinned = folder / name
        if pinned.is_file() and os.access(pinned, os.X_OK):
            untrusted = trust.problem(pinned)
            if untrusted is None:
                return pinned, f"the pinned build in {where}"
            trust.say_once(f"not running {pinned} (the pinned build in {where}): {untrusted}")
    from safe_llama.messages import BINARY_NOT_FOUND

    raise BINARY_NOT_FOUND.error(ExitStatus.NOT_FOUND, name=name, places=", ".join(str(p) for _, p in places))
