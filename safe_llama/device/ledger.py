"""The ledger every safe-llama on the machine reads and writes: one small JSON file per live launch (what its
plan reserved on which device and on the host, its pid and start time), in a folder of the system's runtime
directory for services ($RUNTIME_DIRECTORY of a unit, /run/safe-llama) and of the user's otherwise
($XDG_RUNTIME_DIR/safe-llama); both are read when present. A launch plans and writes its entry under the
folder's lock, so the next one plans with it; the entry goes when the launch ends.

Read API (for other modules, e.g. an early start that must see "nothing new"): `live(folders)` gives the live
launches by device key, `fingerprint(folders)` a cheap string (the entries' names, sizes and times: stat only,
no file read) that changes whenever an entry is written or removed.

Owns the files, the lock, their validation and trust (a folder another user can write is not read), the
removal of dead entries (the pid gone or reused) and the per-process figures read with them; must not
decide what a reservation counts for (device/reservations.py does)."""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import asdict, replace
from pathlib import Path

from safe_llama import trust
from safe_llama.constants import LEDGER, LEDGER_BYTES_MOST, LEDGER_SYSTEM, LEDGER_TEXT_MOST, ledger_folders
from safe_llama.device.reservations import ARRIVING, PLANNED, READY, Launch

SYSTEM_FOLDER = Path(LEDGER_SYSTEM)
LOCK = ".lock"
MOST_ENTRIES = 64  # entries read from one folder (more: the rest are not read)
MOST_BYTES = 4096  # one entry's file
LOCK_WAIT = 30.0  # seconds a launch waits for another's planning before it plans without the lock
ARRIVAL_STALE = 60.0  # seconds after which a launch still not planned no longer counts as starting together
_FIELDS: dict[str, type] = {
    "pid": int, "start": int, "tool": str, "label": str, "state": str, "device": str, "device_name": str,
    "device_bytes": int, "host_bytes": int, "cgroup": str,
}  # fmt: skip


def folders(env: Mapping[str, str], system: Path = SYSTEM_FOLDER) -> tuple[Path, ...]:
    """Every ledger folder this launch reads: the unit's runtime directory, the system's, the user's."""
    return tuple(dict.fromkeys(Path(folder) for folder in ledger_folders(env, str(system))))


def own_folder(env: Mapping[str, str]) -> Path | None:
    """Where this launch writes its entry: the unit's runtime directory, else the user's; None: neither set."""
    if env.get("RUNTIME_DIRECTORY"):
        return Path(env["RUNTIME_DIRECTORY"].split(":")[0]) / LEDGER
    if env.get("XDG_RUNTIME_DIR"):
        return Path(env["XDG_RUNTIME_DIR"]) / "safe-llama" / LEDGER
    return None


def start_time(pid: int, proc: Path = Path("/proc")) -> int | None:
    """A process's start time in clock ticks after boot (/proc/PID/stat field 22); None: no such process."""
    try:
        text = (proc / str(pid) / "stat").read_text()
    except OSError:
        return None
    fields = text[text.rfind(")") + 2 :].split()
    return int(fields[19]) if len(fields) > 19 and fields[19].isdigit() else None


def _parse(raw: bytes) -> Launch | None:
    try:
        data = json.loads(raw)
    except ValueError:
        return None
    if not isinstance(data, dict) or set(data) != set(_FIELDS):
        return None
    for key, kind in _FIELDS.items():
        value = data[key]
        if not isinstance(value, kind) or isinstance(value, bool):
            return None
        if isinstance(value, int) and not 0 <= value < LEDGER_BYTES_MOST:
            return None
        if isinstance(value, str) and (len(value) > LEDGER_TEXT_MOST or not value.isprintable()):
            return None
    if data["pid"] < 1 or data["state"] not in (ARRIVING, PLANNED, READY):
        return None
    return Launch(**data)


def _trusted(folder: Path, quiet: bool = False) -> bool:
    problem = trust.problem(folder)
    if problem is not None:
        if not quiet:
            trust.say_once(f"safe-llama: warning: the ledger {folder} is not read: {problem}", str(folder))
        return False
    return folder.is_dir()


