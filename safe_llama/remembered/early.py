"""The early start: a launch whose plan is already known starts llama.cpp before the planner and the
supervisor are imported, from a launch record (fast_record.py writes it when a launch becomes ready).

A record is found by the launch's own words (which door, its argv with the values of secret options masked, the
working directory) and used only while everything its plan was made from is as it was: safe-llama's own files,
every file and directory the plan read (by identity: device, inode, size, mtime; /proc and /sys ones by
content), every environment variable it read (by a salted digest of the value; a secret one, which no plan reads
the value of, by whether it is set), and a host budget still at least what the plan needs, and a cgroup's
headroom too where one limits it (fast_record.py says why that rule is sound). A plan made for a GPU holds too
while that GPU's free memory, one vendor reading (device/vendor_free.py), is within the plan's margin of what it
was (fast_record.device_rule says why; a server's child starts while that reading answers and is killed unseen
if it says otherwise: _start), and while the other launches sharing the machine are the ones it was
planned beside (other_launches). The child then gets the recorded argv and environment changes, and the
supervisor, once imported, adopts it (launch.adopted) as attempt 1 and writes its ledger entry from what the
record kept of the plan's reservation (booking: the entry comes right after the spawn).

Owns the record's key, its reading and its validity check, and the start itself; must stay light (os,
sys, hashlib, constants and trust (marshal); vendor_free, with select, only for a GPU's record; fork_exec, with
signal, only once a record is found: no subprocess, dataclasses, typing, pathlib, json, re, ctypes) as it runs
before anything else. Pipe mode only: a terminal on both
stdin and stdout takes the normal path (the pty).

Over 400 lines on purpose: what runs before the supervisor is imported is one module, one import.
"""

from __future__ import annotations

import hashlib
import os
import sys

from safe_llama import __version__, trust
from safe_llama.constants import (
    GUARD_ENV,
    LEDGER_BYTES_MOST,
    LEDGER_TEXT_MOST,
    RESUME_ENV,
    cache_root,
    ledger_folders,
    mask_values,
)
from safe_llama.device.oom_counters import parse_meminfo, read_counters

TYPE_CHECKING = False  # typing.TYPE_CHECKING without importing typing (mypy reads the name)
if TYPE_CHECKING:  # collections.abc costs an import on the early path
    from collections.abc import Collection, Mapping, Sequence
    from typing import Any

    from safe_llama.device import vendor_free
    from safe_llama.process import fork_exec

FORMAT = 3  # 2: a GPU's free memory (device) and the other launches (others); 3: the ledger entry's figures (book)
FOLDER = "launch"  # under the cache directory
# /proc and /sys files whose content changes on its own: the host rule checks what they feed (MemAvailable, the
# cgroup's headroom)
# amdgpu's VRAM counter moves with every program's use: the device rule checks what it feeds (free memory)
VOLATILE = ("/proc/meminfo", "memory.current", "memory.stat", "memory.usage_in_bytes", "mem_info_vram_used")
# the largest answer a pseudo-file may give to be recorded by content
CONTENT_LIMIT = 1 << 16


def _blake(data: bytes, salt: bytes = b"") -> str:
    return hashlib.blake2b(data, digest_size=20, key=salt).hexdigest()


def key(door: str, args: Sequence[str], cwd: str, hidden: Collection[str] = ()) -> str:
    """The record's file name: which door (safe-llama or a tool's drop-in), the words given (the values of
    the secret options in hidden masked: not even a digest of them names a file), where."""
    text = "\0".join([str(FORMAT), __version__, sys.executable, door, cwd, *masked(args, hidden)])
    return _blake(text.encode("utf-8", "surrogateescape"))


def masked(args: Sequence[str], hidden: Collection[str]) -> list[str]:
    """args with the value of every option in hidden replaced by a NUL (which no word holds)."""
    return mask_values(args, hidden, "\0")


def secret_options_path(env: Mapping[str, str]) -> str:
    """Every spelling of a secret option (configs/secrets.toml, widened by the option table), kept beside the
    records by the launch that writes one (fast_record.store)."""
    return os.path.join(cache_root(env), FOLDER, "secret-options")  # marshal, not a record (*.marshal)


