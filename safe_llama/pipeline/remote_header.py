"""The GGUF header of a model llama.cpp has not downloaded yet (-hf, -mu, -dr), read over HTTP range requests
before llama.cpp downloads it, so that the first start is planned as exactly as the next ones.

Owns the requests safe-llama makes for it: the same server, file, token and certificates the pinned llama.cpp
uses (the rules are cmdline/model_source.py's), each bounded (bytes, time, redirects). Must not download the
weights, nor say, log or keep the token (it goes into request headers and nowhere else).
"""

from __future__ import annotations

import base64
import http.client
import json
import os
import re
import ssl
import time
from collections.abc import Mapping
from dataclasses import dataclass
from urllib.parse import quote, urljoin, urlsplit

from safe_llama.cmdline import model_source as ms
from safe_llama.cmdline.llama_args import CommandLine
from safe_llama.errors import ModelNotOnDisk
from safe_llama.model.facts import ModelFacts
from safe_llama.model.gguf_header import GGUFError, read_header_from
from safe_llama.model.header_facts import model_facts
from safe_llama.units import human

DEADLINE = 60.0  # seconds for all of a model's requests together: then llama.cpp fits it itself
TIMEOUT = 15.0  # seconds one connection or read may wait
MAX_HEADER_BYTES = 64 << 20  # a real header is under 10 MiB (the bundled model's: 6 MiB)
MAX_JSON_BYTES = 16 << 20  # an API answer (a repository's file list)
READ_AHEAD = 4 << 20  # bytes asked per range request
MAX_REDIRECTS = 5
# Docker Hub, where the pinned llama.cpp asks for -dr models (common/download.cpp: no variable moves them)
DOCKER_AUTH = "https://auth.docker.io/"
DOCKER_REGISTRY = "https://registry-1.docker.io/"
_CONTENT_RANGE = re.compile(r"bytes (\d+)-(\d+)/(\d+)")


class Unreadable(Exception):
    """Why the header could not be read: one clause, without the token."""


@dataclass(frozen=True)
class RemoteModel:
    facts: ModelFacts
    url: str  # the file's URL as shown (credentials masked)
    read_bytes: int  # what the header's reading fetched
    mmproj_bytes: int  # the projector llama.cpp downloads beside it (-hf), 0 when none

    def line(self, spec: str, tool: str) -> str:
        """The one line a launch says (and `plan` notes), naming the binary that downloads it."""
        scheme = "HTTPS" if self.url.startswith("https:") else "HTTP"
        return (
            f"{spec} is not downloaded yet: planned from its GGUF header, read over {scheme} from {self.url} "
            f"({human(self.read_bytes)} of {human(self.facts.file_size)}); llama-{tool} downloads it on this start"
        )


def shown(url: str) -> str:
    """A URL as llama.cpp shows it (common_http_show_masked_url): credentials masked, no query."""
    parts = urlsplit(url)
    host = parts.hostname or ""
    host = f"[{host}]" if ":" in host else host
    port = f":{parts.port}" if parts.port else ""
    return f"{parts.scheme}://{'****:****@' if parts.username else ''}{host}{port}{parts.path}"


def tls_context(env: Mapping[str, str]) -> ssl.SSLContext:
    """Verification as llama.cpp's OpenSSL does it (SSL_CTX_set_default_verify_paths): the system's CA file and
    folder, or those SSL_CERT_FILE and SSL_CERT_DIR name instead."""
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)  # hostname checked, certificate required
    defaults = ssl.get_default_verify_paths()
    cafile = env.get("SSL_CERT_FILE") or defaults.openssl_cafile
    capaths = (env.get("SSL_CERT_DIR") or defaults.openssl_capath).split(":")
    loaded = []
    try:
        if os.path.isfile(cafile):
            context.load_verify_locations(cafile=cafile)
            loaded.append(cafile)
        for capath in capaths:
            if capath and os.path.isdir(capath):
                context.load_verify_locations(capath=capath)
                loaded.append(capath)
    except (ssl.SSLError, OSError) as err:
        raise Unreadable(f"the CA certificates cannot be loaded ({err})") from None
    if not loaded:
        named = "SSL_CERT_FILE" if env.get("SSL_CERT_FILE") else "the system's CA file"
        raise Unreadable(f"no CA certificates to verify the server with ({named} {cafile} is not a file)")
    return context


