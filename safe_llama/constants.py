"""The names and small rules every part of safe-llama shares, written once: the tools and their binaries, the
variable that marks a child started by safe-llama, where the cache and the user's config live (the XDG rule),
where the packaged policy files are, and how the values of secret options are masked in a list of words.

Owns those definitions; must stay a leaf that imports nothing but os (the early start, remembered/early.py and
remembered/passthrough.py, reads it before anything else is imported) and reads no environment of its own: every
rule here takes the environment as an argument.
"""

from __future__ import annotations

import os

TYPE_CHECKING = False  # typing.TYPE_CHECKING without importing typing (mypy reads the name)
if TYPE_CHECKING:  # collections.abc costs an import on the early path
    from collections.abc import Collection, Mapping, Sequence

# the tools a launch names (safe-llama server ...) and, with the RPC worker, the llama.cpp binary of each
TOOLS = ("cli", "server", "completion")
TOOL_BINARY = {
    "cli": "llama-cli",
    "server": "llama-server",
    "completion": "llama-completion",
    "rpc-server": "ggml-rpc-server",
}
# set in the environment of every child safe-llama starts: a safe-llama started by one refuses to loop
GUARD_ENV = "SAFE_LLAMA_SUPERVISOR_PID"
# names the file a start handed off at the spawn left when it failed: the full safe-llama goes on from it
# (attempts/resume.py); an early start steps aside for it
RESUME_ENV = "SAFE_LLAMA_RESUME"
# the ledger of the launches on the machine (device/ledger.py): its folder under each runtime directory
LEDGER = "ledger"
LEDGER_SYSTEM = "/run/safe-llama"  # the services' runtime directory
# the bounds of a ledger entry's texts and byte counts (device/ledger.py reads an entry, early.py a record's)
LEDGER_TEXT_MOST, LEDGER_BYTES_MOST = 256, 1 << 62


def ledger_folders(env: Mapping[str, str], system: str = LEDGER_SYSTEM) -> tuple[str, ...]:
    """Every ledger folder a launch reads: the unit's runtime directory, the system's, the user's (the early
    start lists them before it imports the ledger itself)."""
    found = []
    if env.get("RUNTIME_DIRECTORY"):
        found.append(os.path.join(env["RUNTIME_DIRECTORY"].split(":")[0], LEDGER))
    found.append(os.path.join(system, LEDGER))
    if env.get("XDG_RUNTIME_DIR"):
        found.append(os.path.join(env["XDG_RUNTIME_DIR"], "safe-llama", LEDGER))
    return tuple(found)


def xdg_home(env: Mapping[str, str], name: str, fallback: str) -> str:
    """An XDG base directory: the variable's value when absolute (the XDG spec says relative values are
    invalid and must be ignored), else ~/fallback."""
    value = env.get(name, "")
    if value and os.path.isabs(value):
        return value
    return os.path.join(env.get("HOME") or os.path.expanduser("~"), fallback)


def cache_root(env: Mapping[str, str]) -> str:
    """safe-llama's cache folder: ${XDG_CACHE_HOME:-~/.cache}/safe-llama."""
    return os.path.join(xdg_home(env, "XDG_CACHE_HOME", ".cache"), "safe-llama")


def config_root(env: Mapping[str, str]) -> str:
    """The user's config folder: ${XDG_CONFIG_HOME:-~/.config}/safe-llama (config.toml, devices/)."""
    return os.path.join(xdg_home(env, "XDG_CONFIG_HOME", ".config"), "safe-llama")


def packaged_configs() -> str:
    """The packaged policy files: package data in an installed wheel (safe_llama/configs), configs/ at the top
    of the source tree in a checkout or an editable install."""
    package = os.path.dirname(os.path.abspath(__file__))
    packaged = os.path.join(package, "configs")
    return packaged if os.path.isdir(packaged) else os.path.join(os.path.dirname(package), "configs")


def configs_root(env: Mapping[str, str]) -> str:
    """The policy files in use: SAFE_LLAMA_CONFIGS when set, else the packaged ones."""
    return env.get("SAFE_LLAMA_CONFIGS") or packaged_configs()


def mask_values(words: Sequence[str], hidden: Collection[str], mask: str) -> list[str]:
    """words with the value of every option named in hidden (`--opt VALUE`, `--opt=VALUE`; a long option's
    underscores read as dashes, as llama.cpp reads them) replaced by mask."""
    out = list(words)
    for i, word in enumerate(out):
        spelled = word.replace("_", "-") if word.startswith("--") else word
        name, eq, _ = spelled.partition("=")
        if name in hidden and eq:
            out[i] = f"{word.partition('=')[0]}={mask}"
        elif spelled in hidden and i + 1 < len(out):
            out[i + 1] = mask
    return out


def scrub(text: str, values: Collection[str], mask: str) -> str:
    """text with every occurrence of each secret value masked (longest first: one secret may hold another);
    a value shorter than 3 characters is left alone, as it would mask unrelated words and numbers."""
    for value in sorted(values, key=len, reverse=True):
        if len(value) >= 3:
            text = text.replace(value, mask)
    return text
