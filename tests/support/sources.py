"""A git server and a release-asset server on loopback, and a source-tree image definition, for the
source-pinned image tests and bench. Plain context managers (no pytest)."""

from __future__ import annotations

import contextlib
import gzip
import http.server
import io
import socket
import subprocess
import tarfile
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tests.support.services import _stop, free_port

SCALES = "scales/qsa_kv_scales_262k.json"
OPS = "vllm-v2.5/vllm/_C.abi3.so"
BUNDLE = "vllm-v2.5/vllm/__init__.py"

_GIT_ENV = {
    "GIT_AUTHOR_NAME": "t",
    "GIT_AUTHOR_EMAIL": "t@example.invalid",
    "GIT_COMMITTER_NAME": "t",
    "GIT_COMMITTER_EMAIL": "t@example.invalid",
    "GIT_AUTHOR_DATE": "2026-01-01T00:00:00Z",
    "GIT_COMMITTER_DATE": "2026-01-01T00:00:00Z",
    "HOME": "/nonexistent",
    "PATH": "/usr/local/bin:/usr/bin:/bin",
}


def git(*args: str, cwd: Path) -> str:
    """Run git in ``cwd`` with a fixed identity and dates; return stdout."""
    proc = subprocess.run(
        ["git", *args], cwd=cwd, env=_GIT_ENV, capture_output=True, text=True, timeout=60, check=False
    )
    if proc.returncode != 0:
        raise AssertionError(f"git {' '.join(args)} failed: {proc.stderr}")
    return proc.stdout.strip()


@dataclass
class Upstream:
    """A work repository pushed to a bare one that git daemon serves as ``git://127.0.0.1:PORT/merlin``."""

    work: Path
    bare: Path
    url: str

    def commit(self, files: dict[str, str], message: str, *, branch: str = "main") -> str:
        """Write ``files``, commit on ``branch``, push it; the new commit."""
        for rel, text in files.items():
            p = self.work / rel
            p.parent.mkdir(parents=True, exist_ok=True)
            p.write_text(text)
        git("add", "-A", cwd=self.work)
        git("commit", "-q", "-m", message, cwd=self.work)
        git("push", "-q", "--force", str(self.bare), f"HEAD:refs/heads/{branch}", cwd=self.work)
        return git("rev-parse", "HEAD", cwd=self.work)

    def tag(self, name: str) -> str:
        """Tag HEAD (annotated) and push the tag; the commit it names."""
        git("tag", "-a", "-m", name, name, cwd=self.work)
        git("push", "-q", str(self.bare), f"refs/tags/{name}", cwd=self.work)
        return git("rev-parse", "HEAD", cwd=self.work)


@contextlib.contextmanager
def git_daemon(base: Path) -> Iterator[Upstream]:
    """A repo with a ``main`` branch and a ``v2.5.1`` tag behind ``git daemon`` on 127.0.0.1 (killed on
    exit, and after 600 s whatever happens)."""
    work, served = base / "work", base / "served"
    work.mkdir(parents=True)
    served.mkdir()
    bare = served / "merlin"
    git("init", "-q", "--bare", str(bare), cwd=base)
    git("init", "-q", "-b", "main", cwd=work)
    (work / "scripts").mkdir()
    up = Upstream(work, bare, "")
    up.commit(
        {
            SCALES: '{"k_scale": 0.5, "v_scale": 0.25}\n',
            "scripts/serve-v2.5.sh": '#!/bin/sh\nexec vllm serve "$@"\n',
            "README.md": "merlin\n",
        },
        "v2.5.1",
    )
    (work / "scripts" / "serve-v2.5.sh").chmod(0o755)
    (work / "latest").symlink_to("scales")
    up.commit({}, "exec bit and a symlink")
    up.tag("v2.5.1")
    port = free_port()
    log = base / "git-daemon.log"
    with log.open("wb") as out:
        proc = subprocess.Popen(
            [
                "timeout", "600", "git", "daemon", "--listen=127.0.0.1", f"--port={port}", "--export-all",
                "--reuseaddr", f"--base-path={served}", str(served),
            ],
            stdout=out,
            stderr=subprocess.STDOUT,
        )  # fmt: skip
    try:
        deadline = time.monotonic() + 20
        while True:
            with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), 0.5):
                break
            if proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"git daemon did not start: {log.read_text()}")
            time.sleep(0.05)
        up.url = f"git://127.0.0.1:{port}/merlin"
        yield up
    finally:
        _stop(proc)


