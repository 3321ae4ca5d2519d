"""Engine adapter: build, tag, push and inspect images with docker-py, against Docker or Podman's API service.

Translation only. Two engine facts shape it (shared/research/library-facts.md §3):

- Podman's Docker-compatible ``/build`` commits Docker-v2 images whose config carries the random build
  container's ID and hostname, so two clean builds never match. Its native ``/libpod/build`` (same socket,
  same docker-py HTTP session) takes ``timestamp`` and an OCI output format: with those, the image ID and
  the pushed digest are the same from clean storage. So rigsmith builds through ``/libpod/build`` on Podman.
- After a push, Podman's ``RepoDigests`` still shows the local manifest digest, which the registry does not
  have: the digest is taken from the push stream (and re-checked against the registry by the caller).
"""

from __future__ import annotations

import http.client
import io
import json
import re
import socket
import urllib.parse
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal, Protocol

from rigsmith.errors import AdapterError, PreflightError

if TYPE_CHECKING:
    import docker  # type: ignore[import-untyped]

EngineKind = Literal["podman", "docker"]
ENGINES: tuple[EngineKind, ...] = ("podman", "docker")
Log = Callable[[str], None]

_DIGEST_IN_STATUS = re.compile(r"digest: (sha256:[0-9a-f]{64})")
_STEP_RE = re.compile(r"^(?:Step|STEP) \d+/\d+")
_CACHE_RE = re.compile(r"Using cache")
#: A build can run pip and compile; the API call waits this long for the stream.
BUILD_TIMEOUT = 3600
#: docker-py's MINIMUM_DOCKER_API_VERSION (tests/resolving/test_engine_parsers.py checks they agree): the
#: handshake runs before docker-py is imported, and a command that builds nothing never imports it.
MINIMUM_API = "1.24"


@dataclass(frozen=True)
class BuildResult:
    """What a build produced, and how much of it came from the cache."""

    image_id: str
    steps: int
    cached: int


@dataclass
class BuildLog:
    """Turns the engine's JSON stream into whole lines, counts steps and cache hits, keeps errors."""

    log: Log
    steps: int = 0
    cached: int = 0
    errors: list[str] = field(default_factory=list)
    aux_id: str | None = None
    _partial: str = ""

    def feed(self, event: Mapping[str, Any]) -> None:
        """One decoded event of a build stream."""
        if event.get("error"):
            self.errors.append(str(event["error"]).strip())
            self.log(f"error: {str(event['error']).strip()}")
            return
        aux = event.get("aux")
        if isinstance(aux, dict) and isinstance(aux.get("ID"), str):
            self.aux_id = aux["ID"]
        text = event.get("stream")
        if not isinstance(text, str):
            return
        self._partial += text
        *lines, self._partial = self._partial.split("\n")
        for line in lines:
            self.line(line)

    def line(self, line: str) -> None:
        """One whole line of build output."""
        if _STEP_RE.match(line.strip()):
            self.steps += 1
        if _CACHE_RE.search(line):
            self.cached += 1
        self.log(line)

    def close(self) -> None:
        """Flush a last line without newline."""
        if self._partial:
            self.line(self._partial)
            self._partial = ""


def push_digest(events: Iterable[Mapping[str, Any]], log: Log) -> str | None:
    """Scan a push stream: raise on an ``error`` event, return the digest it reports (aux or status)."""
    digest = None
    for ev in events:
        if ev.get("error"):
            message = str(ev["error"]).strip()
            hint = None
            if "HTTP response to HTTPS client" in message:
                hint = (
                    "the registry speaks plain http: for Podman add it to registries.conf as "
                    '[[registry]] location = "HOST:PORT" insecure = true; for Docker add it to '
                    '"insecure-registries" in daemon.json (127.0.0.0/8 is insecure by default)'
                )
            raise AdapterError(f"push failed: {message}", hint=hint)
        aux = ev.get("aux")
        if isinstance(aux, dict) and isinstance(aux.get("Digest"), str):
            digest = aux["Digest"]
        status = ev.get("status")
        if isinstance(status, str):
            m = _DIGEST_IN_STATUS.search(status)
            if m:
                digest = m.group(1)
            if "id" not in ev:
                log(status)
    return digest


def engine_kind(version: Mapping[str, Any]) -> EngineKind:
    """Podman reports a "Podman Engine" component in ``/version``; Docker does not."""
    names = [str(c.get("Name", "")) for c in version.get("Components") or [] if isinstance(c, dict)]
    return "podman" if any("podman" in n.lower() for n in names) else "docker"


