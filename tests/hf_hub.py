"""Fake: a local stand-in for the Hugging Face hub over HTTPS (nothing here reaches the internet), answering the
requests the pinned llama.cpp makes for -hf (common/hf-cache.cpp, common/download.cpp): the refs and the tree
of the API, HEAD and GET (with Range) of /<repo>/resolve/<commit>/<file>; -mu URLs are the same files; and
Docker Hub's for -dr: /token, /v2/<repo>/manifests/<tag>, /v2/<repo>/blobs/<digest> (redirected, as Docker Hub
does, to another host: localhost instead of 127.0.0.1). Its certificate is self-signed, made here with the
openssl command, trusted through SSL_CERT_FILE.

A test support module, not a test; every request is kept (method, path, Range, Authorization) for the tests
to check what was asked, with which credentials, and how many bytes went out before llama.cpp downloaded.
"""

from __future__ import annotations

import hashlib
import json
import re
import ssl
import subprocess
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

COMMIT = "0123456789abcdef0123456789abcdef01234567"


@dataclass
class Seen:
    method: str
    path: str
    range: str | None
    authorization: str | None
    sent: int  # body bytes answered


@dataclass
class Hub:
    repos: dict[str, dict[str, Path]]  # repo -> {path in the repo: file served}
    docker: dict[str, Path] = field(default_factory=dict)  # "<repo>:<tag>" -> the GGUF layer served
    port: int = 0
    cert: Path = Path()
    seen: list[Seen] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)

    @property
    def endpoint(self) -> str:
        return f"https://127.0.0.1:{self.port}/"

    def sent_for(self, suffix: str) -> int:
        """Bytes of files whose path ends with suffix answered so far (ranges and whole downloads)."""
        with self.lock:
            return sum(s.sent for s in self.seen if s.path.endswith(suffix))


def make_certificate(folder: Path) -> tuple[Path, Path]:
    """A self-signed certificate for 127.0.0.1 and localhost, and its key."""
    cert, key = folder / "hub.pem", folder / "hub.key"
    subprocess.run(
        ["openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes",
         "-keyout", str(key), "-out", str(cert), "-days", "1", "-subj", "/CN=localhost",
         "-addext", "subjectAltName=IP:127.0.0.1,DNS:localhost"],
        check=True, capture_output=True, timeout=30,
    )  # fmt: skip
    return cert, key


def _oid(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as f:
        while chunk := f.read(1 << 20):
            digest.update(chunk)
    return digest.hexdigest()


def _handler(hub: Hub) -> type[BaseHTTPRequestHandler]:
    oids: dict[Path, str] = {}

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, format: str, *args: object) -> None:
            pass

        def _note(self, sent: int) -> None:
            with hub.lock:
                hub.seen.append(
                    Seen(self.command, self.path, self.headers.get("Range"), self.headers.get("Authorization"), sent)
                )

        def _json(self, value: object) -> None:
            body = json.dumps(value).encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)
            self._note(len(body))

        def _missing(self) -> None:
            body = b'{"error": "Repository not found"}'
            self.send_response(404)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)
            self._note(0)

        def _file(self, path: Path, head: bool) -> None:
            size = path.stat().st_size
            start, end = 0, size - 1
            wanted = re.fullmatch(r"bytes=(\d+)-(\d*)", self.headers.get("Range", ""))
            if wanted:
                start = int(wanted[1])
                end = min(int(wanted[2]) if wanted[2] else size - 1, size - 1)
            self.send_response(206 if wanted else 200)
            self.send_header("Accept-Ranges", "bytes")
            self.send_header("ETag", f'"{COMMIT}"')
            self.send_header("Content-Length", str(end - start + 1))
            if wanted:
                self.send_header("Content-Range", f"bytes {start}-{end}/{size}")
            self.end_headers()
            sent = 0
            if not head:
                with path.open("rb") as f:
                    f.seek(start)
                    left = end - start + 1
                    while left > 0:
                        chunk = f.read(min(left, 1 << 20))
                        if not chunk:
                            break
                        self.wfile.write(chunk)
                        left -= len(chunk)
                        sent += len(chunk)
            self._note(sent)

        def _answer(self, head: bool) -> None:
            path, _, query = self.path.partition("?")
            api = re.fullmatch(r"/api/models/([^/]+/[^/]+)/(refs|tree/([0-9a-f]{40}))", path)
            if api and api[1] in hub.repos:
                if api[2] == "refs":
                    return self._json({"branches": [{"name": "main", "ref": "refs/heads/main",
                                                     "targetCommit": COMMIT}], "converts": [], "tags": []})  # fmt: skip
                if api[3] == COMMIT and query == "recursive=true":
                    files = hub.repos[api[1]]
                    for served in files.values():
                        oids.setdefault(served, _oid(served))
                    return self._json([
                        {"type": "file", "oid": "f" * 40, "size": p.stat().st_size, "path": name,
                         "lfs": {"oid": oids[p], "size": p.stat().st_size, "pointerSize": 135}}
                        for name, p in files.items()
                    ])  # fmt: skip
            if path == "/token":
                return self._json({"token": "dock3r-t0ken"})
            manifest = re.fullmatch(r"/v2/([^/]+/[^/]+)/manifests/([^/]+)", path)
            if manifest and f"{manifest[1]}:{manifest[2]}" in hub.docker:
                served = hub.docker[f"{manifest[1]}:{manifest[2]}"]
                oids.setdefault(served, _oid(served))
                layer = {"mediaType": "application/vnd.docker.ai.gguf.v3", "digest": f"sha256:{oids[served]}"}
                return self._json({"schemaVersion": 2, "layers": [{"mediaType": "text/plain"}, layer]})
            blob = re.fullmatch(r"/v2/[^/]+/[^/]+/blobs/sha256:([0-9a-f]{64})", path)
            if blob:
                self.send_response(307)
                self.send_header("Location", f"https://localhost:{hub.port}/cdn/{blob[1]}")
                self.send_header("Content-Length", "0")
                self.end_headers()
                return self._note(0)
            cdn = re.fullmatch(r"/cdn/([0-9a-f]{64})", path)
            if cdn:
                served_by_oid = {oid: p for p, oid in oids.items()}
                if cdn[1] in served_by_oid:
                    return self._file(served_by_oid[cdn[1]], head)
            resolve = re.fullmatch(r"/([^/]+/[^/]+)/resolve/([0-9a-f]{40}|main)/(.+)", path)
            if resolve and resolve[1] in hub.repos and resolve[3] in hub.repos[resolve[1]]:
                return self._file(hub.repos[resolve[1]][resolve[3]], head)
            return self._missing()

        def do_GET(self) -> None:
            self._answer(head=False)

        def do_HEAD(self) -> None:
            self._answer(head=True)

    return Handler


@contextmanager
def serving(folder: Path, repos: dict[str, dict[str, Path]], docker: dict[str, Path] | None = None) -> Iterator[Hub]:
    """The hub on a free port of 127.0.0.1, its certificate in folder, until the block ends."""
    hub = Hub(repos, docker or {})
    hub.cert, key = make_certificate(folder)
    server = ThreadingHTTPServer(("127.0.0.1", 0), _handler(hub))
    server.daemon_threads = True
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(hub.cert, key)
    server.socket = context.wrap_socket(server.socket, server_side=True)
    hub.port = server.server_address[1]
    thread = threading.Thread(target=server.serve_forever, args=(0.02,), daemon=True)  # a quick shutdown
    thread.start()
    try:
        yield hub
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=5)
