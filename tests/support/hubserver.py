"""A Hub-compatible HTTP server on 127.0.0.1 for tests and benchmarks (research/library-facts.md §1.10).

It serves generated repos to the real huggingface_hub client: ``/api/models/{repo}/revision/{rev}``,
``/api/models/{repo}/tree/{rev}``, ``HEAD|GET /{repo}/resolve/{rev}/{path}`` with ETag / X-Repo-Commit and
Range support. It counts every request and injects faults on demand (5xx, connection reset, truncated
body, wrong bytes, a slow body). It never advertises Xet (no ``X-Xet-*`` headers, no ``xetHash``) unless a
repo asks for it (``Repo.xet``: the ``HEAD`` headers only; no Xet token route or CAS exists here).

A file is bytes in memory (tests) or a :class:`Blob` on disk (the benchmark's shards of any size, sent
with ``sendfile``: the stand-in must not be what a fast client waits on).
"""

from __future__ import annotations

import hashlib
import json
import os
import random
import re
import socket
import struct
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import unquote, urlsplit

LFS_SUFFIXES = (".safetensors", ".bin", ".gguf", ".pt")


def git_blob_sha1(data: bytes) -> str:
    return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()


def lfs_pointer(data: bytes) -> bytes:
    return _pointer(hashlib.sha256(data).hexdigest(), len(data))


def _pointer(sha256: str, size: int) -> bytes:
    return (
        b"version https://git-lfs.github.com/spec/v1\noid sha256:" + sha256.encode() + b"\nsize %d\n" % size
    )


@dataclass(frozen=True)
class Blob:
    """A file of a commit kept on disk (generated once by :func:`write_random`), served with sendfile."""

    path: Path
    size: int
    sha256: str

    def __len__(self) -> int:
        return self.size


def write_random(seed: str, n: int, path: Path) -> Blob:
    """:func:`random_bytes` of ``seed`` written to ``path`` piece by piece (never all in memory)."""
    rng = random.Random(seed)
    h = hashlib.sha256()
    with path.open("wb") as fh:
        for i in range(0, n, _RANDBYTES_MAX):
            piece = rng.randbytes(min(_RANDBYTES_MAX, n - i))
            h.update(piece)
            fh.write(piece)
    return Blob(path, n, h.hexdigest())


def _sha256(data: bytes | Blob) -> str:
    return data.sha256 if isinstance(data, Blob) else hashlib.sha256(data).hexdigest()


#: ``Random.randbytes`` of more than this overflows (it asks for ``8 n`` bits as a C int): larger files are
#: generated in pieces of this size.
_RANDBYTES_MAX = 128 << 20


def random_bytes(seed: str, n: int) -> bytes:
    rng = random.Random(seed)
    if n <= _RANDBYTES_MAX:
        return rng.randbytes(n)
    return b"".join(rng.randbytes(min(_RANDBYTES_MAX, n - i)) for i in range(0, n, _RANDBYTES_MAX))


@dataclass
class Commit:
    sha: str
    files: dict[str, bytes | Blob]
    _entries: dict[str, dict[str, object]] = field(default_factory=dict)

    def entry(self, path: str) -> dict[str, object]:
        """Tree metadata of one file (hashed once: the benchmark must not time the stand-in's hashing)."""
        if path not in self._entries:
            self._entries[path] = self._entry(path)
        return self._entries[path]

    def _entry(self, path: str) -> dict[str, object]:
        data = self.files[path]
        e: dict[str, object] = {"type": "file", "path": path, "size": len(data)}
        if path.endswith(LFS_SUFFIXES) or isinstance(data, Blob):
            sha = _sha256(data)
            ptr = _pointer(sha, len(data))
            e["oid"] = git_blob_sha1(ptr)
            e["lfs"] = {"oid": sha, "size": len(data), "pointerSize": len(ptr)}
        else:
            e["oid"] = git_blob_sha1(data)
        return e

    def etag(self, path: str) -> str:
        e = self.entry(path)
        lfs = e.get("lfs")
        return str(lfs["oid"]) if isinstance(lfs, dict) else str(e["oid"])


