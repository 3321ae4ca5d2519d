"""How a model's files reach the disk: huggingface_hub moves the bytes (hf_xet where the Hub keeps a large
file on Xet, its ``http_get`` otherwise, resuming from the partial file), one hash pass checks them against
the lock, and only then does the file take its real path. :mod:`rigsmith.resolving.modelfetch` decides
what to fetch.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import IO, Any

from rigsmith.errors import AdapterError, RigsmithError
from rigsmith.resolving.modelfiles import PARTIAL_DIR, STATE_DIR, HashMismatch, Stopped, Want, hash_file
from rigsmith.resolving.transfer import FetchContext, run_all

#: A file that hashes wrong after download is fetched once more before it is refused.
MISMATCH_ATTEMPTS = 2
#: Files this large or larger are the ones the Hub may keep on Xet: the first of them asks (one HEAD).
XET_MIN = 64 << 20


class PartialFile:
    """The partial file as huggingface_hub writes into it: each block counted, refused once ``stop`` is set
    (Ctrl-C; the bytes so far stay for the next run to resume from)."""

    def __init__(self, fh: IO[bytes], on_bytes: Callable[[int], None], stop: threading.Event) -> None:
        self._fh = fh
        self.on_bytes = on_bytes
        self.stop = stop  # read by the Hub adapter too: a set stop also cuts a retry backoff short
        self.written = 0

    def write(self, data: bytes) -> int:
        if self.stop.is_set():
            raise Stopped("stopped")
        n = self._fh.write(data)
        self.written += n
        self.on_bytes(n)
        return n

    def tell(self) -> int:
        return self._fh.tell()

    def seek(self, offset: int, whence: int = 0) -> int:
        before = self._fh.tell()
        pos = self._fh.seek(offset, whence)
        self.on_bytes(pos - before)  # a server ignoring Range: the file starts over
        return pos

    def truncate(self, size: int | None = None) -> int:
        return self._fh.truncate(size)

    def flush(self) -> None:
        self._fh.flush()


def _download(ctx: FetchContext, w: Want) -> None:
    """Download one file into its partial (resuming one left earlier), hash it, move it into place.

    A file that hashes wrong is fetched once more before it is refused."""
    part = ctx.inside(f"{STATE_DIR}/{PARTIAL_DIR}/{w.partial_name}")
    part.parent.mkdir(parents=True, exist_ok=True)
    task = ctx.progress.add_task(w.repo_path, total=w.size) if ctx.progress is not None else None

    def on_bytes(n: int) -> None:
        ctx.advance(n)
        if task is not None and ctx.progress is not None:
            ctx.progress.advance(task, n)

    try:
        for attempt in range(1, MISMATCH_ATTEMPTS + 1):
            written = _fetch_xet(ctx, w, part, on_bytes) or _fetch(ctx, w, part, on_bytes)
            with ctx.mu:
                ctx.report.downloaded_bytes += written
            got = part.stat().st_size
            digest = hash_file(part, w.kind, w.size, ctx.stop)
            if got == w.size and digest == w.digest:
                _fsync(part)  # durable before the rename: the record will vouch for these bytes unhashed
                break
            part.unlink()
            on_bytes(-got)
            if attempt == MISMATCH_ATTEMPTS:
                raise HashMismatch(
                    f"{w.repo_path}: the Hub sent bytes that do not match the lock "
                    f"({w.kind} {digest} != {w.digest}, {got} of {w.size} bytes); the file was discarded",
                    hint="re-run later; if it persists, the mirror/endpoint is serving corrupt data "
                    "(or the repo was force-pushed: `invoke pin --repin`)",
                )
        final = ctx.inside(w.disk_path)
        final.parent.mkdir(parents=True, exist_ok=True)
        part.replace(final)
        ctx.record(w.disk_path, w.kind, w.digest)
        with ctx.mu:
            ctx.report.downloaded.append(w.repo_path)
    finally:
        if task is not None and ctx.progress is not None:
            ctx.progress.remove_task(task)


def _fetch_xet(ctx: FetchContext, w: Want, part: Path, on_bytes: Callable[[int], None]) -> int | None:
    """Bytes downloaded of a large file the Hub keeps on Xet, fetched whole by hf_xet (its chunk cache, not
    the partial, is what a second try reuses); None when the file is not on Xet (or hf_xet is off, or the
    adapter has no Xet route), asked for the first large file only."""
    xet_hub: Any = ctx.get_hub()
    if ctx.no_xet or w.size < XET_MIN or not hasattr(xet_hub, "xet_file"):
        return None
    xet = xet_hub.xet_file(ctx.entry.repo, ctx.entry.commit, w.repo_path)
    if xet is None:
        ctx.no_xet = True  # a Hub either keeps a snapshot's large files on Xet or not: one HEAD is enough
        return None
    part.unlink(missing_ok=True)
    xet_hub.download_xet(ctx.entry.repo, ctx.entry.commit, w.repo_path, part, w.size, xet)
    on_bytes(w.size)
    return w.size


def _fetch(ctx: FetchContext, w: Want, part: Path, on_bytes: Callable[[int], None]) -> int:
    """Bytes downloaded into ``part`` for ``w`` by huggingface_hub's ``http_get``, from where the partial
    ends (a range request); the caller hashes the file."""
    have = part.stat().st_size if part.exists() else 0
    if have > w.size:
        part.unlink()
        have = 0
    if have:
        on_bytes(have)
        with ctx.mu:
            ctx.report.resumed_bytes += have
    with part.open("r+b" if have else "wb") as fh:
        fh.seek(have)
        out = PartialFile(fh, on_bytes, ctx.stop)
        if have < w.size:
            ctx.get_hub().download(
                ctx.entry.repo, ctx.entry.commit, w.repo_path, out, offset=have, size=w.size
            )
        return out.written


def _fsync(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def download_all(ctx: FetchContext, todo: Sequence[Want], workers: int, progress: bool | None) -> None:
    # rich loads here: a warm run (nothing to download) never needs it.
    from rich.console import Console
    from rich.progress import (
        BarColumn,
        DownloadColumn,
        Progress,
        TextColumn,
        TimeRemainingColumn,
        TransferSpeedColumn,
    )

    console = Console(stderr=True)
    show = console.is_terminal if progress is None else progress
    errors: list[BaseException] = []
    with Progress(
        TextColumn("{task.description}"),
        BarColumn(),
        DownloadColumn(binary_units=True),
        TransferSpeedColumn(),
        TimeRemainingColumn(),
        console=console,
        disable=not show,
        transient=True,
    ) as prog:
        ctx.progress = prog
        ctx.overall = prog.add_task(f"{ctx.entry.repo}", total=sum(w.size for w in todo))
        for _w, res in run_all(lambda w: _download(ctx, w), todo, workers, ctx.stop):
            if isinstance(res, BaseException):
                errors.append(res)
        ctx.progress = None
    if not errors:
        return
    if len(errors) == 1 or all(not isinstance(e, RigsmithError) for e in errors[1:]):
        first = errors[0]
        if isinstance(first, RigsmithError):
            raise first
        raise AdapterError(f"download failed: {type(first).__name__}: {first}") from first
    msgs = [str(e) for e in errors]
    raise AdapterError(
        f"{len(errors)} files failed; the others are verified and kept:\n"
        + "\n".join(f"- {m}" for m in msgs),
        hint="re-run `invoke fetch-model`: finished files are not downloaded again",
    )
