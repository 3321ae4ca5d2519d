"""Tag → digest: reference parsing, auth, and real resolution against docker-registry on 127.0.0.1."""

from __future__ import annotations

import base64
import json
import threading
from collections.abc import Iterator
from http.server import ThreadingHTTPServer
from pathlib import Path

import httpx
import pytest

from rigsmith import imageref
from rigsmith.errors import AdapterError, RigsmithError
from rigsmith.resolving.image import registry as registrymod
from tests.support import services

pytestmark = pytest.mark.engine


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("ubuntu", ("docker.io", "library/ubuntu", "latest", None)),
        ("vllm/vllm-openai:v0.9.1", ("docker.io", "vllm/vllm-openai", "v0.9.1", None)),
        ("127.0.0.1:5000/tinybase:1", ("127.0.0.1:5000", "tinybase", "1", None)),
        ("localhost/rigsmith/x:abc", ("localhost", "rigsmith/x", "abc", None)),
        ("ghcr.io/o/r@sha256:" + "0" * 64, ("ghcr.io", "o/r", None, "sha256:" + "0" * 64)),
        ("ghcr.io/o/r:t@sha256:" + "0" * 64, ("ghcr.io", "o/r", "t", "sha256:" + "0" * 64)),
    ],
)
def test_parse_ref(text: str, expected: tuple[str, str, str | None, str | None]) -> None:
    ref = registrymod.parse_ref(text)
    assert (ref.registry, ref.repository, ref.tag, ref.digest) == expected


@pytest.mark.parametrize(
    "text",
    [
        "Vllm/Upper:1",
        "x@sha256:123",
        "x:bad tag",
        "a//b",
        # A trailing newline (which a ^…$ pattern lets through) and a non-ASCII tag (Go's \w is ASCII).
        "localhost/x:1\n",
        "localhost/x\n",
        "x@sha256:" + "0" * 64 + "\n",
        "x:tä",
    ],
)
def test_parse_ref_refuses_garbage(text: str) -> None:
    with pytest.raises(RigsmithError, match="image reference"):
        registrymod.parse_ref(text)


def test_scheme_is_http_only_for_loopback() -> None:
    assert registrymod.parse_ref("127.0.0.1:5000/a").scheme == "http"
    assert registrymod.parse_ref("localhost:5000/a").scheme == "http"
    assert registrymod.parse_ref("ghcr.io/a/b").scheme == "https"
    assert registrymod.parse_ref("ubuntu").api_host == "registry-1.docker.io"


def test_parse_challenge() -> None:
    scheme, params = registrymod.parse_challenge(
        'Bearer realm="https://auth.docker.io/token",service="registry.docker.io",scope="repository:a/b:pull"'
    )
    assert scheme == "bearer"
    assert params == {
        "realm": "https://auth.docker.io/token",
        "service": "registry.docker.io",
        "scope": "repository:a/b:pull",
    }
    assert registrymod.parse_challenge('Basic realm="r"') == ("basic", {"realm": "r"})


def test_credentials_from_docker_config() -> None:
    auth = base64.b64encode(b"me:s3:cret").decode()
    config = {
        "auths": {
            "https://index.docker.io/v1/": {"auth": auth},
            "ghcr.io": {"username": "u", "password": "p"},
        }
    }
    assert registrymod.credentials_for(config, "docker.io") == ("me", "s3:cret")
    assert registrymod.credentials_for(config, "ghcr.io") == ("u", "p")
    assert registrymod.credentials_for(config, "quay.io") is None
    with pytest.raises(RigsmithError, match="not base64"):
        registrymod.credentials_for({"auths": {"x.io": {"auth": "%%%"}}}, "x.io")


def test_docker_config_location(tmp_path: Path) -> None:
    assert registrymod.docker_config_path({"DOCKER_CONFIG": str(tmp_path)}) == tmp_path / "config.json"
    assert registrymod.docker_config_path({"HOME": "/h"}) == Path("/h/.docker/config.json")
    (tmp_path / "config.json").write_text(json.dumps({"auths": {}}))
    assert registrymod.load_docker_config({"DOCKER_CONFIG": str(tmp_path)}) == {"auths": {}}


def test_resolve_matches_skopeo_for_an_image_and_an_index(
    base_ref: str, registry: services.LocalRegistry, podman_api: services.PodmanService
) -> None:
    reg = registrymod.Registry({})
    got = reg.resolve(base_ref)
    assert got.digest == services.skopeo_digest(base_ref)
    assert got.media_type in (imageref.DOCKER_MANIFEST, imageref.OCI_MANIFEST)
    # A multi-platform index: resolved to the index digest itself (what FROM name@digest must pin).
    index = f"{registry.host}/tinyindex:1"
    podman_api.cli("manifest", "create", index)
    podman_api.cli("manifest", "add", "--tls-verify=false", index, f"docker://{base_ref}")
    podman_api.cli("manifest", "push", "--all", "--tls-verify=false", index, f"docker://{index}")
    got = reg.resolve(index)
    assert got.media_type in (imageref.OCI_INDEX, imageref.DOCKER_LIST)
    assert got.digest == services.skopeo_digest(index)
    with pytest.raises(AdapterError, match="not found") as err:
        reg.resolve(f"{registry.host}/tinybase:no-such-tag")
    assert "check the tag exists" in str(err.value)
    reg.close()