@dataclass
class Repo:
    repo_id: str
    commits: dict[str, Commit] = field(default_factory=dict)
    refs: dict[str, str] = field(default_factory=dict)  # branch/tag -> sha
    gated: bool = False
    token: str | None = None  # private: needs this bearer token
    xet: bool = False  # resolve answers carry X-Xet-Hash and a refresh route, as the Hub's do

    def add_commit(
        self, files: Mapping[str, bytes | Blob], *, sha: str | None = None, refs: tuple[str, ...] = ("main",)
    ) -> str:
        """Add a commit (sha derived from content unless given) and point ``refs`` at it."""
        if sha is None:
            h = hashlib.sha1(self.repo_id.encode())
            for p in sorted(files):
                h.update(p.encode() + b"\0" + bytes.fromhex(_sha256(files[p])))
            h.update(str(len(self.commits)).encode())
            sha = h.hexdigest()
        self.commits[sha] = Commit(sha, dict(files))
        for r in refs:
            self.refs[r] = sha
        return sha

    def commit(self, rev: str) -> Commit | None:
        if rev in self.commits:
            return self.commits[rev]
        sha = self.refs.get(rev)
        return self.commits.get(sha) if sha else None


@dataclass
class Fault:
    """Inject ``kind`` on requests whose path contains ``match`` (and method matches), ``times`` times."""

    kind: str  # "500" | "503" | "reset" | "truncate" | "wrong" | "slow" | "norange" | "body"
    match: str
    method: str = "GET"
    times: int = 1
    delay: float = 0.0  # "slow": seconds per 256 KiB after ``after`` bytes
    after: int = 0
    body: bytes = b""  # "body": answer 200 with these bytes (a hostile or broken Hub)
    headers: dict[str, str] = field(default_factory=dict)  # "body": extra response headers (Link: …)


@dataclass
class Request:
    method: str
    path: str
    range: str | None
    authorization: bool
    sent: int = 0  # body bytes written for this request
    started: float = field(default_factory=time.monotonic)
    ended: float | None = None  # when the handler was done with it (None: still being answered)


