"""A hostile or broken registry on 127.0.0.1 ends in one AdapterError paragraph, never a traceback, and
never puts a non-digest into the lock (issue 10, low 11)."""

from __future__ import annotations

import json
import socket
import socketserver
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from http.server import ThreadingHTTPServer

import httpx
import pytest

from rigsmith import imageref
from rigsmith.errors import AdapterError
from rigsmith.resolving.image import registry as registrymod
from tests.support import services

GOOD = "sha256:" + "ab" * 32
MANIFEST = json.dumps({"schemaVersion": 2, "mediaType": imageref.OCI_MANIFEST}).encode()


@dataclass
class Script:
    """What the hostile registry answers: the token endpoint, and the manifest (HEAD and GET)."""

    token_status: int = 200
    token_type: str = "application/json"
    token_body: bytes = b'{"token": "T0K"}'
    realm: str | None = None  # default: this server's /token
    head_status: int = 200
    digest: str | None = GOOD
    get_body: bytes = MANIFEST
    hits: list[str] = field(default_factory=list)


class _Hostile(services.QuietHandler):
    script = Script()

    def _answer(self) -> None:
        s = type(self).script
        s.hits.append(f"{self.command} {self.path}")
        if self.path.startswith("/token"):
            self._send(s.token_status, {"Content-Type": s.token_type}, s.token_body)
            return
        if self.headers.get("Authorization") != "Bearer T0K":
            realm = s.realm or f"http://127.0.0.1:{self.server.server_address[1]}/token"  # type: ignore[index]
            self._send(401, {"WWW-Authenticate": f'Bearer realm="{realm}",service="hostile"'})
            return
        headers = {"Content-Type": imageref.OCI_MANIFEST}
        if s.digest is not None:
            headers["Docker-Content-Digest"] = s.digest
        if self.command == "HEAD":
            self._send(s.head_status, headers)
        else:
            self._send(200, headers, s.get_body)

    do_GET = _answer
    do_HEAD = _answer


@pytest.fixture
def hostile() -> Iterator[tuple[str, Script]]:
    script = Script()
    _Hostile.script = script
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Hostile)
    server.daemon_threads = True
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"127.0.0.1:{server.server_address[1]}", script
    server.shutdown()
    server.server_close()


def _resolve(host: str) -> registrymod.Resolved:
    reg = registrymod.Registry({}, attempts=2, backoff=0.01, timeout=5)
    try:
        return reg.resolve(f"{host}/acme/model:1")
    finally:
        reg.close()


def test_the_hostile_stand_in_answers_a_good_flow(hostile):
    host, _script = hostile
    assert _resolve(host).digest == GOOD


@pytest.mark.parametrize(
    ("changes", "says"),
    [
        ({"token_type": "text/html", "token_body": b"<html><body>login</body></html>"}, "holding a token"),
        ({"token_body": b'["T0K"]'}, "holding a token"),
        ({"token_body": b'{"token": {"nested": 1}}'}, "holding a token"),
        ({"token_body": b'{"token": "T0K\\r\\nX-Evil: 1"}'}, "holding a token"),
        ({"token_body": b"\xff\xfe"}, "holding a token"),
        ({"realm": "file:///etc/passwd"}, "not an http(s) URL"),
        ({"realm": "http://[::1"}, "cannot resolve"),
        ({"digest": "sha256:../../etc/passwd"}, "not sha256:<64 hex>"),
        ({"digest": "sha256:" + "ab" * 31}, "not sha256:<64 hex>"),
        ({"digest": "garbage"}, "not sha256:<64 hex>"),
        ({"head_status": 405, "digest": None, "get_body": b"<html>garbage</html>"}, "not an image manifest"),
        ({"head_status": 405, "digest": None, "get_body": b"[1, 2]"}, "not an image manifest"),
        ({"head_status": 405, "digest": "md5:xyz", "get_body": MANIFEST}, "not sha256:<64 hex>"),
    ],
)
def test_a_hostile_registry_is_one_adapter_error(hostile, changes, says):
    host, script = hostile
    for k, v in changes.items():
        setattr(script, k, v)
    with pytest.raises(AdapterError) as err:
        _resolve(host)
    assert says in str(err.value) and host in str(err.value)
    assert "T0K" not in str(err.value)


class _Garbage(socketserver.BaseRequestHandler):
    def handle(self) -> None:
        self.request.recv(4096)
        self.request.sendall(b"\x00\x01garbage that is not HTTP at all\r\n\r\n")


def test_a_server_that_does_not_speak_http_is_one_adapter_error():
    with socketserver.ThreadingTCPServer(("127.0.0.1", 0), _Garbage) as server:
        server.daemon_threads = True
        threading.Thread(target=server.serve_forever, daemon=True).start()
        try:
            with pytest.raises(AdapterError, match="cannot resolve"):
                _resolve(f"127.0.0.1:{server.server_address[1]}")
        finally:
            server.shutdown()


class _Counting(httpx.HTTPTransport):
    """The real transport, counting the requests it is asked to send."""

    def __init__(self) -> None:
        super().__init__()
        self.sent = 0

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        self.sent += 1
        return super().handle_request(request)


def test_a_refused_connection_is_not_retried_but_a_reset_is():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        closed = s.getsockname()[1]
    transport = _Counting()
    reg = registrymod.Registry({}, client=httpx.Client(transport=transport), attempts=4, backoff=0.01)
    with pytest.raises(AdapterError, match=r"cannot resolve.*Connection refused"):
        reg.resolve(f"127.0.0.1:{closed}/acme/model:1")
    assert transport.sent == 1

    with socketserver.ThreadingTCPServer(("127.0.0.1", 0), _Garbage) as server:
        server.daemon_threads = True
        threading.Thread(target=server.serve_forever, daemon=True).start()
        try:
            with pytest.raises(AdapterError, match="cannot resolve"):
                reg.resolve(f"127.0.0.1:{server.server_address[1]}/acme/model:1")
        finally:
            server.shutdown()
    assert transport.sent == 1 + 4  # a server that answers garbage may be mid-restart: retried