def secret_options(env: Mapping[str, str]) -> frozenset[str] | None:
    kept = trust.load_entry(secret_options_path(env), trust.SHAPES["secret-options"])
    options = kept.get("options") if kept is not None else None
    return frozenset(map(str, options)) if isinstance(options, list) else None


def record_path(env: Mapping[str, str], digest: str) -> str:
    return os.path.join(cache_root(env), FOLDER, f"{digest}.marshal")


def identity(path: str) -> tuple[int, int, int, int] | None:
    """A file's or directory's identity now (None: not there): a change to it changes this."""
    try:
        st = os.stat(path)
    except OSError:
        return None
    return (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns)


def content(path: str, salt: bytes) -> str | None:
    """A /proc or /sys file's answer, or a directory's sorted listing, as a digest (None: not there). A listing
    leaves out __pycache__: Python makes it on a module's first import, which changes no plan."""
    try:
        if os.path.isdir(path):
            names = sorted(name for name in os.listdir(path) if name != "__pycache__")
            data = "\0".join(names).encode("utf-8", "surrogateescape")
        else:
            with open(path, "rb") as f:
                data = f.read(CONTENT_LIMIT + 1)
    except OSError:
        return None
    return _blake(data, salt)


def env_digest(value: str | None, salt: bytes) -> str | None:
    return None if value is None else _blake(value.encode("utf-8", "surrogateescape"), salt)


def prefixed_digest(env: Mapping[str, str], prefixes: tuple[str, ...], salt: bytes) -> str:
    text = "\0".join(f"{k}={v}" for k, v in sorted(env.items()) if k.startswith(prefixes))
    return _blake(text.encode("utf-8", "surrogateescape"), salt)


def meminfo() -> tuple[int, int] | None:
    """(MemTotal, MemAvailable) in bytes, as probe_host.read_meminfo reads them."""
    try:
        with open("/proc/meminfo", encoding="ascii", errors="replace") as f:
            return parse_meminfo(f.read())
    except OSError:
        return None


def address_space_unlimited() -> bool:
    """RLIMIT_AS is unlimited (a plan made under one is never recorded: it sizes by it)."""
    import resource

    return resource.getrlimit(resource.RLIMIT_AS)[0] == resource.RLIM_INFINITY


def cgroup_headroom() -> int | None:
    """The headroom of this process's cgroup now, as the plan counts it (probe_host, imported only for a record
    made under a cgroup limit); None: no cgroup limit."""
    from safe_llama.device.probe_host import cgroup_headroom as headroom
    from safe_llama.device.probe_host import read_cgroup_memory

    cgroup, _ = read_cgroup_memory()
    room = headroom(cgroup) if cgroup is not None else None
    return room[0] if room is not None else None


def other_launches(env: Mapping[str, str]) -> str:
    """A fingerprint of the other launches planned on this machine (the ledger of the several-services issue):
    what they hold is what a plan made beside them left out. Empty while there is no ledger: the one place
    that reads it (fast_record.build stores it, still_valid checks it through others_unchanged). Each other
    launch by its pid, start time and device; while one of them is still planning or loading, a mark that matches
    no record (what it will hold is not settled: plan beside it instead). No entry in any ledger folder: none,
    read without importing the ledger (its entries' parsing and the device limits it counts with are most of
    an early start's imports)."""
    if not any(_holds_entries(folder) for folder in ledger_folders(env)):
        return ""  # what ledger.read_all reads there: nothing
    from safe_llama.device import ledger
    from safe_llama.device.reservations import READY

    others = ledger.read_all(env, but=os.getpid())
    if any(launch.state != READY for launch in others):
        return f"unsettled {os.getpid()} {os.times().elapsed}"
    return "|".join(sorted(f"{launch.pid}:{launch.start}:{launch.device}" for launch in others))


def _holds_entries(folder: str) -> bool:
    """The folder lists a file an entry could be (ledger.read reads its *.json; whether it is trusted, live and
    well-formed is ledger.read's to say)."""
    try:
        return any(name.endswith(".json") for name in os.listdir(folder))
    except OSError:
        return False


def others_unchanged(record: Mapping[str, Any], others: str) -> bool:
    """The record was planned beside the same other launches as the fingerprint `others` says run now: nothing
    new in the ledger (a service started or stopped since changes what the plan may take)."""
    return record.get("others") == others


