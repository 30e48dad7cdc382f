"""device/ledger.py: the entries of live launches in real folders with this machine's /proc (this test's own
process and a child it starts), dead and malformed entries removed, an untrusted folder not read, the lock, the
read API (live, fingerprint)."""

from __future__ import annotations

import fcntl
import json
import os
import subprocess
from collections.abc import Iterator
from dataclasses import asdict, replace
from pathlib import Path

import pytest

from safe_llama.constants import LEDGER
from safe_llama.device import ledger
from safe_llama.device.reservations import ARRIVING, PLANNED, READY, Launch

UUID = "GPU-12c88ba7-4229-5615-d2f3-4c8f50f61e5b"


@pytest.fixture
def folder(tmp_path: Path) -> Path:
    made = tmp_path / "run" / "safe-llama" / LEDGER
    made.mkdir(parents=True, mode=0o700)
    (tmp_path / "run").chmod(0o700)
    return made


@pytest.fixture
def child() -> Iterator[subprocess.Popen[bytes]]:
    proc = subprocess.Popen(["sleep", "30"])
    yield proc
    proc.kill()
    proc.wait()


def _mine(**changes: object) -> Launch:
    start = ledger.start_time(os.getpid())
    assert start is not None
    launch = Launch(os.getpid(), start, "server", "profile chat", PLANNED, UUID, "CUDA0", 62 << 30, 300 << 20, "")
    return replace(launch, **changes)  # type: ignore[arg-type]


def _put(folder: Path, name: str, data: object) -> Path:
    path = folder / name
    path.write_text(data if isinstance(data, str) else json.dumps(data))
    return path


def test_folders_read_and_the_one_written(tmp_path: Path) -> None:
    env = {"RUNTIME_DIRECTORY": "/run/safe-llama", "XDG_RUNTIME_DIR": "/run/user/1000"}
    assert ledger.folders(env) == (Path("/run/safe-llama/ledger"), Path("/run/user/1000/safe-llama/ledger"))
    assert ledger.own_folder(env) == Path("/run/safe-llama/ledger")
    assert ledger.own_folder({"XDG_RUNTIME_DIR": "/run/user/1000"}) == Path("/run/user/1000/safe-llama/ledger")
    assert ledger.own_folder({}) is None
    assert ledger.folders({}, system=tmp_path) == (tmp_path / "ledger",)


def test_a_live_entry_is_read_and_its_launcher_is_this_process(folder: Path) -> None:
    entry = ledger.Entry(folder, os.getpid())
    entry.write(_mine())
    assert ledger.read(folder) == (_mine(),)
    assert ledger.live([folder]) == {UUID: (_mine(),)}
    assert (folder / f"{os.getpid()}.json").stat().st_mode & 0o777 == 0o600
    entry.remove()
    assert ledger.read(folder) == ()


def test_dead_reused_and_malformed_entries_are_removed(folder: Path) -> None:
    done = subprocess.run(["true"], check=True)
    assert done.returncode == 0
    gone = subprocess.Popen(["true"])
    gone.wait()  # its pid is free now
    start = ledger.start_time(os.getpid())
    assert start is not None
    paths = [
        _put(folder, "1.json", asdict(_mine(pid=gone.pid))),  # no such process
        _put(folder, "2.json", asdict(_mine(start=start + 1))),  # the pid is another process now
        _put(folder, "3.json", "{not json"),
        _put(folder, "4.json", {**asdict(_mine()), "device_bytes": -1}),
        _put(folder, "5.json", {**asdict(_mine()), "state": "loading"}),
        _put(folder, "6.json", {**asdict(_mine()), "extra": 1}),
        _put(folder, "7.json", {**asdict(_mine()), "label": "x" * 5000}),  # over MOST_BYTES
        _put(folder, "8.json", {**asdict(_mine()), "label": "a\x1b[2Jb"}),
    ]
    assert ledger.read(folder) == ()
    assert [path.exists() for path in paths] == [False] * len(paths)