class HubServer:
    """Threaded Hub stand-in; ``with HubServer() as hub: hub.url``."""

    def __init__(self) -> None:
        self.repos: dict[str, Repo] = {}
        self.requests: list[Request] = []
        self.faults: list[Fault] = []
        self.bytes_sent: dict[str, int] = {}
        self._mu = threading.Lock()
        self._httpd: ThreadingHTTPServer | None = None
        self._thread: threading.Thread | None = None

    # -- control ------------------------------------------------------------------------------
    def repo(self, repo_id: str, **kw: object) -> Repo:
        r = Repo(repo_id, **kw)  # type: ignore[arg-type]
        self.repos[repo_id] = r
        return r

    def fault(self, *faults: Fault) -> None:
        with self._mu:
            self.faults.extend(faults)

    def reset(self) -> None:
        with self._mu:
            self.requests.clear()
            self.faults.clear()
            self.bytes_sent.clear()

    def count(self, contains: str = "", method: str | None = None) -> int:
        with self._mu:
            return sum(
                1 for r in self.requests if contains in r.path and (method is None or r.method == method)
            )

    def peak_in_flight(self, contains: str = "/resolve/", method: str = "GET") -> int:
        """The most matching requests that were being answered at the same moment."""
        with self._mu:
            spans = [(r.started, r.ended) for r in self.requests if contains in r.path and r.method == method]
        edges = sorted([(t0, 1) for t0, _ in spans] + [(t1, -1) for _, t1 in spans if t1 is not None])
        peak = now = 0
        for _t, step in edges:  # at a tie the end sorts first: back-to-back is not overlap
            now += step
            peak = max(peak, now)
        return peak

    def hub_requests(self, contains: str = "") -> list[Request]:
        """Requests a Hub client makes for repos (telemetry pings left out)."""
        with self._mu:
            return [r for r in self.requests if contains in r.path and "agent-harnesses" not in r.path]

    @property
    def url(self) -> str:
        assert self._httpd is not None
        host, port = self._httpd.server_address[:2]
        return f"http://{host}:{port}"

    def start(self, host: str = "127.0.0.1") -> HubServer:
        """Serve on ``host`` (loopback; the link benchmark passes an address of a namespace it made)."""
        server = self

        class Handler(_Handler):
            hub = server

        self._httpd = ThreadingHTTPServer((host, 0), Handler)
        self._httpd.daemon_threads = True
        self._thread = threading.Thread(target=self._httpd.serve_forever, daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        if self._httpd is not None:
            self._httpd.shutdown()
            self._httpd.server_close()

    def __enter__(self) -> HubServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # -- internals ----------------------------------------------------------------------------
    def _take_fault(self, method: str, path: str) -> Fault | None:
        with self._mu:
            for f in self.faults:
                if f.times > 0 and f.method == method and f.match in path:
                    f.times -= 1
                    return f
        return None

    def _log(self, req: Request) -> None:
        with self._mu:
            self.requests.append(req)


_API = re.compile(r"^/api/models/([^/]+/[^/]+)/(revision|tree)/([^/]+)(?:/(.*))?$")
_RESOLVE = re.compile(r"^/([^/]+/[^/]+)/resolve/([^/]+)/(.+)$")


class _Handler(BaseHTTPRequestHandler):
    hub: HubServer
    protocol_version = "HTTP/1.1"
    # Headers and body go out as separate writes; without TCP_NODELAY, Nagle + delayed ACK stalls each
    # small response by up to 200 ms and the benchmark would measure the stand-in, not the client.
    disable_nagle_algorithm = True

    def log_message(self, format: str, *args: object) -> None:  # quiet
        pass

    def _send(self, code: int, body: bytes = b"", headers: dict[str, str] | None = None) -> None:
        self.send_response(code)
        for k, v in (headers or {}).items():
            self.send_header(k, v)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(body)

    def _json(self, obj: object, headers: dict[str, str] | None = None) -> None:
        self._send(200, json.dumps(obj).encode(), {"Content-Type": "application/json", **(headers or {})})

    def _error(self, code: int, error_code: str, msg: str, extra: dict[str, str] | None = None) -> None:
        body = json.dumps({"error": msg}).encode()
        self._send(code, body, {"X-Error-Code": error_code, "X-Error-Message": msg, **(extra or {})})

    def _reset(self) -> None:
        # An abortive close (RST), like a proxy dropping the connection.
        self.connection.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        self.close_connection = True
        self.connection.close()

    def do_HEAD(self) -> None:
        self._handle()

    def do_GET(self) -> None:
        self._handle()

    def _handle(self) -> None:
        req = Request(self.command, self.path, self.headers.get("Range"), "Authorization" in self.headers)
        self.hub._log(req)
        try:
            self._answer(req)
        finally:
            with self.hub._mu:
                req.ended = time.monotonic()

    def _answer(self, req: Request) -> None:
        hub = self.hub
        path = urlsplit(self.path).path
        fault = hub._take_fault(self.command, path)
        if fault is not None and fault.kind in ("500", "502", "503"):
            self._error(int(fault.kind), "", "injected server error")
            return
        if fault is not None and fault.kind == "reset":
            self._reset()
            return
        if fault is not None and fault.kind == "body":
            self._send(200, fault.body, {"Content-Type": "application/json", **fault.headers})
            return
        m = _API.match(path)
        if m:
            self._api(unquote(m.group(1)), m.group(2), unquote(m.group(3)))
            return
        m = _RESOLVE.match(path)
        if m:
            self._resolve(unquote(m.group(1)), unquote(m.group(2)), unquote(m.group(3)), fault, req)
            return
        self._send(404, b"not found")

    def _access(self, repo_id: str) -> Repo | None:
        repo = self.hub.repos.get(repo_id)
        auth = self.headers.get("Authorization", "")
        if repo is None or (repo.token and auth != f"Bearer {repo.token}"):
            self._error(401, "RepoNotFound", "Repository not found")
            return None
        if repo.gated:
            self._error(
                403, "GatedRepo", f"Access to model {repo_id} is restricted. You must accept the conditions."
            )
            return None
        return repo

    def _revision(self, repo_id: str, rev: str) -> tuple[Repo, Commit] | None:
        """(repo, commit) the client may read, or None once the error response is sent."""
        repo = self._access(repo_id)
        if repo is None:
            return None
        commit = repo.commit(rev)
        if commit is None:
            self._error(404, "RevisionNotFound", f"Invalid rev id: {rev}")
            return None
        return repo, commit

    def _api(self, repo_id: str, kind: str, rev: str) -> None:
        found = self._revision(repo_id, rev)
        if found is None:
            return
        repo, commit = found
        if kind == "revision":
            siblings = []
            for p in sorted(commit.files):
                e = commit.entry(p)
                s: dict[str, object] = {"rfilename": p, "size": e["size"], "blobId": e["oid"]}
                if "lfs" in e:
                    lfs = e["lfs"]
                    assert isinstance(lfs, dict)
                    s["lfs"] = {"sha256": lfs["oid"], "size": lfs["size"], "pointerSize": lfs["pointerSize"]}
                siblings.append(s)
            self._json(
                {
                    "id": repo_id,
                    "modelId": repo_id,
                    "sha": commit.sha,
                    "private": bool(repo.token),
                    "gated": repo.gated,
                    "siblings": siblings,
                }
            )
            return
        entries: list[dict[str, object]] = []
        dirs = sorted({"/".join(p.split("/")[:i]) for p in commit.files for i in range(1, p.count("/") + 1)})
        entries += [
            {"type": "directory", "path": d, "oid": hashlib.sha1(d.encode()).hexdigest(), "size": 0}
            for d in dirs
        ]
        entries += [commit.entry(p) for p in sorted(commit.files)]
        self._json(entries)

    def _resolve(self, repo_id: str, rev: str, file: str, fault: Fault | None, req: Request) -> None:
        found = self._revision(repo_id, rev)
        if found is None:
            return
        _repo, commit = found
        if file not in commit.files:
            self._error(404, "EntryNotFound", f"{file} does not exist", {"X-Repo-Commit": commit.sha})
            return
        data = commit.files[file]
        headers = {
            "ETag": f'"{commit.etag(file)}"',
            "X-Repo-Commit": commit.sha,
            "Accept-Ranges": "bytes",
            "Content-Type": "application/octet-stream",
        }
        if _repo.xet:
            headers["X-Xet-Hash"] = hashlib.sha256(commit.etag(file).encode()).hexdigest()
            headers["X-Xet-Refresh-Route"] = (
                f"{self.hub.url}/api/models/{repo_id}/xet-read-token/{commit.sha}"
            )
        start, end, code = 0, len(data), 200
        rng = self.headers.get("Range")
        if fault is not None and fault.kind == "norange":
            rng = None  # like a CDN that answers 200 with the whole body
        if rng and self.command == "GET":
            # `bytes=N-` (resume) and `bytes=N-M` (safetensors header reads), M inclusive and clamped.
            mm = re.fullmatch(r"bytes=(\d+)-(\d*)", rng.strip())
            if mm:
                start = int(mm.group(1))
                if start >= len(data):
                    self._send(416, b"", {"Content-Range": f"bytes */{len(data)}"})
                    return
                end = min(int(mm.group(2)) + 1, len(data)) if mm.group(2) else len(data)
                code = 206
                headers["Content-Range"] = f"bytes {start}-{end - 1}/{len(data)}"
        self.send_response(code)
        for k, v in headers.items():
            self.send_header(k, v)
        self.send_header("Content-Length", str(end - start))
        self.end_headers()
        if self.command == "HEAD":
            return
        cut = end
        if fault is not None and fault.kind == "truncate":
            cut = start + (end - start) // 2
        try:
            self._body(data, start, cut, fault, req, file)
        except (BrokenPipeError, ConnectionResetError):
            self.close_connection = True
            return
        if cut < end:
            # A clean close (FIN) mid-body: every byte sent reaches the client (a reset may discard bytes
            # still unread in its buffer, so what arrived would be a race).
            self.wfile.flush()
            self.connection.shutdown(socket.SHUT_WR)
            self.close_connection = True

    def _body(
        self, data: bytes | Blob, start: int, cut: int, fault: Fault | None, req: Request, file: str
    ) -> None:
        """Send bytes ``start``..``cut`` of the file: slices of the bytes (never copied) or ``sendfile`` from
        a blob, in large steps unless a "slow" fault paces them. A "wrong" fault flips the first byte sent."""
        slow = fault is not None and fault.kind == "slow"
        step = 256 * 1024 if slow else 8 << 20
        pos = start
        if fault is not None and fault.kind == "wrong" and pos < cut:
            first = data[pos] if isinstance(data, bytes) else os.pread(self._fd(data), 1, pos)[0]
            self.wfile.write(bytes([first ^ 0xFF]))
            self._sent(req, file, 1)
            pos += 1
        view = memoryview(data) if isinstance(data, bytes) else None
        while pos < cut:
            n = min(step, cut - pos)
            if view is not None:
                self.wfile.write(view[pos : pos + n])
            else:
                assert isinstance(data, Blob)
                n = os.sendfile(self.connection.fileno(), self._fd(data), pos, n)
                if n == 0:
                    raise BrokenPipeError("sendfile sent nothing")
            pos += n
            self._sent(req, file, n)
            if slow and fault is not None and pos >= fault.after and pos < cut:
                self.wfile.flush()
                time.sleep(fault.delay)

    def _fd(self, blob: Blob) -> int:
        """An open descriptor of ``blob`` (one per handler, that is per connection)."""
        fds: dict[Path, int] = self.__dict__.setdefault("_fds", {})
        if blob.path not in fds:
            fds[blob.path] = os.open(blob.path, os.O_RDONLY)
        return fds[blob.path]

    def finish(self) -> None:
        super().finish()
        for fd in self.__dict__.get("_fds", {}).values():
            os.close(fd)

    def _sent(self, req: Request, file: str, n: int) -> None:
        with self.hub._mu:
            req.sent += n
            self.hub.bytes_sent[file] = self.hub.bytes_sent.get(file, 0) + n


def bench_env(base: Mapping[str, str], url: str, hf_home: Path, root: Path) -> dict[str, str]:
    """``base`` without the user's Hub settings, pointed at the stand-in at ``url`` (for bench/: `invoke
    fetch-model` acting on the checkout at ``root``, and `hf download`, quietly and without Xet)."""
    return {
        **{k: v for k, v in base.items() if not k.startswith(("HF_", "HUGGING"))},
        "HF_ENDPOINT": url,
        "HF_HOME": str(hf_home),
        "HF_HUB_DISABLE_TELEMETRY": "1",
        "HF_HUB_DISABLE_XET": "1",
        "HF_HUB_DISABLE_PROGRESS_BARS": "1",
        "RIGSMITH_ROOT": str(root),
    }


def main(argv: list[str] | None = None) -> None:
    """Serve generated repos until killed (for bench/): prints ``URL COMMIT`` on stdout, a line per repo."""
    import argparse
    import sys

    ap = argparse.ArgumentParser(description=main.__doc__)
    ap.add_argument("--repo", default="acme/bench")
    ap.add_argument("--shards", type=int, default=4)
    ap.add_argument("--shard-mib", type=int, default=64)
    ap.add_argument(
        "--also", action="append", default=[], metavar="REPO:SHARDS:MIB", help="another repo to serve"
    )
    ap.add_argument("--data-dir", type=Path, help="keep the shards as files here (any size), not in memory")
    ap.add_argument("--host", default="127.0.0.1", help="address to serve on (bench_link: a netns one)")
    ap.add_argument(
        "--slow", type=float, default=0.0, help="seconds to sleep per 256 KiB sent (to watch progress)"
    )
    args = ap.parse_args(argv)
    server = HubServer()
    shas = [_bench_repo(server, args.repo, args.shards, args.shard_mib, args.data_dir)]
    for spec in args.also:
        repo, shards, mib = spec.rsplit(":", 2)
        shas.append(_bench_repo(server, repo, int(shards), int(mib), args.data_dir))
    if args.slow:
        server.fault(Fault("slow", "/resolve/", delay=args.slow, times=1 << 30))
    server.start(args.host)
    sys.stdout.write("".join(f"{server.url} {sha}\n" for sha in shas))
    sys.stdout.flush()
    try:
        threading.Event().wait()
    finally:
        server.stop()


def _bench_repo(server: HubServer, repo: str, shards: int, mib: int, data_dir: Path | None) -> str:
    """A config, a tokenizer and ``shards`` random shards of ``mib`` MiB each; the commit's sha."""
    files: dict[str, bytes | Blob] = {
        "config.json": b'{"architectures": ["Bench"], "text_config": {"hidden_size": 8}}\n',
        "tokenizer.json": json.dumps({"vocab": list(range(2000))}).encode(),
    }
    for i in range(1, shards + 1):
        name, seed = f"model-{i:05d}-of-{shards:05d}.safetensors", f"bench/{repo}/{i}"
        if data_dir is None:
            files[name] = random_bytes(seed, mib << 20)
        else:
            data_dir.mkdir(parents=True, exist_ok=True)
            files[name] = write_random(seed, mib << 20, data_dir / f"{repo.replace('/', '--')}--{name}")
    sha = server.repo(repo).add_commit(files)
    for p in files:
        server.repos[repo].commits[sha].entry(p)
    return sha


if __name__ == "__main__":
    main()
