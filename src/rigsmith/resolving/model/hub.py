"""The Hub adapter: huggingface_hub behind a small interface, with retries and clear errors.

It translates, nothing more: resolve a revision, list a commit's files with their hashes, move a file's
bytes from an offset (huggingface_hub's ``http_get``) or the whole file (``xet_get``, where the Hub says
Xet). Retries (tenacity) cover transient failures only;
huggingface_hub's own exception tree decides what is transient (see research/library-facts.md §1.9:
``GatedRepoError`` is a
``RepositoryNotFoundError``, ``LocalEntryNotFoundError`` wraps the real cause, transport errors are
``httpx2`` errors and not ``OSError``).
"""

from __future__ import annotations

import importlib.util
import logging
import os
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol, TypeVar
from urllib.parse import quote, urlsplit

import httpcore2
import httpx2
from huggingface_hub import HfApi, constants
from huggingface_hub.errors import (
    DisabledRepoError,
    GatedRepoError,
    HfHubHTTPError,
    LocalEntryNotFoundError,
    OfflineModeIsEnabled,
    RemoteEntryNotFoundError,
    RepositoryNotFoundError,
    RevisionNotFoundError,
)
from huggingface_hub.file_download import get_hf_file_metadata, hf_hub_url, http_get, xet_get
from huggingface_hub.utils import XetFileData, build_hf_headers, hf_raise_for_status, http_backoff
from tenacity import (
    RetryCallState,
    Retrying,
    retry_if_exception,
    stop_after_attempt,
    wait_exponential_jitter,
)

from rigsmith.errors import AdapterError
from rigsmith.resolving.lock.lock import LockedFile
from rigsmith.resolving.model.modelfiles import Stopped, read_text_or_none, remote_files, token_from
from rigsmith.resolving.netfail import unreachable
from rigsmith.spec import SHA1_RE

log = logging.getLogger("rigsmith.hub")

DEFAULT_ENDPOINT = "https://huggingface.co"
RETRY_STATUS = frozenset({408, 429, 500, 502, 503, 504})
#: A tree listing longer than this many pages is refused (1000 entries a page: far beyond any model).
MAX_TREE_PAGES = 1000
#: Bytes asked of the socket per read on huggingface_hub's HTTP/1.1 connections (httpcore's default: 64 KiB).
#: Each read is one pass through h11 and httpx in Python: at LAN rates 1 MiB reads cut the client's CPU per
#: downloaded GiB by about a fifth (bench/bench_link.py). ``http_get`` hands the partial file each read as
#: it comes (no re-chunking: ``DOWNLOAD_CHUNK_SIZE`` None saves httpx two copies of every byte), so Ctrl-C is
#: seen, and a later run resumes, within a read of at most this many bytes.
READ_BYTES = 1 << 20
#: huggingface_hub logs every one of its own retries (two lines each); rigsmith reports its own, once.
_HF_HTTP_LOGGER = "huggingface_hub.utils._http"
T = TypeVar("T")


class Sink(Protocol):
    """Where downloaded bytes go: a binary file (or a wrapper that counts them and stops on Ctrl-C)."""

    def write(self, data: bytes, /) -> object: ...
    def tell(self) -> int: ...
    def seek(self, offset: int, whence: int = 0, /) -> int: ...
    def truncate(self, size: int | None = None, /) -> int: ...


class Hub(Protocol):
    """What fetch-model needs from a Hub."""

    endpoint: str

    def resolve(self, repo: str, revision: str) -> str:
        """The commit a branch, tag or sha names."""
        ...

    def tree(self, repo: str, commit: str) -> dict[str, LockedFile]:
        """Every file of the repo at ``commit`` by path, with size and hash."""
        ...

    def download(self, repo: str, commit: str, path: str, out: Sink, *, offset: int, size: int) -> None:
        """Write the file's bytes from ``offset`` to ``out`` (which is positioned at ``offset``).

        A sink with a ``stop`` attribute (a ``threading.Event``, set on Ctrl-C) also ends the retry
        backoff early: the sink itself refuses further bytes once it is set.
        """
        ...

    # An adapter may also have ``xet_file`` and ``download_xet`` (HfHub has): then files the Hub keeps on
    # Xet go through hf_xet. An offline one (unbundle's) has neither.