class _AuthFront(services.QuietHandler):
    """A registry front that demands a bearer token (issued for basic credentials), then proxies."""

    upstream = ""
    token_hits = 0
    failures_left = 0
    drop_digest_header = False
    anonymous_tokens = False

    def _manifest(self) -> None:
        cls = type(self)
        if cls.failures_left > 0:
            cls.failures_left -= 1
            self._send(503, {})
            return
        if self.path.startswith("/token"):
            expected = "Basic " + base64.b64encode(b"alice:pw").decode()
            scope_ok = "scope=repository%3Atinybase%3Apull" in self.path and "service=front" in self.path
            authorized = cls.anonymous_tokens or self.headers.get("Authorization") == expected
            if not authorized or not scope_ok:
                self._send(401, {})
                return
            cls.token_hits += 1
            self._send(200, {"Content-Type": "application/json"}, json.dumps({"token": "T0K"}).encode())
            return
        if self.headers.get("Authorization") != "Bearer T0K":
            host = f"127.0.0.1:{self.server.server_address[1]}"  # type: ignore[index]
            challenge = f'Bearer realm="http://{host}/token",service="front",scope="repository:tinybase:pull"'
            self._send(401, {"WWW-Authenticate": challenge})
            return
        up = httpx.request(
            self.command, f"http://{cls.upstream}{self.path}", headers={"Accept": self.headers["Accept"]}
        )
        headers = {"Content-Type": up.headers["Content-Type"]}
        if not cls.drop_digest_header:
            headers["Docker-Content-Digest"] = up.headers["Docker-Content-Digest"]
        self._send(up.status_code, headers, up.content)

    do_GET = _manifest
    do_HEAD = _manifest


@pytest.fixture
def auth_front(registry: services.LocalRegistry) -> Iterator[str]:
    _AuthFront.upstream = registry.host
    _AuthFront.token_hits = 0
    _AuthFront.failures_left = 0
    _AuthFront.drop_digest_header = False
    _AuthFront.anonymous_tokens = False
    server = ThreadingHTTPServer(("127.0.0.1", 0), _AuthFront)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()


def test_bearer_flow_with_basic_credentials_from_docker_config(auth_front: str, base_ref: str) -> None:
    truth = services.skopeo_digest(base_ref)
    ref = f"{auth_front}/tinybase:1"
    with pytest.raises(AdapterError, match="not authorized") as err:
        registrymod.Registry({}).resolve(ref)
    assert "docker login" in str(err.value)
    config = {"auths": {auth_front: {"auth": base64.b64encode(b"alice:pw").decode()}}}
    reg = registrymod.Registry(config)
    assert reg.resolve(ref).digest == truth
    assert reg.resolve(ref).digest == truth
    assert _AuthFront.token_hits == 1  # the token is reused for the same repository


def test_digest_from_the_body_when_the_header_is_missing(auth_front: str, base_ref: str) -> None:
    _AuthFront.drop_digest_header = True
    config = {"auths": {auth_front: {"username": "alice", "password": "pw"}}}
    got = registrymod.Registry(config).resolve(f"{auth_front}/tinybase:1")
    assert got.digest == services.skopeo_digest(base_ref)


def test_transient_errors_are_retried_and_then_reported(auth_front: str, base_ref: str) -> None:
    config = {"auths": {auth_front: {"username": "alice", "password": "pw"}}}
    fast = {"attempts": 3, "backoff": 0.01}
    _AuthFront.failures_left = 2
    got = registrymod.Registry(config, **fast).resolve(f"{auth_front}/tinybase:1")  # type: ignore[arg-type]
    assert got.digest == services.skopeo_digest(base_ref)
    _AuthFront.failures_left = 10
    with pytest.raises(AdapterError, match="HTTP 503"):
        registrymod.Registry(config, **fast).resolve(f"{auth_front}/tinybase:1")  # type: ignore[arg-type]
    assert _AuthFront.failures_left == 7  # three tries, then the error
    with pytest.raises(AdapterError, match="cannot resolve"):
        registrymod.Registry({}, **fast).resolve(f"127.0.0.1:{services.free_port()}/nothing:1")  # type: ignore[arg-type]


def test_anonymous_bearer_flow(auth_front: str, base_ref: str) -> None:
    """Docker Hub / GHCR style for public images: 401, then a token for the scope without credentials."""
    _AuthFront.anonymous_tokens = True
    got = registrymod.Registry({}).resolve(f"{auth_front}/tinybase:1")
    assert got.digest == services.skopeo_digest(base_ref)
    assert _AuthFront.token_hits == 1