def socket_candidates(engine: EngineKind | None, env: Mapping[str, str]) -> list[str]:
    """API endpoints to try, in order. Pure: the caller checks which exist.

    Docker: ``DOCKER_HOST``, then the default socket. Podman: ``CONTAINER_HOST`` (podman's own variable),
    ``DOCKER_HOST`` (often pointed at podman), the rootless then the rootful service socket. No engine
    given: ``DOCKER_HOST``, ``CONTAINER_HOST``, podman's sockets, Docker's socket.
    """
    podman = [f"unix://{env['XDG_RUNTIME_DIR']}/podman/podman.sock"] if env.get("XDG_RUNTIME_DIR") else []
    podman.append("unix:///run/podman/podman.sock")
    docker_default = "unix:///var/run/docker.sock"
    dh, ch = env.get("DOCKER_HOST"), env.get("CONTAINER_HOST")
    if engine == "docker":
        order = [dh, docker_default]
    elif engine == "podman":
        order = [ch, dh, *podman]
    else:
        order = [dh, ch, *podman, docker_default]
    seen: list[str] = []
    for url in order:
        if url and url not in seen:
            seen.append(url)
    return seen


class Engine(Protocol):
    """What ``invoke build`` needs from a container engine."""

    kind: EngineKind
    url: str

    def build(self, context: bytes, *, tag: str, epoch: int, log: Log) -> BuildResult:
        """Build the context tar (Dockerfile at its root), tag the result."""
        ...

    def tag(self, image: str, ref: str) -> None:
        """Add a name to an image."""
        ...

    def push(self, ref: str, *, log: Log) -> str | None:
        """Push ``ref``; the registry digest as the push reports it."""
        ...

    def inspect(self, ref: str) -> dict[str, Any]:
        """The engine's image inspect data."""
        ...

    def close(self) -> None:
        """Release the connection."""
        ...


class _UnixConnection(http.client.HTTPConnection):
    def __init__(self, path: str, timeout: float) -> None:
        super().__init__("localhost", timeout=timeout)
        self.socket_path = path

    def connect(self) -> None:
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.settimeout(self.timeout)
        try:
            sock.connect(self.socket_path)
        except OSError:
            sock.close()
            raise
        self.sock = sock


class _Api:
    """Plain HTTP/1.1 to the engine's API, stdlib only, over one kept-alive connection: the handshake and
    an image inspect are all a no-op build asks, and importing docker-py cost more than both requests."""

    def __init__(self, url: str, timeout: float = 60) -> None:
        if url.startswith("unix://"):
            self.conn: http.client.HTTPConnection = _UnixConnection(url.removeprefix("unix://"), timeout)
        else:  # tcp:// or http://host:port: plain HTTP, as docker-py speaks it without TLS settings
            self.conn = http.client.HTTPConnection(url.split("://", 1)[1].rstrip("/"), timeout=timeout)

    @staticmethod
    def speaks(url: str) -> bool:
        return url.startswith(("unix://", "tcp://", "http://"))

    def get(self, path: str) -> tuple[int, http.client.HTTPMessage, bytes]:
        self.conn.request("GET", path)
        resp = self.conn.getresponse()
        return resp.status, resp.headers, resp.read()

    def close(self) -> None:
        self.conn.close()