def read(folder: Path, proc: Path = Path("/proc"), *, quiet: bool = False) -> tuple[Launch, ...]:
    """The live launches of one folder; a dead entry (its pid gone or reused), or one that is not a launch, is
    removed. An untrusted folder reads as empty, with one warning (quiet: none, for a folder that is not this
    launch's own, such as the services' /run/safe-llama seen from a user's launch)."""
    if not _trusted(folder, quiet):
        return ()
    try:
        names = sorted(n for n in os.listdir(folder) if n.endswith(".json"))[:MOST_ENTRIES]
    except OSError:
        return ()
    out = []
    for name in names:
        path = folder / name
        try:
            fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
        except OSError:
            continue
        with os.fdopen(fd, "rb") as file:
            raw = file.read(MOST_BYTES + 1)
            written = os.fstat(file.fileno()).st_mtime
        launch = _parse(raw) if len(raw) <= MOST_BYTES else None
        if launch is None or start_time(launch.pid, proc) != launch.start:
            with contextlib.suppress(OSError):
                path.unlink()
            continue
        if launch.state == ARRIVING and time.time() - written > ARRIVAL_STALE:
            continue  # started long ago and still not planned: not starting together with anyone now
        out.append(launch)
    return tuple(out)


def read_all(env: Mapping[str, str], proc: Path = Path("/proc"), *, but: int | None = None) -> tuple[Launch, ...]:
    """The live launches of every folder this launch reads, but the one of pid `but` (this launch)."""
    own = own_folder(env)
    return tuple(
        launch for folder in folders(env) for launch in read(folder, proc, quiet=folder != own) if launch.pid != but
    )


def snapshot(
    env: Mapping[str, str], proc: Path = Path("/proc"), *, but: int | None = None
) -> tuple[tuple[Launch, ...], dict[int, tuple[int, ...]], dict[int, int]]:
    """The other live launches (all but pid `but`), their children, and the resident bytes of both."""
    launches = read_all(env, proc, but=but)
    if not launches:
        return (), {}, {}
    kids = children([launch.pid for launch in launches], proc)
    pids = [pid for launch in launches for pid in (launch.pid, *kids.get(launch.pid, ()))]
    return launches, kids, resident(pids, proc)


def live(folder_list: Sequence[Path], proc: Path = Path("/proc")) -> dict[str, tuple[Launch, ...]]:
    """The live launches by device key ("" for those that hold nothing on a device)."""
    out: dict[str, list[Launch]] = {}
    for folder in folder_list:
        for launch in read(folder, proc):
            out.setdefault(launch.device, []).append(launch)
    return {key: tuple(found) for key, found in out.items()}


def fingerprint(folder_list: Sequence[Path]) -> str:
    """A cheap mark of the ledgers' content: the same while no entry is written or removed (stat only)."""
    marks = []
    for folder in folder_list:
        try:
            with os.scandir(folder) as entries:
                for entry in entries:
                    if entry.name.endswith(".json"):
                        st = entry.stat(follow_symlinks=False)
                        marks.append(f"{folder}/{entry.name}:{st.st_size}:{st.st_mtime_ns}")
        except OSError:
            continue
    return "|".join(sorted(marks))


def foreign(pids: Sequence[int], proc: Path = Path("/proc")) -> bool:
    """Whether none of these pids is a process here: NVML reports another pid namespace's (a container's
    host), so its per-process figure cannot be matched to a launch."""
    return bool(pids) and not any((proc / str(pid)).exists() for pid in pids)


def children(pids: Sequence[int], proc: Path = Path("/proc")) -> dict[int, tuple[int, ...]]:
    """The child processes of each pid (llama.cpp under its launcher), from every /proc/PID/stat's parent."""
    wanted = set(pids)
    found: dict[int, list[int]] = {pid: [] for pid in pids}
    if not wanted:
        return {}
    for name in os.listdir(proc):
        if not name.isdigit():
            continue
        try:
            text = (proc / name / "stat").read_text()
        except OSError:
            continue
        fields = text[text.rfind(")") + 2 :].split()
        if len(fields) > 1 and fields[1].isdigit() and int(fields[1]) in wanted:
            found[int(fields[1])].append(int(name))
    return {pid: tuple(kids) for pid, kids in found.items()}