@dataclass
class _Answer:
    status: int
    headers: http.client.HTTPMessage
    body: bytes
    url: str  # after redirects


class _Client:
    """One model's requests: one deadline, one TLS context."""

    def __init__(self, env: Mapping[str, str]) -> None:
        self.env = env
        self.deadline = time.monotonic() + DEADLINE
        self.context: ssl.SSLContext | None = None

    def _timeout(self) -> float:
        left = self.deadline - time.monotonic()
        if left <= 0:
            raise Unreadable(f"no answer within {DEADLINE:.0f} s")
        return min(TIMEOUT, left)

    def get(self, url: str, headers: Mapping[str, str], *, limit: int, auth: str | None = None) -> _Answer:
        """GET with redirects followed (the credentials only to the host they were given for); the body read
        up to `limit` bytes."""
        origin = urlsplit(url)[:2]
        for _ in range(MAX_REDIRECTS + 1):
            parts = urlsplit(url)
            if parts.scheme not in ("http", "https") or not parts.hostname:
                raise Unreadable(f"{shown(url)}: not an http or https URL")
            sent = dict(headers)
            if auth and parts[:2] == origin:
                sent["Authorization"] = auth
            if parts.username:
                pair = f"{parts.username}:{parts.password or ''}".encode()
                sent["Authorization"] = "Basic " + base64.b64encode(pair).decode()
            answer = self._once(sent, limit, url)
            location = answer.headers.get("Location")
            if answer.status in (301, 302, 303, 307, 308) and location:
                url = urljoin(url, location)
                continue
            return answer
        raise Unreadable(f"{shown(url)}: more than {MAX_REDIRECTS} redirects")

    def _once(self, headers: Mapping[str, str], limit: int, url: str) -> _Answer:
        split = urlsplit(url)
        timeout = self._timeout()
        target = split.path or "/"
        if split.query:
            target += "?" + split.query
        try:
            if split.scheme == "https":
                if self.context is None:
                    self.context = tls_context(self.env)
                conn: http.client.HTTPConnection = http.client.HTTPSConnection(
                    split.hostname or "", split.port, timeout=timeout, context=self.context
                )
            else:
                conn = http.client.HTTPConnection(split.hostname or "", split.port, timeout=timeout)
            try:
                conn.request("GET", target, headers={"User-Agent": "safe-llama", **headers})
                response = conn.getresponse()
                if "Range" in headers and response.status == 200:
                    raise Unreadable(f"{shown(url)}: HTTP 200 to a range request (the server sends whole files)")
                body = response.read(limit + 1)
            finally:
                conn.close()
        except ssl.SSLCertVerificationError as err:
            raise Unreadable(f"{shown(url)}: the server's certificate is not trusted ({err.verify_message})") from None
        except (http.client.InvalidURL, ValueError):  # their words quote the URL or the header: the token
            raise Unreadable(f"{shown(url)}: a URL or a header (the token?) that HTTP cannot carry") from None
        except (OSError, http.client.HTTPException) as err:
            raise Unreadable(f"{shown(url)}: {str(err) or type(err).__name__}") from None
        if len(body) > limit:
            raise Unreadable(f"{shown(url)}: the answer is larger than {human(limit)}")
        return _Answer(response.status, response.headers, body, url)

    def json(self, url: str, token: str | None) -> object:
        answer = self.get(url, {"Accept": "application/json"}, limit=MAX_JSON_BYTES, auth=_bearer(token))
        if answer.status != 200:
            raise Unreadable(f"{shown(url)}: HTTP {answer.status}")
        try:
            return json.loads(answer.body)
        except ValueError:
            raise Unreadable(f"{shown(url)}: the answer is not JSON") from None