def device_reading(device: Sequence[Any]) -> vendor_free.Reading:
    """The free memory now of the GPU a record's device rule names (source, key, ...): one vendor reading, begun
    (NVML's in a forked child: the record's other checks run while it answers)."""
    from safe_llama.device import vendor_free

    return vendor_free.begin(str(device[0]), str(device[1]))


def load(path: str) -> dict[str, Any] | None:
    """The record at path, when this user wrote it in a trusted folder and no one else can write it (code is not
    run from it, but what it says is launched), and it has a record's shape: None otherwise (a record of a wrong
    shape is removed with a warning naming it)."""
    data = trust.load_entry(path, trust.SHAPES["launch"])
    return data if data is not None and data.get("format") == FORMAT else None


def booking(record: Mapping[str, Any]) -> tuple[str, str, str, int, int, str] | None:
    """What the record's plan books in the ledger (prepare.booking: label, device key, device name, device and
    host bytes, cgroup folder), bounded as the ledger reads an entry; None: the record's is not one."""
    try:
        label, device, name, device_bytes, host_bytes, cgroup = record["book"]
    except (KeyError, TypeError, ValueError):
        return None
    for text in (label, device, name, cgroup):
        if not isinstance(text, str) or len(text) > LEDGER_TEXT_MOST or not text.isprintable():
            return None
    for number in (device_bytes, host_bytes):
        if type(number) is not int or not 0 <= number < LEDGER_BYTES_MOST:
            return None
    return label, device, name, device_bytes, host_bytes, cgroup


def still_valid(record: Mapping[str, Any], env: Mapping[str, str]) -> bool:
    """Everything the recorded plan was made from is as it was (see the module's docstring). A GPU's reading,
    the one check that asks a driver (tens of ms), begins first and is collected last."""
    try:
        reading = begin_reading(record)
    except (KeyError, TypeError, ValueError, IndexError):
        return False
    try:
        return _unchanged(record, env) and (reading is None or free_within(record, reading))
    except (KeyError, TypeError, ValueError, IndexError):
        return False
    finally:
        if reading is not None:
            reading.cancel()  # a check before it failed: its answer is not wanted


def begin_reading(record: Mapping[str, Any]) -> vendor_free.Reading | None:
    """The GPU's reading the record's device rule asks for, begun; None: a plan made without a GPU."""
    device = record["device"]
    return device_reading(device) if device is not None else None


def free_within(record: Mapping[str, Any], reading: vendor_free.Reading) -> bool:
    """The GPU's free memory, as the reading answers, is within the plan's margin of what it was."""
    device = record["device"]
    free_then, margin = int(device[2]), int(device[3])
    free = reading.result()
    return free is not None and abs(free - free_then) <= margin


def _unchanged(record: Mapping[str, Any], env: Mapping[str, str]) -> bool:
    """Every rule of the record but the GPU's free memory holds."""
    salt = record["salt"]
    if not isinstance(salt, bytes):
        return False
    for path, ident in record["files"]:
        if identity(path) != ident:
            return False
    for path, digest in record["contents"]:
        if content(path, salt) != digest:
            return False
    for name, digest in record["env"]:
        if env_digest(env.get(name), salt) != digest:
            return False
    for name, present in record["env_present"]:  # secrets: whether set, never their value
        if (name in env) != present:
            return False
    for prefixes, digest in record["env_prefixes"]:
        if prefixed_digest(env, prefixes, salt) != digest:
            return False
    host = record["host"]
    if host is not None:
        total, least_available = int(host[0]), int(host[1])
        memory = meminfo()
        if memory is None or memory[0] != total or memory[1] < least_available:
            return False
        if not address_space_unlimited():
            return False
    cgroup = record["cgroup"]
    if cgroup is not None:
        room = cgroup_headroom()
        if room is None or room < int(cgroup):
            return False
    return others_unchanged(record, other_launches(env))


def cache_usable(root: str) -> bool:
    """state.check_cache would find the cache folder usable (and say nothing)."""
    try:
        st = os.stat(root, follow_symlinks=False)
    except OSError:
        return False
    return (
        os.path.isdir(root)
        and not os.path.islink(root)
        and st.st_uid == os.geteuid()
        and os.access(root, os.W_OK | os.X_OK)
        and trust.problem(root) is None
    )