def resident(pids: Sequence[int], proc: Path = Path("/proc")) -> dict[int, int]:
    """Each process's resident memory a cgroup charges and MemAvailable lacks (RssAnon + RssShmem), in bytes."""
    out = {}
    for pid in pids:
        try:
            lines = (proc / str(pid) / "status").read_text().splitlines()
        except OSError:
            continue
        kib = 0
        for line in lines:
            if line.startswith(("RssAnon:", "RssShmem:")):
                parts = line.split()
                kib += int(parts[1]) if len(parts) > 1 and parts[1].isdigit() else 0
        out[pid] = kib * 1024
    return out


UNIT_PREFIX = "safe-llama-server@"


def label(model_path: str | None, proc: Path = Path("/proc")) -> str:
    """Who a launch is for people: the instance of the template unit it runs in ("profile chat", from its
    cgroup's name), else its model's file name."""
    try:
        text = (proc / "self" / "cgroup").read_text()[:4096]
    except OSError:
        text = ""
    for part in text.replace(":", "/").replace("\n", "/").split("/"):
        if part.startswith(UNIT_PREFIX) and part.endswith(".service"):
            instance = part[len(UNIT_PREFIX) : -len(".service")]
            if instance.isprintable() and 0 < len(instance) <= 64:
                return f"profile {instance}"
    return f"model {os.path.basename(model_path)[:120]}" if model_path else "starting"


class Entry:
    """This launch's entry: written once its plan is made (under the lock, see `locked`), rewritten when a
    retry plans again, removed when the launch ends."""

    def __init__(self, folder: Path, pid: int) -> None:
        self.path = folder / f"{pid}.json"
        self.written = False
        self.launch: Launch | None = None

    def write(self, launch: Launch, suffix: str = "") -> None:
        """The entry as launch says (suffix: beside the entry, under its name and this suffix, for the handed
        supervisor to put in place later: attempts/at_spawn.py)."""
        temporary = self.path.with_suffix(".tmp")
        fd = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o600)
        with os.fdopen(fd, "w") as file:
            json.dump(asdict(launch), file)
        os.replace(temporary, f"{self.path}{suffix}")
        if not suffix:
            self.written = True
            self.launch = launch

    def ready(self) -> None:
        """Its llama.cpp is ready: everything it planned is allocated (and in the figures others read)."""
        if self.written and self.launch is not None:
            with contextlib.suppress(OSError):
                self.write(replace(self.launch, state=READY))

    def remove(self) -> None:
        if self.written:
            with contextlib.suppress(OSError):
                self.path.unlink()
            self.written = False


def _usable(folder: Path) -> bool:
    """The folder made (0700) when missing, and trusted."""
    try:
        folder.mkdir(mode=0o700, parents=True, exist_ok=True)
    except OSError:
        return False
    return _trusted(folder)


def arrive(folder: Path, tool: str) -> Entry | None:
    """This launch's entry, written at once as ARRIVING (with no bytes): a launch that plans meanwhile shares
    with it. None: the folder cannot be used (the launch plans alone)."""
    start = start_time(os.getpid())
    if start is None or not _usable(folder):
        return None
    entry = Entry(folder, os.getpid())
    try:
        entry.write(Launch(os.getpid(), start, tool, label(None), ARRIVING, "", "", 0, 0, ""))
    except OSError:
        return None
    return entry


@contextlib.contextmanager
def locked(
    folder: Path, say: Callable[[str], None], wait: float = LOCK_WAIT, clock: Callable[[], float] = time.monotonic
) -> Iterator[None]:
    """The folder's lock, held while this launch reads the others, plans and writes its entry. Waits at most
    `wait` seconds for another launch's planning, said once; past that (or where the folder cannot be used) it
    plans without the lock."""
    if not _usable(folder):
        yield
        return
    try:
        fd = os.open(folder / LOCK, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW, 0o600)
    except OSError:
        yield
        return
    try:
        began = clock()
        told = False
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if not told:
                    say(f"another safe-llama is planning on this machine: waiting for it (at most {wait:.0f} s)")
                    told = True
                if clock() - began > wait:
                    say("another safe-llama kept the ledger's lock: planning with what it shows")
                    break
                time.sleep(0.02)
        yield
    finally:
        os.close(fd)  # releases the lock
