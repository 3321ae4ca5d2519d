"""One byte range of a file over HTTP(S), read straight into a buffer and handed on by position.

fetch-model's fast path for large files (:mod:`rigsmith.resolving.parts`). huggingface_hub's HTTP stack
(httpx2 over h11, in Python) copies every block three times on its way out of the socket; at loopback or
LAN rates the client's CPU, not the wire, is then the limit (bench/bench_fetch.py). Here the standard
library's ``http.client`` reads the body with ``readinto`` into one preallocated buffer per connection (the
socket's bytes land there directly), and the caller writes them at their offset (``os.pwrite``).

What it does not do, on purpose: anything but a ``206`` with exactly the range asked for is
:class:`NotRanged`, and the caller downloads the file through huggingface_hub instead (which maps every
HTTP error to a clear message and honours proxies). A proxy configured for the URL is also
:class:`NotRanged`: this module talks only directly to the server.
"""

from __future__ import annotations

import http.client
import re
import ssl
import threading
import urllib.request
from collections.abc import Callable, Mapping
from urllib.parse import urljoin, urlsplit

from rigsmith.resolving.modelfiles import Stopped

#: Bytes asked of the socket at a time (one ``readinto``), and the size of each connection's buffer. Small
#: enough to stay in the CPU cache between its three passes (read in, written out, hashed): 8 MiB buffers
#: made the download 1.5-2x slower on a 2-core VM, 256 KiB ones too (per-block overhead), bench_fetch.
BUFFER = 1 << 20
#: Redirects followed (the Hub sends LFS and Xet-backed files to a CDN with one).
MAX_REDIRECTS = 5
_CONTENT_RANGE = re.compile(r"bytes (\d+)-(\d+)/(\d+|\*)")

#: ``write(offset, block)``: the block's bytes belong at ``offset`` of the file; returns nothing.
Write = Callable[[int, memoryview], None]


class NotRanged(Exception):
    """The server did not answer the range as asked (or a proxy is in the way): use the plain route."""


class ShortRange(OSError):
    """The connection ended inside the range (transient: ask again for what is missing)."""


class RangeGetter:
    """GETs byte ranges, keeping one keep-alive connection (and buffer) per thread and origin.

    Args:
        headers: sent with every request to the first URL's origin (``Authorization`` is dropped when a
            redirect leads to another origin).
        timeout: seconds a connect or a read may take.
    """

    def __init__(self, headers: Mapping[str, str], timeout: float) -> None:
        self._headers = dict(headers)
        self._timeout = timeout
        self._local = threading.local()
        self._final: dict[str, str] = {}  # resolve URL -> where its redirects led (signed CDN URLs)
        self._mu = threading.Lock()
        self._ssl: ssl.SSLContext | None = None

    def get(self, url: str, start: int, end: int, size: int, write: Write, stop: threading.Event) -> int:
        """Write bytes ``start``..``end`` (exclusive) of the ``size``-byte file at ``url``; the bytes written.

        Raises:
            NotRanged: any answer but a 206 for exactly this range of a file of ``size`` bytes.
            ShortRange: the body ended early (what arrived was written; ask again from the end of it).
            OSError, http.client.HTTPException: transport failures.
        """
        with self._mu:
            target = self._final.get(url, url)
        for _hop in range(MAX_REDIRECTS + 1):
            headers = dict(self._headers) if origin(target) == origin(url) else _public(self._headers)
            headers["Range"] = f"bytes={start}-{end - 1}"
            conn = self._conn(target)
            parts = urlsplit(target)
            try:
                conn.request("GET", parts.path + (f"?{parts.query}" if parts.query else ""), headers=headers)
                resp = conn.getresponse()
            except BaseException:
                self._drop(target)
                raise
            if resp.status in (301, 302, 303, 307, 308) and resp.getheader("Location"):
                resp.read()  # small: keeps the connection usable
                target = urljoin(target, resp.getheader("Location", ""))
                continue
            if resp.status != 206 or not _exact(resp.getheader("Content-Range", ""), start, end, size):
                self._drop(target)  # the body is not read: the connection cannot be reused
                raise NotRanged(f"HTTP {resp.status} (Content-Range {resp.getheader('Content-Range')!r})")
            with self._mu:
                self._final[url] = target
            return self._body(target, resp, start, end, write, stop)
        raise NotRanged(f"more than {MAX_REDIRECTS} redirects")

    def _body(
        self,
        target: str,
        resp: http.client.HTTPResponse,
        start: int,
        end: int,
        write: Write,
        stop: threading.Event,
    ) -> int:
        buf: memoryview = self._local.__dict__.setdefault("buf", memoryview(bytearray(BUFFER)))
        pos = start
        try:
            while pos < end:
                if stop.is_set():
                    raise Stopped("stopped")
                n = resp.readinto(buf[: min(BUFFER, end - pos)])
                if not n:
                    raise ShortRange(f"the body ended at byte {pos} of {start}-{end - 1}")
                write(pos, buf[:n])
                pos += n
        except BaseException:
            self._drop(target)
            raise
        return pos - start

    def _conn(self, url: str) -> http.client.HTTPConnection:
        if _proxied(url):
            raise NotRanged("a proxy is configured for this URL")
        conns: dict[str, http.client.HTTPConnection] = self._local.__dict__.setdefault("conns", {})
        key = origin(url)
        if key not in conns:
            parts = urlsplit(url)
            if parts.scheme == "https":
                if self._ssl is None:
                    self._ssl = ssl.create_default_context()
                conns[key] = http.client.HTTPSConnection(
                    parts.hostname or "", parts.port, timeout=self._timeout, context=self._ssl
                )
            elif parts.scheme == "http":
                conns[key] = http.client.HTTPConnection(
                    parts.hostname or "", parts.port, timeout=self._timeout
                )
            else:
                raise NotRanged(f"scheme {parts.scheme!r}")
        return conns[key]

    def _drop(self, url: str) -> None:
        conn = self._local.__dict__.get("conns", {}).pop(origin(url), None)
        if conn is not None:
            conn.close()

    def close(self) -> None:
        """Close this thread's connections (each thread's are closed when the thread ends, too)."""
        for conn in self._local.__dict__.pop("conns", {}).values():
            conn.close()


def _exact(content_range: str, start: int, end: int, size: int) -> bool:
    m = _CONTENT_RANGE.fullmatch(content_range.strip())
    return (
        m is not None
        and int(m.group(1)) == start
        and int(m.group(2)) == end - 1
        and m.group(3) in ("*", str(size))
    )


def _public(headers: Mapping[str, str]) -> dict[str, str]:
    """Headers safe to send to another host: no credentials."""
    return {k: v for k, v in headers.items() if k.lower() not in ("authorization", "cookie")}


def origin(url: str) -> str:
    """scheme://host:port of a URL, the port made explicit."""
    parts = urlsplit(url)
    port = parts.port or {"http": 80, "https": 443}.get(parts.scheme, 0)
    return f"{parts.scheme}://{(parts.hostname or '').lower()}:{port}"


def _proxied(url: str) -> bool:
    parts = urlsplit(url)
    proxies = urllib.request.getproxies()
    return parts.scheme in proxies and not urllib.request.proxy_bypass(parts.hostname or "")