class Early:
    """Attempt 1, started: what the supervisor needs to adopt it and say what the full path would have said."""

    def __init__(
        self,
        door: str,
        started: fork_exec.Started,
        argv: list[str],
        env: dict[str, str],
        record: dict[str, Any],
        path: str,
    ) -> None:
        self.door = door  # "safe-llama", or the tool of a drop-in door
        self.started = started
        self.argv = argv  # the binary and its arguments
        self.env = env  # the child's whole environment
        self.record = record
        self.path = path  # the record's file: dropped when this start fails for memory

    @property
    def lines(self) -> list[tuple[str, str]]:
        """What safe-llama says before attempt 1 (the plan's reasons), as (message, level)."""
        return [(str(message), str(level)) for message, level in self.record["lines"]]

    @property
    def booked(self) -> tuple[str, str, str, int, int, str]:
        """Its ledger entry's figures (checked by start: a record without them starts nothing)."""
        booked = booking(self.record)
        assert booked is not None
        return booked

    @property
    def tool(self) -> str:
        return str(self.record["tool"])

    @property
    def status(self) -> str:
        return str(self.record["status"])


def start(door: str, args: Sequence[str], env: Mapping[str, str]) -> Early | None:
    """Start attempt 1 from a valid launch record; None when there is none (the normal path then runs).
    Not when started by safe-llama (the recursion guard refuses that on the normal path), nor on a terminal
    (pty mode)."""
    if GUARD_ENV in env or RESUME_ENV in env or (os.isatty(0) and os.isatty(1)):
        return None  # a resumed launch (attempts/resume.py) goes on from its failed start
    root = cache_root(env)
    if not cache_usable(root):
        return None
    try:
        cwd = os.getcwd()
    except OSError:
        return None
    hidden = secret_options(env)
    if hidden is None:  # no launch has written a record yet
        return None
    path = record_path(env, key(door, args, cwd, hidden))
    record = load(path)
    if record is None:
        return None
    try:
        reading = begin_reading(record)
    except (KeyError, TypeError, ValueError, IndexError):
        return None
    try:
        return _start(door, args, env, record, path, reading)
    except (KeyError, TypeError, ValueError, IndexError):
        return None
    finally:
        if reading is not None:
            reading.cancel()  # a check before it failed: its answer is not wanted


def _start(
    door: str,
    args: Sequence[str],
    env: Mapping[str, str],
    record: dict[str, Any],
    path: str,
    reading: vendor_free.Reading | None,
) -> Early | None:
    """start() once the record is read and its GPU's reading begun. KeyError and the like: a record of a wrong
    shape (no start).

    A server's child starts before the GPU's reading is collected (the reading takes tens of ms, the child's own
    start far longer before it asks the driver for memory) and is killed unseen when the reading says the plan no
    longer holds: its output is still in the pipes, it read no stdin (llama-server does not), and a terminal's
    foreground was not given to it. Any other child, whose stdin is the user's, starts only once every check holds.
    """
    if not _unchanged(record, env):
        return None
    argv = [str(record["binary"])]
    argv += [args[word] if isinstance(word, int) else str(word) for word in record["argv"]]
    extra = dict(record["extra_env"])
    if not isinstance(record["tool"], str) or not isinstance(record["status"], str):
        return None
    sources = list(record["counters"])
    if booking(record) is None:
        return None
    from safe_llama.process import fork_exec

    foreground = fork_exec.terminal_foreground(0)
    ahead = reading is not None and record["tool"] == "server" and foreground is None
    if reading is not None and not ahead and not free_within(record, reading):
        return None
    child_env = fork_exec.supervised_env(env, extra, os.getpid())
    _, mask_before = fork_exec.block_watched(False)
    counters = read_counters(sources)
    try:
        proc, out_src, err_src = fork_exec.spawn_on_pipes(argv, child_env, (None, 1, 2), foreground)
    except OSError:  # the normal path finds the binary again, and says what is wrong with it
        fork_exec.restore_mask(mask_before)
        return None
    if ahead and reading is not None and not free_within(record, reading):
        fork_exec.kill_unseen(proc, out_src, err_src)
        fork_exec.restore_mask(mask_before)
        return None
    started = fork_exec.Started(proc.pid, out_src, err_src, counters, foreground is not None, mask_before)
    return Early(door, started, argv, child_env, record, path)