def test_an_entry_of_a_live_child_is_kept_and_its_figures_read(folder: Path, child: subprocess.Popen[bytes]) -> None:
    start = ledger.start_time(child.pid)
    assert start is not None
    _put(folder, "c.json", asdict(_mine(pid=child.pid, start=start)))
    assert [launch.pid for launch in ledger.read(folder)] == [child.pid]
    assert ledger.read_all({"XDG_RUNTIME_DIR": str(folder.parent.parent)}, but=child.pid) == ()
    assert child.pid in ledger.children([os.getpid()])[os.getpid()]
    resident = ledger.resident([os.getpid(), child.pid, 1 << 22])
    assert resident[os.getpid()] > 1 << 20 and 0 < resident[child.pid] < resident[os.getpid()]
    assert 1 << 22 not in resident


def test_an_untrusted_folder_is_not_read(folder: Path, capsys: pytest.CaptureFixture[str]) -> None:
    ledger.Entry(folder, os.getpid()).write(_mine())
    folder.chmod(0o777)
    try:
        assert ledger.read(folder) == ()
    finally:
        folder.chmod(0o700)
    assert "is not read" in capsys.readouterr().err
    folder.chmod(0o777)
    try:
        assert ledger.read(folder, quiet=True) == ()  # another's folder (the services'): skipped without a word
    finally:
        folder.chmod(0o700)
    assert capsys.readouterr().err == ""
    assert ledger.read(folder) == (_mine(),)


def test_the_fingerprint_moves_with_an_entry_only(folder: Path) -> None:
    empty = ledger.fingerprint([folder])
    assert ledger.fingerprint([folder]) == empty
    entry = ledger.Entry(folder, os.getpid())
    entry.write(_mine())
    written = ledger.fingerprint([folder])
    assert written != empty and ledger.fingerprint([folder]) == written
    entry.write(_mine(device_bytes=70 << 30))
    assert ledger.fingerprint([folder]) != written
    entry.remove()
    assert ledger.fingerprint([folder]) == empty


def test_arrive_writes_a_launch_with_nothing_reserved(folder: Path) -> None:
    entry = ledger.arrive(folder, "server")
    assert entry is not None
    (launch,) = ledger.read(folder)
    assert (launch.state, launch.device_bytes, launch.host_bytes, launch.pid) == (ARRIVING, 0, 0, os.getpid())
    entry.remove()


def test_the_lock_waits_for_another_and_says_so(folder: Path) -> None:
    held = os.open(folder / ledger.LOCK, os.O_RDWR | os.O_CREAT, 0o600)
    fcntl.flock(held, fcntl.LOCK_EX)  # another open file: flock holds it against this process too
    said: list[str] = []
    try:
        with ledger.locked(folder, said.append, wait=0.05):
            pass
    finally:
        os.close(held)
    assert said[0].startswith("another safe-llama is planning on this machine: waiting for it")
    assert said[1] == "another safe-llama kept the ledger's lock: planning with what it shows"
    said.clear()
    with ledger.locked(folder, said.append, wait=0.05):
        pass
    assert said == []


def test_ready_rewrites_the_entry_and_foreign_pids_are_told(folder: Path) -> None:
    entry = ledger.Entry(folder, os.getpid())
    entry.ready()  # nothing written yet: nothing to mark
    assert ledger.read(folder) == ()
    entry.write(_mine())
    entry.ready()
    assert ledger.read(folder) == (_mine(state=READY),)
    assert ledger.foreign([1 << 22, (1 << 22) + 1]) and not ledger.foreign([os.getpid(), 1 << 22])
    assert not ledger.foreign([])


def test_label_names_the_template_units_instance(tmp_path: Path) -> None:
    (tmp_path / "self").mkdir()
    (tmp_path / "self" / "cgroup").write_text("0::/system.slice/safe-llama.slice/safe-llama-server@chat.service\n")
    assert ledger.label("/m/x.gguf", tmp_path) == "profile chat"
    (tmp_path / "self" / "cgroup").write_text("0::/user.slice\n")
    assert ledger.label("/m/x.gguf", tmp_path) == "model x.gguf"