def is_retryable(exc: BaseException) -> bool:
    """Transient (worth another attempt) vs final: the §1.9 classification, order matters."""
    if isinstance(
        exc,
        RepositoryNotFoundError | RevisionNotFoundError | RemoteEntryNotFoundError | DisabledRepoError,
    ):
        return False  # includes GatedRepoError
    if isinstance(exc, OfflineModeIsEnabled):
        return False
    if isinstance(exc, HfHubHTTPError):
        return exc.response is not None and exc.response.status_code in RETRY_STATUS
    if isinstance(exc, httpx2.ProxyError) or unreachable(exc):
        return False
    if isinstance(exc, httpx2.TransportError):
        return True
    if isinstance(exc, LocalEntryNotFoundError):
        return exc.__cause__ is not None and is_retryable(exc.__cause__)
    return isinstance(exc, ShortBody)


class ShortBody(OSError):
    """The server sent a body of another size than the one the lock records (transient: ask again)."""


@dataclass(frozen=True)
class RetryPolicy:
    """How hard to retry a transient failure (each attempt already has huggingface_hub's own retries)."""

    attempts: int = 4
    multiplier: float = 2.0
    max_wait: float = 60.0
    jitter: float = 2.0

    def retrying(self, what: str, sleep: Callable[[float], None] | None = None) -> Retrying:
        def note(state: RetryCallState) -> None:
            exc = state.outcome.exception() if state.outcome else None
            wait = state.next_action.sleep if state.next_action else 0.0
            log.warning(
                "%s: %s: %s; retrying in %.1fs (attempt %d of %d)",
                what,
                type(exc).__name__,
                exc,
                wait,
                state.attempt_number + 1,
                self.attempts,
            )

        return Retrying(
            stop=stop_after_attempt(self.attempts),
            wait=wait_exponential_jitter(multiplier=self.multiplier, max=self.max_wait, jitter=self.jitter),
            retry=retry_if_exception(is_retryable),
            before_sleep=note,
            reraise=True,
            sleep=sleep or time.sleep,
        )


