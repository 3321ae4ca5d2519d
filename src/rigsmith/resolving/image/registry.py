"""Registry adapter: an image tag → its manifest digest, over the registry HTTP API (OCI distribution).

Pure parts (auth challenge parsing, docker-config lookup) are functions; reference parsing lives in
:mod:`rigsmith.imageref` (pure, re-used here). The network part is :class:`Registry`, a thin
httpx client. Facts it relies on (shared/research/library-facts.md §3.5): without an ``Accept`` listing
all four manifest types, registry 2.8 answers with a converted schema-1 manifest and a *different*
digest, and an OCI index is a 404 unless its type is accepted.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import json
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import httpx
from tenacity import Retrying, retry_if_exception, stop_after_attempt, wait_exponential_jitter

from rigsmith.errors import AdapterError, RigsmithError
from rigsmith.imageref import (
    DIGEST_RE,
    DOCKER_HUB,
    DOCKER_HUB_API,
    DOCKER_LIST,
    DOCKER_MANIFEST,
    OCI_INDEX,
    OCI_MANIFEST,
    ImageRef,
    parse_ref,
)
from rigsmith.resolving.netfail import unreachable

#: Every manifest kind we accept, most specific (multi-platform) first.
MANIFEST_TYPES = (OCI_INDEX, DOCKER_LIST, OCI_MANIFEST, DOCKER_MANIFEST)

#: The key `docker login` writes into config.json for the Hub.
DOCKER_HUB_AUTH_KEY = "https://index.docker.io/v1/"


def parse_challenge(header: str) -> tuple[str, dict[str, str]]:
    """``WWW-Authenticate: Bearer realm="…",service="…",scope="…"`` → ("bearer", {realm: …, …})."""
    scheme, _, params = header.strip().partition(" ")
    found = dict(re.findall(r'(\w+)="([^"]*)"', params))
    for k, v in re.findall(r'(\w+)=([^",\s]+)', params):
        found.setdefault(k, v)
    return scheme.lower(), found


def _auth_key(key: str) -> str:
    host = re.sub(r"^https?://", "", key).split("/", 1)[0]
    return DOCKER_HUB if host in ("index.docker.io", DOCKER_HUB_API, DOCKER_HUB) else host


def credentials_for(config: Mapping[str, Any], registry: str) -> tuple[str, str] | None:
    """(user, password) for ``registry`` from a docker ``config.json`` ``auths`` table, if present.

    Keys may be bare hosts or URLs (``https://index.docker.io/v1/`` for the Hub); values carry
    ``auth`` (base64 of ``user:password``) or ``username``/``password``. Credential helpers
    (``credsStore``/``credHelpers``) are not consulted.
    """
    auths = config.get("auths") or {}
    want = _auth_key(registry)
    for key, entry in auths.items():
        if _auth_key(key) != want or not isinstance(entry, dict):
            continue
        if entry.get("auth"):
            try:
                user, _, password = base64.b64decode(entry["auth"], validate=True).decode().partition(":")
            except (binascii.Error, UnicodeDecodeError):
                raise RigsmithError(
                    f"docker config: the auth entry for {key!r} is not base64 of user:password",
                    hint="re-run `docker login` (or `podman login --authfile ~/.docker/config.json`)",
                ) from None
            return user, password
        if entry.get("username"):
            return str(entry["username"]), str(entry.get("password", ""))
    return None


def docker_config_path(env: Mapping[str, str]) -> Path:
    """``$DOCKER_CONFIG/config.json``, else ``~/.docker/config.json``."""
    base = env.get("DOCKER_CONFIG")
    if base:
        return Path(base) / "config.json"
    return Path(env.get("HOME", "~")).expanduser() / ".docker" / "config.json"


def load_docker_config(env: Mapping[str, str] | None = None) -> dict[str, Any]:
    """The docker client config (empty if there is none)."""
    path = docker_config_path(os.environ if env is None else env)
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        return {}
    except (OSError, ValueError) as err:
        raise RigsmithError(f"cannot read {path}: {err}", hint="fix or remove the file") from None
    return data if isinstance(data, dict) else {}


@dataclass(frozen=True)
class Resolved:
    """A manifest as the registry names it."""

    digest: str
    media_type: str | None


class Resolver(Protocol):
    """What pin and build need from a registry."""

    def resolve(self, ref: str) -> Resolved:
        """The digest ``ref`` points at now."""
        ...


class _Transient(Exception):
    """A registry answer worth retrying (5xx, 429)."""


def _transient(exc: BaseException) -> bool:
    """Worth another try: a 5xx/429, or a transport error other than "no route" (refused, DNS)."""
    return isinstance(exc, _Transient) or (isinstance(exc, httpx.TransportError) and not unreachable(exc))


class Registry:
    """Registry HTTP API v2 client: manifest HEAD/GET, anonymous or basic → bearer token flow."""

    def __init__(
        self,
        config: Mapping[str, Any] | None = None,
        *,
        client: httpx.Client | None = None,
        timeout: float = 30.0,
        attempts: int = 4,
        backoff: float = 0.5,
    ) -> None:
        """A client; credentials come from ``config``, never from the environment directly.

        Args:
            config: docker ``config.json`` content (for ``auths``).
            client: an httpx client to use (default: a new one with ``timeout``).
            timeout: seconds per HTTP request.
            attempts: tries per request on transient failures (resets, timeouts, 429, 5xx; not a refused
                connection or a name that does not resolve).
            backoff: first wait between tries in seconds; doubles, with jitter, up to 8 s.
        """
        self._config = config if config is not None else {}
        self._client = client or httpx.Client(timeout=timeout, follow_redirects=True)
        self._tokens: dict[tuple[str, str], str] = {}
        self._retrying = Retrying(
            retry=retry_if_exception(_transient),
            stop=stop_after_attempt(attempts),
            wait=wait_exponential_jitter(multiplier=backoff, max=8, jitter=backoff),
            reraise=True,
        )

    def close(self) -> None:
        """Close the HTTP client."""
        self._client.close()

    def resolve(self, ref: str) -> Resolved:
        """HEAD the manifest (GET when the digest header is missing) and return its digest.

        Raises:
            AdapterError: not found, not authorized, or the registry cannot be reached.
        """
        parsed = parse_ref(ref)
        url = f"{parsed.scheme}://{parsed.api_host}/v2/{parsed.repository}/manifests/{parsed.reference}"
        try:
            resp = self._request("HEAD", url, parsed)
            if resp.status_code == 200 and resp.headers.get("Docker-Content-Digest"):
                return Resolved(_digest(resp, parsed, ref), _media_type(resp))
            if resp.status_code in (200, 405):
                resp = self._request("GET", url, parsed)
                if resp.status_code == 200:
                    _check_manifest(resp, parsed, ref)
                    digest = (
                        _digest(resp, parsed, ref)
                        if resp.headers.get("Docker-Content-Digest")
                        else "sha256:" + hashlib.sha256(resp.content).hexdigest()
                    )
                    return Resolved(digest, _media_type(resp))
        except (httpx.HTTPError, httpx.InvalidURL, _Transient) as err:
            raise AdapterError(
                f"registry {parsed.api_host}: cannot resolve {ref}: {err}",
                hint="check that the registry is reachable and the name is right",
            ) from None
        if resp.status_code == 404:
            raise AdapterError(
                f"registry {parsed.api_host}: {ref} not found (no such repository or tag)",
                hint="check the tag exists (or was pushed); tags are case-sensitive",
            )
        if resp.status_code in (401, 403):
            raise AdapterError(
                f"registry {parsed.api_host}: not authorized to read {parsed.repository}",
                hint=f"log in (`docker login {parsed.registry}`) so ~/.docker/config.json or "
                "$DOCKER_CONFIG/config.json holds credentials for it",
            )
        raise AdapterError(f"registry {parsed.api_host}: {ref}: unexpected HTTP {resp.status_code}")

    def _request(self, method: str, url: str, ref: ImageRef) -> httpx.Response:
        return self._retrying(self._request_once, method, url, ref)

    def _request_once(self, method: str, url: str, ref: ImageRef) -> httpx.Response:
        headers = {"Accept": ", ".join(MANIFEST_TYPES)}
        key = (ref.api_host, ref.repository)
        if key in self._tokens:
            headers["Authorization"] = self._tokens[key]
        resp = self._client.request(method, url, headers=headers)
        if resp.status_code == 401 and key not in self._tokens:
            auth = self._authorize(resp.headers.get("WWW-Authenticate", ""), ref)
            if auth:
                self._tokens[key] = auth
                headers["Authorization"] = auth
                resp = self._client.request(method, url, headers=headers)
        if resp.status_code == 429 or resp.status_code >= 500:
            raise _Transient(f"HTTP {resp.status_code}")
        return resp

    def _authorize(self, challenge: str, ref: ImageRef) -> str | None:
        scheme, params = parse_challenge(challenge)
        creds = credentials_for(self._config, ref.registry)
        if scheme == "basic":
            if creds is None:
                return None
            return "Basic " + base64.b64encode(f"{creds[0]}:{creds[1]}".encode()).decode()
        if scheme != "bearer" or "realm" not in params:
            return None
        if not params["realm"].startswith(("https://", "http://")):
            raise AdapterError(
                f"registry {ref.api_host}: its token endpoint (realm) is not an http(s) URL: "
                f"{params['realm'][:100]!r}",
                hint="check the registry name; a registry's WWW-Authenticate realm is an https URL",
            )
        query = {"scope": params.get("scope") or f"repository:{ref.repository}:pull"}
        if params.get("service"):
            query["service"] = params["service"]
        resp = self._client.get(params["realm"], params=query, auth=creds)
        if resp.status_code == 429 or resp.status_code >= 500:
            raise _Transient(f"token endpoint: HTTP {resp.status_code}")
        if resp.status_code != 200:
            return None
        try:
            body = resp.json()
        except ValueError:
            body = None
        token = (body.get("token") or body.get("access_token")) if isinstance(body, dict) else None
        if not isinstance(token, str) or not token or not token.isascii() or not token.isprintable():
            raise AdapterError(
                f"registry {ref.api_host}: its token endpoint {params['realm'][:100]} did not answer with a "
                "JSON object holding a token (HTTP 200, "
                f"{_media_type(resp) or 'no Content-Type'}, {len(resp.content)} bytes)",
                hint="check the registry name and that it speaks the registry v2 token protocol",
            )
        return f"Bearer {token}"


def _digest(resp: httpx.Response, ref: ImageRef, text: str) -> str:
    """The Docker-Content-Digest header, refused unless it is ``sha256:<64 hex>`` (it goes into the lock
    and from there into every artifact)."""
    digest = str(resp.headers.get("Docker-Content-Digest", ""))
    if not DIGEST_RE.match(digest):
        raise AdapterError(
            f"registry {ref.api_host}: answered {text} with a digest that is not sha256:<64 hex>: "
            f"{digest[:80]!r}",
            hint="check the registry name; a registry answers Docker-Content-Digest: sha256:…",
        )
    return digest


def _check_manifest(resp: httpx.Response, ref: ImageRef, text: str) -> None:
    """A manifest body is a JSON object with a schemaVersion; anything else is not a registry talking."""
    try:
        body = json.loads(resp.content)
    except ValueError:
        body = None
    if not isinstance(body, dict) or not isinstance(body.get("schemaVersion"), int):
        raise AdapterError(
            f"registry {ref.api_host}: answered {text} with something that is not an image manifest "
            f"({_media_type(resp) or 'no Content-Type'}, {len(resp.content)} bytes)",
            hint="check the registry name and that it speaks the registry v2 API",
        )


def _media_type(resp: httpx.Response) -> str | None:
    ctype = resp.headers.get("Content-Type")
    return ctype.split(";", 1)[0].strip() if ctype else None
