"""explain on input a stranger can feed (issue 33's row): a 2 GB sparse log, /dev/zero, `yes |`, a FIFO with no
writer, a terminal on stdin, a stream followed for ever. Before: everything read into memory (4.2 GB RSS for the
2 GB log, 12.7 GB for /dev/zero, 16.4 GB for `yes |` before the kernel killed it), a FIFO blocked for ever and a
terminal waited silently. Now: memory bounded by a small constant, or one line saying why not (exit 2)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from safe_llama.diagnosis.log_reading import KEEP_ERRORS, KEEP_MATCHES, LogReader
from safe_llama.diagnosis.signatures import Lines, load_table

ROOT = Path(__file__).resolve().parent.parent.parent
LOG = ROOT / "tests" / "fixtures" / "logs" / "server-kv-oom.log"
MIB = 1024 * 1024
CEILING = 64 * MIB
EXPLAIN = [sys.executable, "-m", "safe_llama", "explain"]
# Runs explain as its only child and prints the child's peak RSS (getrusage: this wrapper waits for no other).
MEASURED = (
    "import resource, subprocess, sys, time; t = time.monotonic(); r = subprocess.run(sys.argv[1:]); "
    "print(r.returncode, resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss * 1024, time.monotonic() - t, "
    "file=sys.stderr)"
)


def env() -> dict[str, str]:
    clean = {k: v for k, v in os.environ.items() if not k.startswith(("LLAMA_ARG_", "SAFE_LLAMA_"))}
    return {**clean, "PYTHONPATH": str(ROOT)}


def peak_rss(pid: int) -> int:
    """A running process's peak resident memory so far (VmHWM), in bytes."""
    status = Path(f"/proc/{pid}/status").read_text()
    return int(next(line.split()[1] for line in status.splitlines() if line.startswith("VmHWM:"))) * 1024


@pytest.fixture
def sparse_log(tmp_path: Path) -> Iterator[Path]:
    """2 GB of holes (NUL bytes when read: one line of 2 GB), then a real failure log's lines at the end."""
    path = tmp_path / "sparse.log"
    with path.open("wb") as out:
        out.truncate(2 * 1024**3)
        out.seek(0, os.SEEK_END)
        out.write(b"\n" + LOG.read_bytes())
    yield path
    path.unlink()