class HfHub:
    """The real Hub (or any Hub-compatible endpoint) through huggingface_hub."""

    def __init__(self, endpoint: str, token: str | None, retry: RetryPolicy | None = None) -> None:
        self.endpoint = endpoint.rstrip("/")
        self._token = token
        self._retry = retry or RetryPolicy()
        self._api = HfApi(endpoint=self.endpoint, token=token if token else False, library_name="rigsmith")
        logging.getLogger(_HF_HTTP_LOGGER).setLevel(logging.ERROR)
        setattr(constants, "DOWNLOAD_CHUNK_SIZE", None)  # noqa: B010 (typed int; None means as read)
        if getattr(httpcore2.HTTP11Connection, "READ_NUM_BYTES", 0) < READ_BYTES:
            httpcore2.HTTP11Connection.READ_NUM_BYTES = READ_BYTES  # a class setting: no per-client knob

    @classmethod
    def from_env(cls, env: Mapping[str, str] = os.environ, retry: RetryPolicy | None = None) -> HfHub:
        """Endpoint from HF_ENDPOINT, token from HF_TOKEN or the token file (read now, not at import)."""
        return cls(env.get("HF_ENDPOINT") or DEFAULT_ENDPOINT, token_from(env, read_text_or_none), retry)

    def __repr__(self) -> str:  # never show the token
        return f"HfHub({self.endpoint!r}, token={'set' if self._token else 'none'})"

    def _call(
        self,
        what: str,
        repo: str,
        fn: Callable[[], T],
        *,
        revision: str | None = None,
        sleep: Callable[[float], None] | None = None,
    ) -> T:
        try:
            for attempt in self._retry.retrying(
                f"{what} {repo}" + (f"@{revision}" if revision else ""), sleep
            ):
                with attempt:
                    return fn()
        except Exception as err:
            raise self._translate(err, what, repo, revision) from None
        raise AssertionError("unreachable")  # pragma: no cover

    def resolve(self, repo: str, revision: str) -> str:
        if SHA1_RE.fullmatch(revision):
            return revision
        info = self._call(
            "resolve revision", repo, lambda: self._api.model_info(repo, revision=revision), revision=revision
        )
        if not info.sha or not SHA1_RE.fullmatch(info.sha):
            raise AdapterError(f"{self.endpoint} answered {repo}@{revision} without a commit sha")
        return info.sha

    def tree(self, repo: str, commit: str) -> dict[str, LockedFile]:
        entries = self._call("list files", repo, lambda: self._tree_entries(repo, commit), revision=commit)
        return remote_files(entries, f"{self.endpoint} (tree of {repo}@{commit})")

    def _tree_entries(self, repo: str, commit: str) -> list[object]:
        """The raw recursive tree listing, every page (``HfApi.list_repo_tree`` without its own retries:
        its ``http_backoff`` retries a refused connection 5 times inside each of ours)."""
        url: str | None = f"{self.endpoint}/api/models/{repo}/tree/{quote(commit, safe='')}"
        params: dict[str, str] | None = {"recursive": "true", "expand": "false"}
        headers = build_hf_headers(token=self._token if self._token else False, library_name="rigsmith")
        out: list[object] = []
        for _page in range(MAX_TREE_PAGES):
            if url is None:
                return out
            resp = http_backoff(
                "GET", url, params=params, headers=headers, retry_on_exceptions=(), retry_on_status_codes=()
            )
            hf_raise_for_status(resp)
            try:
                page = resp.json()
            except ValueError:
                raise AdapterError(
                    f"{self.endpoint} answered the file list of {repo}@{commit} with something that is not "
                    "JSON",
                    hint="check HF_ENDPOINT: it must be a Hugging Face Hub (or a mirror of its API)",
                ) from None
            if not isinstance(page, list):
                raise AdapterError(
                    f"{self.endpoint} answered the file list of {repo}@{commit} with a JSON "
                    f"{type(page).__name__}, not a list",
                    hint="check HF_ENDPOINT: it must be a Hugging Face Hub (or a mirror of its API)",
                )
            out.extend(page)
            nxt = resp.links.get("next", {}).get("url")
            url, params = (str(nxt) if nxt else None), None
            if url is not None and origin(url) != origin(self.endpoint):
                # The token goes with every page: never to a host the user did not name.
                raise AdapterError(
                    f"{self.endpoint} sent the next page of the file list of {repo}@{commit} to another "
                    f"host ({origin(url)}); not following it",
                    hint="check HF_ENDPOINT: a Hub pages within its own address",
                )
        raise AdapterError(
            f"{self.endpoint}: the file list of {repo}@{commit} runs past {MAX_TREE_PAGES} pages",
            hint="check HF_ENDPOINT: a Hub pages 1000 files at a time",
        )

    def download(self, repo: str, commit: str, path: str, out: Sink, *, offset: int, size: int) -> None:
        url = hf_hub_url(repo, path, revision=commit, endpoint=self.endpoint)
        stop = getattr(out, "stop", None)
        if not isinstance(stop, threading.Event):
            stop = None
        headers = build_hf_headers(token=self._token if self._token else False, library_name="rigsmith")
        if out.tell() != offset:
            raise ValueError("out must be positioned at offset")
        bar: Any = _NoBar  # rigsmith shows its own progress (the sink counts the bytes)
        sink: Any = out  # http_get asks for a BinaryIO; it calls write, tell, seek and truncate

        def once() -> None:
            # http_get resumes by itself after a dropped connection (up to 5 times, its budget reset by
            # progress); other failures go to the retry policy, which resumes from what was written.
            have = out.tell()
            try:
                http_get(url, sink, resume_size=have, headers=headers, expected_size=size, tqdm_class=bar)
            except OSError as err:
                if isinstance(err, HfHubHTTPError) or err.errno is not None:
                    raise  # an HTTP error, or the disk (full, unwritable)
                # huggingface_hub's own size check: the body ran short or long. Start the file over.
                out.seek(0)
                out.truncate()
                raise ShortBody(f"the body of {path} was not {size} bytes") from err

        def sleep(seconds: float) -> None:
            # A Ctrl-C must not wait out a backoff of up to a minute.
            if stop is None:
                time.sleep(seconds)
            elif stop.wait(seconds):
                raise Stopped("stopped while waiting to retry")

        self._call("download", repo, once, revision=f"{commit}/{path}", sleep=sleep)

    def xet_file(self, repo: str, commit: str, path: str) -> XetFileData | None:
        """Where the Hub keeps the file on Xet (its ``HEAD`` answer), or None: not on Xet, or hf_xet is
        not installed or turned off (``HF_HUB_DISABLE_XET``); then no request is made."""
        if not xet_available():
            return None
        url = hf_hub_url(repo, path, revision=commit, endpoint=self.endpoint)
        token = self._token if self._token else False
        meta = self._call(
            "look up",
            repo,
            lambda: get_hf_file_metadata(url, token=token, endpoint=self.endpoint, library_name="rigsmith"),
            revision=f"{commit}/{path}",
        )
        return meta.xet_file_data

    def download_xet(
        self, repo: str, commit: str, path: str, dest: Path, size: int, xet: XetFileData
    ) -> None:
        """The whole file into ``dest`` through hf_xet (huggingface_hub's ``xet_get``: chunks in parallel,
        deduplicated against its chunk cache, which is also what a re-run after an interruption reuses)."""
        headers = build_hf_headers(token=self._token if self._token else False, library_name="rigsmith")
        self._call(
            "download",
            repo,
            lambda: xet_get(
                incomplete_path=dest,
                xet_file_data=xet,
                headers=headers,
                expected_size=size,
                displayed_filename=path,
            ),
            revision=f"{commit}/{path}",
        )

    def _translate(self, err: Exception, what: str, repo: str, revision: str | None) -> AdapterError:
        where = f"{repo}@{revision}" if revision else repo
        status = getattr(getattr(err, "response", None), "status_code", None)
        if isinstance(err, GatedRepoError):
            return AdapterError(
                f"{what}: {repo} is a gated repo and this token has no access (HTTP {status})",
                hint=f"accept the terms at {self.endpoint}/{repo}, then set HF_TOKEN (or `hf auth login`)",
            )
        if isinstance(err, RepositoryNotFoundError):
            auth = "with the token from HF_TOKEN/token file" if self._token else "without a token"
            return AdapterError(
                f"{what}: repo {repo} not found at {self.endpoint} ({auth}, HTTP {status})",
                hint="check model.repo in the spec; a private repo needs HF_TOKEN with read access",
            )
        if isinstance(err, RevisionNotFoundError):
            return AdapterError(
                f"{what}: revision {revision!r} not found in {repo}",
                hint="check model.revision in the spec (a branch, a tag or a 40-hex commit)",
            )
        if isinstance(err, RemoteEntryNotFoundError):
            return AdapterError(
                f"{what}: {where} not found on the Hub", hint="re-pin with `invoke pin --repin`"
            )
        if isinstance(err, OfflineModeIsEnabled):
            return AdapterError(
                f"{what}: {where}: HF_HUB_OFFLINE is set", hint="unset HF_HUB_OFFLINE to download"
            )
        if isinstance(err, HfHubHTTPError):
            return AdapterError(
                f"{what}: {where}: HTTP {status} from {self.endpoint}",
                hint="retry later; the Hub may be down",
            )
        if isinstance(err, httpx2.TransportError | LocalEntryNotFoundError | OSError):
            return AdapterError(
                f"{what}: {where}: cannot reach {self.endpoint} (HF_ENDPOINT): {type(err).__name__}: {err}",
                hint="check the network and HF_ENDPOINT; a re-run resumes where this one stopped. Offline, "
                "HF_HUB_OFFLINE=1 works once the lock pins the model and its local dir is complete",
            )
        return AdapterError(f"{what}: {where}: {type(err).__name__}: {err}")


def xet_available() -> bool:
    """Whether huggingface_hub would download through hf_xet: installed and not turned off by
    ``HF_HUB_DISABLE_XET``. (huggingface_hub's own test, ``is_xet_available``, has no public name.)"""
    return not constants.HF_HUB_DISABLE_XET and importlib.util.find_spec("hf_xet") is not None


def origin(url: str) -> str:
    """scheme://host:port of a URL, the port made explicit."""
    parts = urlsplit(url)
    port = parts.port or {"http": 80, "https": 443}.get(parts.scheme, 0)
    return f"{parts.scheme}://{(parts.hostname or '').lower()}:{port}"


class _NoBar:
    """``http_get``'s progress bar, silenced."""

    def __init__(self, **_kw: Any) -> None:
        pass

    def __enter__(self) -> _NoBar:
        return self

    def __exit__(self, *exc: object) -> None:
        pass

    def update(self, _n: int) -> None:
        pass
