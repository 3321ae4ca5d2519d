"""How a model's files reach the disk, into a partial file first: hf_xet where the Hub keeps a large file on
Xet; byte ranges (:mod:`~rigsmith.resolving.parts`, hashed as they land) for other large files, kept
because bench/bench_link.py measured them ≥ 15 % faster than huggingface_hub's HTTP path at a shaped
10 Gbit/s link; huggingface_hub's ``http_get`` for the rest, then one hash pass. A file takes its real path
only once its hash matches the lock. :mod:`rigsmith.resolving.modelfetch` decides what to fetch.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import IO, Any

from rigsmith.errors import AdapterError, RigsmithError
from rigsmith.resolving import parts as partsmod
from rigsmith.resolving.modelfiles import PARTIAL_DIR, STATE_DIR, HashMismatch, Stopped, Want, hash_file
from rigsmith.resolving.rangeget import NotRanged
from rigsmith.resolving.transfer import FetchContext, run_all

#: A file that hashes wrong after download is fetched once more before it is refused.
MISMATCH_ATTEMPTS = 2


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
            done = _fetch_xet(ctx, w, part, on_bytes) or _fetch_ranged(ctx, w, part, on_bytes)
            digest, written = done if done is not None else (None, _fetch(ctx, w, part, on_bytes))
            with ctx.mu:
                ctx.report.downloaded_bytes += written
            got = part.stat().st_size
            digest = digest or hash_file(part, w.kind, w.size, ctx.stop)
            if got == w.size and digest == w.digest:
                _fsync(part)  # durable before the rename: the record will vouch for these bytes unhashed
                break
            part.unlink()
            partsmod.record_path(part).unlink(missing_ok=True)
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
        partsmod.record_path(part).unlink(missing_ok=True)
        ctx.record(w.disk_path, w.kind, w.digest)
        with ctx.mu:
            ctx.report.downloaded.append(w.repo_path)
    finally:
        if task is not None and ctx.progress is not None:
            ctx.progress.remove_task(task)


def _fetch_xet(
    ctx: FetchContext, w: Want, part: Path, on_bytes: Callable[[int], None]
) -> tuple[None, int] | None:
    """(no digest, bytes downloaded) of a large file the Hub keeps on Xet, fetched whole by hf_xet (its chunk
    cache, not the partial, is what a second try reuses); None when the file is not on Xet (or hf_xet is
    off, or the adapter has no Xet route), asked for the first large file only."""
    xet_hub: Any = ctx.get_hub()
    if ctx.no_xet or w.size < 2 * partsmod.PART_BYTES or not hasattr(xet_hub, "xet_file"):
        return None
    xet = xet_hub.xet_file(ctx.entry.repo, ctx.entry.commit, w.repo_path)
    if xet is None:
        ctx.no_xet = True  # a Hub either keeps a snapshot's large files on Xet or not: one HEAD is enough
        return None
    part.unlink(missing_ok=True)
    partsmod.record_path(part).unlink(missing_ok=True)
    xet_hub.download_xet(ctx.entry.repo, ctx.entry.commit, w.repo_path, part, w.size, xet)
    on_bytes(w.size)
    return None, w.size


def _fetch_ranged(
    ctx: FetchContext, w: Want, part: Path, on_bytes: Callable[[int], None]
) -> tuple[str, int] | None:
    """(digest, bytes downloaded) of a file of :data:`~rigsmith.resolving.parts.PART_BYTES` or more, fetched
    by range requests and hashed as they land; None for a smaller file, or when the adapter has no ranged
    route or the server does not serve ranges (the partial is then left for :func:`_fetch`).

    The last large file to start goes as several ranges in flight together on the shared connections, so a
    single large file (or the tail of a snapshot) still fills the wire; any other as one range.
    """
    hub: Any = ctx.get_hub()
    if ctx.no_ranges or ctx.ranges is None or not hasattr(hub, "download_range"):
        if partsmod.record_path(part).exists():
            _sequential_partial(part, w.size)
        return None
    if w.size < partsmod.PART_BYTES and not partsmod.record_path(part).exists():
        return None
    with ctx.mu:
        ctx.waiting -= 1
        several = w.size >= 2 * partsmod.PART_BYTES and ctx.waiting <= 0

    def get(start: int, end: int, write: Callable[[int, memoryview], None]) -> None:
        hub.download_range(ctx.entry.repo, ctx.entry.commit, w.repo_path, start, end, w.size, write, ctx.stop)

    reported = [0]

    def progress(n: int) -> None:
        reported[0] += n
        on_bytes(n)

    try:
        if several:
            progress(sum(b - a for a, b in partsmod.read_record(part, w.size)))
            digest, resumed, written = partsmod.fetch_parts(
                part, w.kind, w.size, get, ctx.ranges, progress, ctx.stop
            )
        else:
            digest, resumed, written = partsmod.fetch_whole(part, w.kind, w.size, get, progress, ctx.stop)
    except NotRanged:
        ctx.no_ranges = True  # huggingface_hub reports HTTP errors properly, and resumes from the prefix
        _sequential_partial(part, w.size)
        on_bytes(-reported[0])
        return None
    with ctx.mu:
        ctx.report.resumed_bytes += resumed
    return digest, written


def _sequential_partial(part: Path, size: int) -> None:
    """Make a ranged partial one :func:`_fetch` resumes: cut at the first gap, record removed."""
    spans = partsmod.read_record(part, size)
    keep = spans[0][1] if spans and spans[0][0] == 0 else 0
    if part.exists():
        os.truncate(part, keep)
    partsmod.record_path(part).unlink(missing_ok=True)


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
    from rigsmith.progress import bars

    errors: list[BaseException] = []
    with bars(progress) as prog:
        ctx.progress = prog
        ctx.overall = prog.add_task(f"{ctx.entry.repo}", total=sum(w.size for w in todo))
        # Ranges of large files share `workers` connections, in file order (the first file completes first).
        ctx.ranges = ThreadPoolExecutor(max_workers=workers, thread_name_prefix="range")
        ctx.waiting = sum(w.size >= partsmod.PART_BYTES for w in todo)
        try:
            for _w, res in run_all(lambda w: _download(ctx, w), todo, workers, ctx.stop):
                if isinstance(res, BaseException):
                    errors.append(res)
        finally:
            ctx.ranges.shutdown(wait=True, cancel_futures=True)
            ctx.ranges = None
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