@dataclass
class AssetServer:
    """Files served over plain HTTP on 127.0.0.1; ``files`` may change while it runs."""

    url: str
    files: dict[str, bytes] = field(default_factory=dict)
    hits: list[str] = field(default_factory=list)
    #: path → Location: answered with a 302 instead of a file.
    redirects: dict[str, str] = field(default_factory=dict)


@contextlib.contextmanager
def asset_server() -> Iterator[AssetServer]:
    """A threaded HTTP server on 127.0.0.1 serving ``AssetServer.files`` by path."""
    srv = AssetServer("")

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            srv.hits.append(self.path)
            if self.path in srv.redirects:
                self.send_response(302)
                self.send_header("Location", srv.redirects[self.path])
                self.send_header("Content-Length", "0")
                self.end_headers()
                return
            data = srv.files.get(self.path)
            if data is None:
                self.send_error(404)
                return
            self.send_response(200)
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def log_message(self, *args: Any) -> None:
            pass

    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    srv.url = f"http://127.0.0.1:{httpd.server_address[1]}"
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    try:
        yield srv
    finally:
        httpd.shutdown()
        httpd.server_close()
        thread.join(10)


def tarball(members: dict[str, bytes], *, gz: bool = True) -> bytes:
    """A tar(.gz) of regular files with fixed metadata."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        for name, data in members.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            info.mode = 0o644
            tar.addfile(info, io.BytesIO(data))
    return gzip.compress(buf.getvalue(), mtime=0) if gz else buf.getvalue()


OPS_TAR = tarball({OPS: b"\x7fELF compiled ops v2.2.0\n"})
BUNDLE_TAR = tarball({BUNDLE: b"__version__ = '2.5.1'\n"})


def serve_release(assets: AssetServer) -> dict[str, str]:
    """Put the v2.5.1 source bundle and the compiled-ops tarball on the asset server; name → URL."""
    assets.files["/releases/v2.5.1/source.tar.gz"] = BUNDLE_TAR
    assets.files["/releases/v2.2.0/ops.tar.gz"] = OPS_TAR
    return {
        "source-bundle": f"{assets.url}/releases/v2.5.1/source.tar.gz",
        "compiled-ops": f"{assets.url}/releases/v2.2.0/ops.tar.gz",
    }


def source_image(root: Path, base_ref: str, repo: str | None, ref: str, urls: dict[str, str | None],
                 *, digest: str | None = None, **tree: Any) -> Path:  # fmt: skip
    """images/merlin: the busybox base plus the tree at ``ref`` with the two release assets unpacked."""
    import yaml

    name, _, tag = base_ref.rpartition(":")
    home = root / "images" / "merlin"
    home.mkdir(parents=True, exist_ok=True)
    data: dict[str, Any] = {
        "version": 1,
        "description": "busybox + a source tree (tests)",
        "base": {"name": name, "digest": digest} if digest else {"name": name, "tag": tag},
        "tree": {
            "repo": repo,
            "ref": ref,
            "dest": "/opt/merlin",
            "install": "pythonpath",
            "pythonpath": "vllm-v2.5",
            "assets": [{"name": n, "url": u, "unpack": "."} for n, u in urls.items()],
            **tree,
        },
        "smoke": ["/bin/sh", "-c", f"test -s /opt/merlin/{SCALES} && test -s /opt/merlin/{OPS}"],
    }
    (home / "image.yaml").write_text(yaml.safe_dump(data, sort_keys=False))
    (root / "deployments").mkdir(parents=True, exist_ok=True)
    return home