@pytest.mark.slow  # 23 s: 2 GB read
def test_a_2_gb_sparse_log_is_explained_under_64_mib(sparse_log: Path) -> None:
    done = subprocess.run(
        [sys.executable, "-c", MEASURED, *EXPLAIN, "--json", str(sparse_log)],
        env=env(),
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    code, rss, seconds = done.stderr.split()[-3:]
    print(f"2 GB sparse log: exit {code}, peak RSS {int(rss) / MIB:.1f} MiB, {float(seconds):.1f} s")
    data = json.loads(done.stdout)
    assert (int(code), data["memory"], data["stage"]) == (0, True, "kv")  # the failure at the end was found
    assert int(rss) < CEILING


@pytest.mark.parametrize("given", ["file", "stdin"])
def test_dev_zero_is_refused_in_one_line(given: str) -> None:
    args, stdin = (["/dev/zero"], None) if given == "file" else (["-"], open("/dev/zero", "rb"))  # noqa: SIM115
    try:
        done = subprocess.run([*EXPLAIN, *args], stdin=stdin, env=env(), capture_output=True, text=True, timeout=30)
    finally:
        if stdin is not None:
            stdin.close()
    assert done.returncode == 2
    assert done.stderr.count("\n") == 1 and "a character device, not a log" in done.stderr, done.stderr


@pytest.mark.slow
def test_yes_into_stdin_keeps_memory_flat() -> None:
    yes = subprocess.Popen(["yes"], stdout=subprocess.PIPE)
    assert yes.stdout is not None
    explain = subprocess.Popen([*EXPLAIN, "-"], stdin=yes.stdout, env=env(), stdout=subprocess.DEVNULL)
    yes.stdout.close()
    try:
        time.sleep(1.5)
        early = peak_rss(explain.pid)
        time.sleep(4)
        late = peak_rss(explain.pid)
        read = int(Path(f"/proc/{explain.pid}/io").read_text().split("rchar: ")[1].split()[0])
        assert explain.poll() is None  # still reading: a stream is read to its end, as grep does
    finally:
        explain.kill()
        yes.kill()
        explain.wait()
        yes.wait()
    print(f"yes |: read {read / MIB:.0f} MiB, peak RSS {early / MIB:.1f} MiB after 1.5 s, {late / MIB:.1f} after 5.5 s")
    assert late < CEILING and late - early < 4 * MIB


@pytest.mark.slow
def test_a_fifo_with_no_writer_is_refused_after_a_wait(tmp_path: Path) -> None:
    fifo = tmp_path / "log.fifo"
    os.mkfifo(fifo)
    started = time.monotonic()
    done = subprocess.run([*EXPLAIN, str(fifo)], env=env(), capture_output=True, text=True, timeout=60)
    took = time.monotonic() - started
    assert done.returncode == 2 and done.stderr.count("\n") == 1, done.stderr
    assert "a FIFO no process wrote to in 5 s" in done.stderr
    assert took < 20


@pytest.mark.slow
def test_a_fifo_with_a_writer_is_explained(tmp_path: Path) -> None:
    fifo = tmp_path / "log.fifo"
    os.mkfifo(fifo)
    explain = subprocess.Popen([*EXPLAIN, "--json", str(fifo)], env=env(), stdout=subprocess.PIPE, text=True)
    time.sleep(0.5)
    fifo.write_bytes(LOG.read_bytes())
    out, _ = explain.communicate(timeout=60)
    assert explain.returncode == 0 and json.loads(out)["stage"] == "kv"


def test_a_terminal_on_stdin_gets_the_usage() -> None:
    main, tty = os.openpty()
    try:
        done = subprocess.run([*EXPLAIN], stdin=tty, env=env(), capture_output=True, text=True, timeout=30)
    finally:
        os.close(main)
        os.close(tty)
    assert done.returncode == 2 and done.stderr.count("\n") == 1
    assert "stdin: a terminal, not a log" in done.stderr and "usage: safe-llama explain" in done.stderr


def test_a_directory_is_refused(tmp_path: Path) -> None:
    done = subprocess.run([*EXPLAIN, str(tmp_path)], env=env(), capture_output=True, text=True, timeout=30)
    assert done.returncode == 2 and "a directory, not a log" in done.stderr


@pytest.mark.slow
def test_follow_explains_each_failure_of_a_stream_with_flat_memory() -> None:
    explain = subprocess.Popen(
        [*EXPLAIN, "--follow", "--json", "-"], env=env(), stdin=subprocess.PIPE, stdout=subprocess.PIPE
    )
    assert explain.stdin is not None and explain.stdout is not None
    try:
        for _ in range(2):
            explain.stdin.write(LOG.read_bytes())
            explain.stdin.flush()
            assert json.loads(explain.stdout.readline())["stage"] == "kv"  # after 2 s of quiet
        early = peak_rss(explain.pid)
        healthy = b"0.01.000.000 I slot update_slots: id  0 | task 1 | prompt done, n_tokens = 12\n" * 100_000
        for _ in range(3):  # 24 MB of a healthy server's lines
            explain.stdin.write(healthy)
        explain.stdin.write(LOG.read_bytes())
        explain.stdin.flush()
        last = json.loads(explain.stdout.readline())
        late = peak_rss(explain.pid)
        explain.stdin.close()
        assert explain.wait(timeout=120) == 0
    finally:
        explain.kill()
    print(f"--follow: peak RSS {early / MIB:.1f} MiB after two failures, {late / MIB:.1f} MiB after 24 MB more")
    assert last["stage"] == "kv"
    assert late < CEILING and late - early < 4 * MIB


@pytest.mark.slow
def test_the_reader_keeps_a_bounded_summary_of_any_log() -> None:
    reader = LogReader(load_table())
    lines = Lines()
    flood = b"0.00.100.000 E ggml_backend_cpu_buffer_type_alloc_buffer: failed to allocate buffer of size 1024\n"
    for _ in range(20):
        for line in lines.feed(flood * 1000):
            reader.feed(line)
    reading = reader.reading()
    assert reader.lines == 20_000
    assert len(reading.matches) <= KEEP_MATCHES * 5 and len(reading.error_lines) == KEEP_ERRORS
    assert reading.failure is not None and reading.failure.memory
    assert Lines(max_line=10).feed(b"x" * 1000 + b"\nab") == ["x" * 10]