class DockerPyEngine:
    """docker-py against a Docker daemon or Podman's API service. The handshake and image inspects go over
    the stdlib (:class:`_Api`) where the URL allows; docker-py is imported for the first build, tag or push.
    """

    def __init__(
        self,
        url: str,
        kind: EngineKind,
        version: str,
        api: _Api | None = None,
        client: docker.DockerClient | None = None,
    ) -> None:
        self.url = url
        self.kind = kind
        self.version = version
        self._api = api
        self._client = client

    @property
    def client(self) -> docker.DockerClient:
        """docker-py's client at the API version the handshake found (no second handshake)."""
        if self._client is None:
            self._client = _docker_py()[0].DockerClient(base_url=self.url, version=self.version, timeout=60)
        return self._client

    def build(self, context: bytes, *, tag: str, epoch: int, log: Log) -> BuildResult:
        """Build and stream the log live. Podman: /libpod/build with a fixed timestamp, OCI format."""
        dk, request_error = _docker_py()
        out = BuildLog(log)
        try:
            events = (
                self._podman_build(context, tag, epoch)
                if self.kind == "podman"
                else self._docker_build(context, tag)
            )
            for ev in events:
                out.feed(ev)
            out.close()
        except (dk.errors.APIError, request_error) as err:
            raise AdapterError(f"{self.kind} build via {self.url} failed: {err}") from None
        if out.errors:
            raise AdapterError(
                f"{self.kind} build failed: {out.errors[-1]}",
                hint="the build log above shows the failing step",
            )
        image_id = str(self.inspect(tag)["Id"])
        if not image_id.startswith("sha256:"):
            image_id = f"sha256:{image_id}"
        return BuildResult(image_id, out.steps, out.cached)

    def _docker_build(self, context: bytes, tag: str) -> Iterator[dict[str, Any]]:
        # Docker 20.10's classic builder via the API has no timestamp control (BuildKit needs a session
        # docker-py does not speak); the build is cached and stable in content, not bit-for-bit.
        return iter(
            self.client.api.build(
                fileobj=io.BytesIO(context),
                custom_context=True,
                tag=tag,
                rm=True,
                forcerm=True,
                pull=False,
                decode=True,
                network_mode="host",
                timeout=BUILD_TIMEOUT,
            )
        )

    def _podman_build(self, context: bytes, tag: str, epoch: int) -> Iterator[dict[str, Any]]:
        api = self.client.api
        url = f"{api.base_url}/v{api.api_version}/libpod/build"
        params = {
            "t": tag,
            "timestamp": str(epoch),
            "outputformat": "application/vnd.oci.image.manifest.v1+json",
            "layers": "true",
            "rm": "true",
            "forcerm": "true",
            "networkmode": "host",
        }
        auth = _docker_py()[0].auth
        headers = {"Content-Type": "application/x-tar"}
        creds = auth.load_config().get_all_credentials()
        if creds:
            headers["X-Registry-Config"] = auth.encode_header(creds).decode()
        resp = api.post(url, params=params, data=context, headers=headers, stream=True, timeout=BUILD_TIMEOUT)
        if resp.status_code != 200:
            raise AdapterError(f"podman build via {self.url}: HTTP {resp.status_code}: {resp.text.strip()}")
        for raw in resp.iter_lines():
            if raw.strip():
                yield json.loads(raw)

    def tag(self, image: str, ref: str) -> None:
        """Add a name (repository:tag) to an image."""
        dk, _ = _docker_py()
        repo, _, tag = ref.rpartition(":")
        try:
            self.client.api.tag(image, repo, tag, force=True)
        except dk.errors.APIError as err:
            raise AdapterError(f"{self.kind}: cannot tag {image} as {ref}: {err.explanation}") from None

    def push(self, ref: str, *, log: Log) -> str | None:
        """Push ``repository:tag``; errors in the stream raise."""
        dk, request_error = _docker_py()
        repo, _, tag = ref.rpartition(":")
        try:
            events = self.client.api.push(repo, tag=tag, stream=True, decode=True)
            return push_digest(events, log)
        except (dk.errors.APIError, request_error) as err:
            raise AdapterError(f"{self.kind}: push of {ref} failed: {err}") from None

    def inspect(self, ref: str) -> dict[str, Any]:
        """Image inspect data."""
        if self._api is None:
            return self._inspect_docker_py(ref)
        path = f"/v{self.version}/images/{urllib.parse.quote(ref, safe='/:')}/json"
        try:
            status, _, body = self._api.get(path)
        except (OSError, http.client.HTTPException) as err:
            raise AdapterError(f"{self.kind}: cannot inspect {ref}: {err}") from None
        if status == 404:
            raise AdapterError(f"{self.kind}: image {ref} not found after the build")
        try:
            data = json.loads(body)
        except ValueError:
            data = None
        if status != 200 or not isinstance(data, dict):
            said = data.get("message") if isinstance(data, dict) else body[:200].decode(errors="replace")
            raise AdapterError(f"{self.kind}: cannot inspect {ref}: HTTP {status}: {said}")
        return data

    def _inspect_docker_py(self, ref: str) -> dict[str, Any]:
        dk, _ = _docker_py()
        try:
            return dict(self.client.api.inspect_image(ref))
        except dk.errors.ImageNotFound:
            raise AdapterError(f"{self.kind}: image {ref} not found after the build") from None
        except dk.errors.APIError as err:
            raise AdapterError(f"{self.kind}: cannot inspect {ref}: {err.explanation}") from None

    def close(self) -> None:
        """Close the connections."""
        if self._api is not None:
            self._api.close()
        if self._client is not None:
            self._client.close()


class _Refused(ValueError):
    """An endpoint that answered, but not as an engine rigsmith can use (or did not answer)."""


def _older(version: str, floor: str) -> bool:
    return tuple(int(x) for x in version.split(".")) < tuple(int(x) for x in floor.split("."))


