"""Running the real pinned llama.cpp binaries in tests: free ports, start-up logs, KV lines.

A test support module, not a test: real processes, real output.
"""

from __future__ import annotations

import re
import resource
import socket
import subprocess
import time
import urllib.request
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

KV_LINE = re.compile(
    r"llama_kv_cache: size = +(?P<total>[\d.]+) MiB \( *(?P<cells>\d+) cells, +(?P<layers>\d+) layers, +"
    r"(?P<seqs>\d+)/(?P<streams>\d+) seqs\), "
    r"K \((?P<tk>\w+)\): +(?P<k>[\d.]+) MiB, V \((?P<tv>\w+)\): +(?P<v>[\d.]+) MiB"
)
BUFFER_LINE = re.compile(r"llama_kv_cache: +\S+ KV buffer size = +(?P<mib>[\d.]+) MiB")
ALLOC_FAIL = re.compile(r"failed to allocate buffer of size (\d+)")


@dataclass(frozen=True)
class KvLine:
    total: str
    cells: int
    layers: int
    seqs: int
    streams: int
    type_k: str
    k: str
    type_v: str
    v: str


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def kv_lines(log: str) -> list[KvLine]:
    """The size lines of caches that really allocated (fit's dry runs print a 0.00 MiB buffer first)."""
    out: list[KvLine] = []
    real = True
    for line in log.splitlines():
        buf = BUFFER_LINE.search(line)
        if buf:
            real = float(buf.group("mib")) > 0
            continue
        m = KV_LINE.search(line)
        if m and real:
            out.append(
                KvLine(
                    m["total"],
                    int(m["cells"]),
                    int(m["layers"]),
                    int(m["seqs"]),
                    int(m["streams"]),
                    m["tk"],
                    m["k"],
                    m["tv"],
                    m["v"],
                )
            )
    return out


def healthy(port: int, host: str = "127.0.0.1") -> bool:
    """llama-server's /health answers 200 (503 while loading, refused before it listens)."""
    try:
        with urllib.request.urlopen(f"http://{host}:{port}/health", timeout=1) as r:
            return bool(r.status == 200)
    except OSError:
        return False


def _limit_as(kib: int | None) -> Callable[[], None] | None:
    if kib is None:
        return None

    def apply() -> None:
        resource.setrlimit(resource.RLIMIT_AS, (kib * 1024, kib * 1024))

    return apply


def serving(port: int, host: str = "127.0.0.1") -> bool:
    """llama-server's task loop answers GET /slots: it serves (/health says 200 from `model loaded` on, before
    the loop's thread exists, which a start just above RLIMIT_AS cannot create)."""
    try:
        with urllib.request.urlopen(f"http://{host}:{port}/slots", timeout=5) as r:
            return bool(r.status == 200)
    except OSError:
        return False


def stop_process(proc: subprocess.Popen[bytes], grace: float) -> None:
    """SIGTERM to a process still running, SIGKILL after grace seconds; waited for either way."""
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(grace)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def run_server_until_ready(
    bin_dir: Path,
    args: Sequence[str],
    env: Mapping[str, str],
    *,
    timeout: float = 90.0,
    as_limit_kib: int | None = None,
) -> tuple[int | None, str]:
    """Start llama-server, wait until it serves (GET /slots 200) or exits, stop it; (exit code or None if it
    served, log)."""
    port = free_port()
    argv = [str(bin_dir / "llama-server"), *args, "--host", "127.0.0.1", "--port", str(port)]
    proc = subprocess.Popen(
        argv,
        env=dict(env),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        stdin=subprocess.DEVNULL,
        preexec_fn=_limit_as(as_limit_kib),
    )
    deadline = time.monotonic() + timeout
    code: int | None = None
    try:
        while time.monotonic() < deadline:
            if proc.poll() is not None:
                code = proc.returncode
                break
            if serving(port):
                break
            time.sleep(0.1)
        else:
            raise TimeoutError(f"llama-server neither ready nor exited in {timeout}s: {argv}")
    finally:
        stop_process(proc, 10)
    assert proc.stdout is not None
    return code, proc.stdout.read().decode(errors="replace")