def _bearer(token: str | None) -> str | None:
    return f"Bearer {token}" if token else None


class _RangeFile:
    """The model file's bytes, fetched by range requests as the header reader asks for them (a ByteSource)."""

    def __init__(self, client: _Client, url: str, auth: str | None) -> None:
        self.client, self.url, self.auth = client, url, auth
        self.pos = 0
        self.base = 0
        self.window = b""
        self.size = 0
        self.fetched = 0  # bytes of the file fetched
        self._fetch(0, READ_AHEAD)  # learns the size and the final URL (redirects resolved once)

    def _fetch(self, start: int, length: int) -> None:
        if self.fetched + length > MAX_HEADER_BYTES:
            raise OSError(f"the header is larger than {human(MAX_HEADER_BYTES)}")
        headers = {"Range": f"bytes={start}-{start + length - 1}", "Accept-Encoding": "identity"}
        try:
            answer = self.client.get(self.url, headers, limit=length, auth=self.auth)
        except Unreadable as err:
            raise OSError(str(err)) from None
        if answer.status != 206:
            raise OSError(f"{shown(self.url)}: HTTP {answer.status} to a range request (206 expected)")
        found = _CONTENT_RANGE.fullmatch(answer.headers.get("Content-Range", "").strip())
        if found is None or int(found[1]) != start or len(answer.body) != int(found[2]) - start + 1:
            raise OSError(f"{shown(self.url)}: the range answered is not the one asked")
        if self.url != answer.url and urlsplit(self.url)[:2] != urlsplit(answer.url)[:2]:
            self.auth = None  # a redirect to another host (a CDN): the credentials stay with the first
        self.url, self.size = answer.url, int(found[3])
        self.base, self.window = start, answer.body
        self.fetched += len(answer.body)

    def seek(self, pos: int, /) -> int:
        self.pos = pos
        return pos

    def read(self, size: int, /) -> bytes:
        end = min(self.pos + size, self.size)
        if end <= self.pos:
            return b""
        have = self.base + len(self.window)
        if not (self.base <= self.pos and end <= have):
            if self.base <= self.pos < have:  # the window's tail is kept: only what follows it is fetched
                kept = self.window[self.pos - self.base :]
                self._fetch(have, max(end - have, min(READ_AHEAD, self.size - have)))
                self.base, self.window = self.pos, kept + self.window
            else:
                self._fetch(self.pos, max(end - self.pos, min(READ_AHEAD, self.size - self.pos)))
        data = self.window[self.pos - self.base : end - self.base]
        self.pos += len(data)
        return data


def _facts(client: _Client, url: str, auth: str | None) -> tuple[ModelFacts, str, int]:
    """The model's facts, its URL as shown, and the bytes of it fetched."""
    try:
        source = _RangeFile(client, url, auth)
    except OSError as err:
        raise Unreadable(str(err)) from None
    try:
        header = read_header_from(source, shown(url), source.size)
        return model_facts(header), shown(url), source.fetched
    except GGUFError as err:
        raise Unreadable(err.problem) from None


