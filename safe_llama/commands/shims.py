"""`safe-llama install-shims`: links named llama-cli, llama-server and llama-completion that start
safe-llama's drop-ins, so scripts and habits that call llama.cpp by name go through safe-llama.

Owns placing and removing those links. Never replaces a file it did not make: a real llama.cpp binary stays
where it is, and safe-llama still finds it (its search skips safe-llama's own links; SAFE_LLAMA_BIN_DIR or
the pinned build name it exactly).
"""

from __future__ import annotations

import os
import shutil
import sys
import sysconfig
from collections.abc import Mapping
from pathlib import Path

from safe_llama.cmdline.own_options import flag
from safe_llama.errors import ExitStatus

SHIMS = {
    "llama-cli": "safe-llama-cli",
    "llama-server": "safe-llama-server",
    "llama-completion": "safe-llama-completion",
}


def default_dir(env: Mapping[str, str] = os.environ) -> Path:
    """/usr/local/bin for root, ~/.local/bin for everyone else (where scripts/setup.sh puts its links)."""
    if os.geteuid() == 0:
        return Path("/usr/local/bin")
    return Path(env.get("HOME", str(Path.home()))) / ".local" / "bin"


def scripts_dir() -> Path:
    """The folder holding this installation's console scripts (the virtual environment's bin/)."""
    return Path(sysconfig.get_path("scripts"))


def _ours(link: Path, scripts: Path) -> bool:
    if not link.is_symlink():
        return False
    target = Path(os.readlink(link))
    return target.parent == scripts and target.name in SHIMS.values()


def install_shims(directory: Path, *, scripts: Path, remove: bool = False, path: str = "") -> tuple[list[str], bool]:
    """Link (or unlink) each shim; the lines to print and whether every one was done."""
    lines: list[str] = []
    ok = True
    if not remove:
        directory.mkdir(parents=True, exist_ok=True)
    for name, script in SHIMS.items():
        link = directory / name
        if remove:
            if _ours(link, scripts):
                link.unlink()
                lines.append(f"removed {link}")
            continue
        if (link.exists() or link.is_symlink()) and not _ours(link, scripts):
            what = f"a link to {os.readlink(link)}" if link.is_symlink() else "a file safe-llama did not make"
            lines.append(f"left {link} alone: it is {what}")
            ok = False
            continue
        target = scripts / script
        if not target.is_file():
            lines.append(f"cannot link {link}: {target} is not installed")
            ok = False
            continue
        tmp = directory / f".{name}.safe-llama-tmp"
        tmp.unlink(missing_ok=True)
        tmp.symlink_to(target)
        tmp.replace(link)
        lines.append(f"{link} -> {target}")
    if not remove:
        winner = shutil.which("llama-server", path=path) if path else None
        if winner is None:
            lines.append(f"{directory} is not on PATH: add it to run llama-server through safe-llama")
        elif Path(winner).parent != directory:
            lines.append(f"llama-server on PATH is {winner}, which comes before {directory}")
    return lines, ok


def main(settings: Mapping[str, str], words: list[str]) -> int:
    """The command's runner (cmdline.own_options.COMMANDS): `install-shims`' options as entry.py read them."""
    folder = Path(settings["dir"]) if settings.get("dir") else default_dir(os.environ)
    lines, ok = install_shims(
        folder, scripts=scripts_dir(), remove=bool(flag(settings, "remove")), path=os.environ.get("PATH", "")
    )
    sys.stdout.write("".join(f"safe-llama: {line}\n" for line in lines))
    return int(ExitStatus.OK if ok else ExitStatus.FAILED)