def _ping(api: _Api) -> tuple[str, EngineKind]:
    """The engine's API version and kind, from one request.

    ``DockerClient(version="auto")`` asks ``/version`` for the API version and ``client.version()`` asked
    again for the components; Podman answers ``/version`` in 0.3 s or more, ``/_ping`` in milliseconds. Both
    engines put the API version in ``/_ping``'s headers, and Podman adds ``Libpod-Api-Version``; an engine
    whose ping says less is asked ``/version`` (once).
    """
    status, headers, _ = api.get("/_ping")
    if status != 200:
        raise _Refused(f"/_ping answered HTTP {status}")
    version = headers.get("Api-Version")
    kind: EngineKind = "podman" if headers.get("Libpod-Api-Version") else "docker"
    if not version:
        status, _, body = api.get("/version")
        info = json.loads(body) if status == 200 else None
        version = info.get("ApiVersion") if isinstance(info, dict) else None
        kind = engine_kind(info if isinstance(info, dict) else {})
    if not isinstance(version, str):
        raise _Refused('no "ApiVersion"')
    if _older(version, MINIMUM_API):
        raise _Refused(f"API version {version} is below {MINIMUM_API}")
    return version, kind


@cache
def _docker_py() -> tuple[Any, type[Exception]]:
    """docker-py (``import docker`` loads its errors, auth, constants and utils) and requests' base error."""
    # At the first build, tag, push or non-stdlib handshake: 54 ms (-X importtime) a no-op build skips.
    import docker
    import requests

    return docker, requests.RequestException


def _handshake(url: str) -> tuple[docker.DockerClient, EngineKind]:
    """docker-py's own handshake, for URLs the stdlib does not speak (ssh://, TLS): as :func:`_ping`."""
    dk, _ = _docker_py()
    floor = dk.constants.MINIMUM_DOCKER_API_VERSION
    client = dk.DockerClient(base_url=url, version=floor, timeout=60)
    try:
        api = client.api
        resp = api._get(api._url("/_ping", versioned_api=False))
        api._raise_for_status(resp)
        api_version = resp.headers.get("Api-Version")
        kind: EngineKind = "podman" if resp.headers.get("Libpod-Api-Version") else "docker"
        if not api_version:
            info = client.version(api_version=False)
            api_version = info.get("ApiVersion") if isinstance(info, dict) else None
            kind = engine_kind(info if isinstance(info, dict) else {})
        if not isinstance(api_version, str):
            raise dk.errors.DockerException('Invalid response from the engine: no "ApiVersion"')
        if dk.utils.version_lt(api_version, floor):
            raise dk.errors.InvalidVersion(f"API version {api_version} is below what docker-py supports")
        api._version = api_version  # what version="auto" sets from /version's answer
        return client, kind
    except BaseException:
        client.close()
        raise


def _open(url: str) -> DockerPyEngine:
    """An engine for ``url`` after its handshake. Raises _Refused saying what went wrong."""
    if _Api.speaks(url):
        api = _Api(url)
        try:
            version, kind = _ping(api)
        except (OSError, http.client.HTTPException, ValueError) as err:
            api.close()
            raise _Refused(str(err) if isinstance(err, _Refused) else type(err).__name__) from None
        return DockerPyEngine(url, kind, version, api=api)
    dk, request_error = _docker_py()
    try:
        client, kind = _handshake(url)
    except (dk.errors.DockerException, request_error) as err:
        raise _Refused(type(err).__name__) from None
    return DockerPyEngine(url, kind, str(client.api.api_version), client=client)


def _reachable(url: str) -> bool:
    return not url.startswith("unix://") or Path(url.removeprefix("unix://")).exists()


def connect(engine: EngineKind | None, env: Mapping[str, str]) -> DockerPyEngine:
    """The first reachable API endpoint of the wanted engine (or of any engine).

    Raises:
        PreflightError: nothing reachable, or only the other engine.
    """
    tried: list[str] = []
    for url in socket_candidates(engine, env):
        if not _reachable(url):
            tried.append(f"{url} (no socket)")
            continue
        try:
            eng = _open(url)
        except _Refused as err:
            tried.append(f"{url} ({err})")
            continue
        if engine is not None and eng.kind != engine:
            tried.append(f"{url} (that is {eng.kind})")
            eng.close()
            continue
        return eng
    hint = {
        "podman": "start Podman's API service: `systemctl enable --now podman.socket` (or `podman system "
        "service --time=0 unix:///run/podman/podman.sock`), or set CONTAINER_HOST=unix://PATH",
        "docker": "start dockerd, or set DOCKER_HOST=unix://PATH to its socket",
    }
    raise PreflightError(
        f"no {engine or 'container engine'} API reachable; tried: {', '.join(tried) or 'nothing'}",
        hint=hint.get(engine or "", hint["podman"] + "; or " + hint["docker"]),
    )