def _hf(client: _Client, source: ms.ModelSource, cmd: CommandLine, env: Mapping[str, str]) -> RemoteModel:
    repo, tag = ms.split_repo_tag(source.spec)
    if not ms.valid_repo_id(repo):
        raise Unreadable(f"'{repo}' is not a repository name (<user>/<model>)")
    token = _text(cmd, "--hf-token")
    endpoint = ms.model_endpoint(env)
    commit = ms.commit_from_refs(client.json(f"{endpoint}api/models/{repo}/refs", ms.api_token(token)))
    if commit is None:
        raise Unreadable(f"{endpoint}api/models/{repo}/refs names no branch")
    files = ms.files_from_tree(
        client.json(f"{endpoint}api/models/{repo}/tree/{commit}?recursive=true", ms.api_token(token))
    )
    if "preset.ini" in files:
        raise Unreadable("the repository holds a preset.ini: llama-server runs its models as a router")
    wanted = _text(cmd, "--hf-file")
    chosen = (wanted if wanted in files else None) if wanted else ms.best_model(list(files), tag)
    if chosen is None:
        raise Unreadable(f"{repo} holds no {wanted or (tag + ' ' if tag else '') + 'GGUF model'} file")
    facts, url, fetched = _facts(client, f"{endpoint}{repo}/resolve/{commit}/{quote(chosen)}", _bearer(token))
    mmproj = ms.best_mmproj(list(files), chosen) if _wants_mmproj(cmd) else None
    return RemoteModel(facts, url, fetched, files.get(mmproj, 0) if mmproj else 0)


def _wants_mmproj(cmd: CommandLine) -> bool:
    """common_models_handler_init's download_mmproj for -hf (resolve()'s own rule)."""
    return (
        cmd.tool in ms.MMPROJ_TOOLS
        and cmd.value("--mmproj-auto") is not False
        and not _text(cmd, "--mmproj")
        and not _text(cmd, "--mmproj-url")
    )


def _docker(client: _Client, spec: str) -> RemoteModel:
    """common_docker_resolve_model: Docker Hub's token, the manifest's GGUF layer, its blob."""
    repo, tag = ms.docker_repo_tag(spec)
    scope = f"{DOCKER_AUTH}token?service=registry.docker.io&scope=repository:{repo}:pull"
    token = client.json(scope, None)
    bearer = token.get("token") if isinstance(token, dict) else None
    if not isinstance(bearer, str):
        raise Unreadable("Docker Hub's token answer has no token")
    registry = f"{DOCKER_REGISTRY}v2/{repo}"
    accept = "application/vnd.docker.distribution.manifest.v2+json,application/vnd.oci.image.manifest.v1+json"
    answer = client.get(f"{registry}/manifests/{tag}", {"Accept": accept}, limit=MAX_JSON_BYTES, auth=_bearer(bearer))
    if answer.status != 200:
        raise Unreadable(f"{registry}/manifests/{tag}: HTTP {answer.status}")
    try:
        digest = ms.docker_gguf_digest(json.loads(answer.body))
    except ValueError:
        digest = None
    if digest is None:
        raise Unreadable(f"{repo}:{tag}: no GGUF layer in its manifest")
    facts, url, fetched = _facts(client, f"{registry}/blobs/{digest}", _bearer(bearer))
    return RemoteModel(facts, url, fetched, 0)


def _text(cmd: CommandLine, key: str) -> str | None:
    value = cmd.value(key)
    return value if isinstance(value, str) and value else None


def read_remote(source: ms.ModelSource, cmd: CommandLine, env: Mapping[str, str]) -> RemoteModel:
    """The facts of the model `source` names, from its header on the server llama.cpp downloads it from;
    ModelNotOnDisk (saying why) when they cannot be read: llama.cpp then fits it itself."""
    client = _Client(env)
    try:
        if cmd.value("--offline") is True:
            raise Unreadable("--offline: llama.cpp loads it only from its cache")
        if source.kind == "hf":
            return _hf(client, source, cmd, env)
        if source.kind == "docker":
            return _docker(client, source.spec)
        url = ms.first_part_url(source.spec)
        token = _text(cmd, "--hf-token")
        facts, shown_url, fetched = _facts(client, url, _bearer(token))
        return RemoteModel(facts, shown_url, fetched, 0)
    except Unreadable as why:
        raise ModelNotOnDisk(
            f"safe-llama: {source.spec} is not downloaded yet ({source.where}) and its header could not be read "
            f"({why}): llama-{cmd.tool} downloads it and fits it itself on this start; the plan is exact from the "
            "next start"
        ) from None
