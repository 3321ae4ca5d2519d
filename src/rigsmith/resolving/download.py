"""How a model's files reach the disk and are checked there, for fetch-model
(:mod:`rigsmith.resolving.modelfetch` decides what to fetch).

A file already on disk is hashed against the lock (:func:`check_file`). A missing one is moved by
huggingface_hub into a partial file (hf_xet where the Hub keeps it on Xet, its ``http_get`` otherwise,
resuming where the partial ends), hashed as the bytes arrive (in one pass after hf_xet), and takes its real
path only once that hash matches the lock. Files go ``workers`` at a time; Ctrl-C cancels the queued ones,
stops the running ones at their next block and keeps their partials (:func:`run_all`).

No hand-written ranged downloader (removed in issue 26): bench/bench_link.py at a tc-shaped 1 and
10 Gbit/s link found byte ranges over ``http.client`` no faster than this path, once it hashes as bytes
arrive, skips httpx's re-chunking and starts writeback early.
"""

from __future__ import annotations

import os
import shutil
import threading
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any, cast

from rigsmith.errors import AdapterError, RigsmithError
from rigsmith.resolving.lock import LockedModel
from rigsmith.resolving.modelfiles import (
    ORIGINAL_DIR,
    PARTIAL_DIR,
    STATE_DIR,
    STATE_FILE,
    DirState,
    FetchReport,
    Hasher,
    HashKind,
    HashMismatch,
    Stopped,
    Want,
    dump_state,
    hash_file,
    hash_stream,
    seen,
    verified,
)
from rigsmith.spec import Deployment
from rigsmith.writer import write_one

if TYPE_CHECKING:
    from rich.progress import Progress, TaskID

    from rigsmith.resolving.hub import Hub


class FetchInterrupted(KeyboardInterrupt):
    """Ctrl-C during a fetch: queued files were cancelled, transfers stopped, partial files kept."""


@dataclass
class FetchContext:
    """One fetch run's shared, mutable bits (guarded by ``mu``)."""

    spec: Deployment
    entry: LockedModel
    root: Path
    state: DirState
    report: FetchReport
    mu: threading.Lock
    get_hub: Callable[[], Hub]
    stop: threading.Event
    progress: Progress | None = None
    overall: TaskID | None = None
    #: Set once an LFS file turned out not to be on Xet (or hf_xet is off): later files skip the question.
    no_xet: bool = False

    def inside(self, rel: str) -> Path:
        """``root/rel``, refusing it when a symlinked directory on the way leads out of the model dir."""
        path = self.root / rel
        real_root = self.root.resolve()
        if not path.parent.resolve().is_relative_to(real_root):
            raise RigsmithError(
                f"{path}: a directory on the way is a symlink out of the model dir ({path.parent.resolve()})",
                hint=f"remove the symlink from {self.root}; rigsmith writes only inside the model dir",
            )
        return path

    @property
    def state_path(self) -> Path:
        return self.root / STATE_DIR / STATE_FILE

    def record(self, rel: str, kind: HashKind, digest: str) -> None:
        """Remember that ``rel``, as it is on disk now, holds the bytes that hash to ``digest``."""
        rec = verified(seen((self.root / rel).stat()), kind, digest)
        with self.mu:
            self.state.files[rel] = rec
            write_one(self.state_path, dump_state(self.state))

    def hashed(self, n: int) -> None:
        with self.mu:
            self.report.hashed_files += 1
            self.report.hashed_bytes += n

    def advance(self, n: int) -> None:
        if self.progress is not None and self.overall is not None:
            self.progress.advance(self.overall, n)


def _alternate(w: Want) -> str:
    """Where a good copy of the Hub's bytes may already be: the real path of a newly patched file, or the
    kept original of a file whose patch was dropped from the spec."""
    return w.repo_path if w.disk_path != w.repo_path else f"{STATE_DIR}/{ORIGINAL_DIR}/{w.repo_path}"


def check_file(ctx: FetchContext, w: Want) -> bool:
    """Hash what is on disk for ``w``; adopt it (and record the verification) when it matches."""
    for rel in (w.disk_path, _alternate(w)):
        path = ctx.root / rel
        try:
            if path.stat().st_size != w.size:
                continue
        except FileNotFoundError:
            continue
        digest = hash_file(path, w.kind, w.size, ctx.stop)
        ctx.hashed(w.size)
        if digest != w.digest:
            continue
        if rel != w.disk_path:
            dst = ctx.inside(w.disk_path)
            dst.parent.mkdir(parents=True, exist_ok=True)
            if rel == w.repo_path:
                shutil.copy2(path, dst)  # keep the real path until the patch replaces it
            else:
                path.replace(dst)
        ctx.record(w.disk_path, w.kind, w.digest)
        return True
    return False


def run_all(
    fn: Callable[[Want], Any], items: Sequence[Want], workers: int, stop: threading.Event
) -> list[tuple[Want, Any]]:
    """Run ``fn`` over items in a thread pool; return (item, result-or-exception) pairs, all of them.

    Ctrl-C (KeyboardInterrupt in this, the main thread) cancels every queued item, sets ``stop`` so the
    running ones end at their next block (keeping their partial files), waits for them, and re-raises.
    """
    out: list[tuple[Want, Any]] = []
    if not items:
        return out
    pool = ThreadPoolExecutor(max_workers=max(1, min(workers, len(items))))
    try:
        futs = [(w, pool.submit(fn, w)) for w in items]
        for w, f in futs:
            exc = f.exception()
            out.append((w, exc if exc is not None else f.result()))
    except KeyboardInterrupt:
        stop.set()
        pool.shutdown(wait=True, cancel_futures=True)
        raise
    pool.shutdown(wait=True)
    return out


#: A file that hashes wrong after download is fetched once more before it is refused.
MISMATCH_ATTEMPTS = 2
#: Ask the kernel to start writing a partial out every this many new bytes (:func:`_start_writeback`).
WRITEBACK_STEP = 16 << 20


@cache
def _sync_file_range() -> Callable[[int, int, int, int], int] | None:
    import ctypes  # only when bytes are written: a warm run does without

    try:
        fn = ctypes.CDLL(None, use_errno=True).sync_file_range
    except (AttributeError, OSError):
        return None  # not Linux/glibc: the fsync before the rename does all the work
    fn.argtypes = [ctypes.c_int, ctypes.c_int64, ctypes.c_int64, ctypes.c_uint]
    fn.restype = ctypes.c_int
    return cast(Callable[[int, int, int, int], int], fn)


def _start_writeback(fd: int) -> None:
    """Start (not wait for) writing the file's dirty pages out (``SYNC_FILE_RANGE_WRITE``); a hint.

    Without it a fresh download stays dirty in the page cache until the fsync before the rename, which then
    writes the whole file while nothing else happens. PostgreSQL does the same (``pg_flush_data``).
    """
    if (fn := _sync_file_range()) is not None:
        fn(fd, 0, 0, 2)


class PartialFile:
    """The partial file as huggingface_hub writes into it: each block counted and hashed, refused once
    ``stop`` is set (Ctrl-C; the bytes so far stay for the next run to resume from).

    ``hasher`` holds the hash of every byte from the start of the file to its position, or is None once a
    seek broke that (the caller then hashes the file in one pass)."""

    def __init__(
        self,
        fh: IO[bytes],
        on_bytes: Callable[[int], None],
        stop: threading.Event,
        hasher: Hasher | None = None,
    ) -> None:
        self._fh = fh
        self.on_bytes = on_bytes
        self.stop = stop  # read by the Hub adapter too: a set stop also cuts a retry backoff short
        self.hasher = hasher
        self.written = 0

    def write(self, data: bytes) -> int:
        if self.stop.is_set():
            raise Stopped("stopped")
        n = self._fh.write(data)
        if self.hasher is not None:
            self.hasher.update(data)  # hashlib releases the GIL: other files' threads keep going
        self.written += n
        if self.written // WRITEBACK_STEP != (self.written - n) // WRITEBACK_STEP:
            self._fh.flush()
            _start_writeback(self._fh.fileno())
        self.on_bytes(n)
        return n

    def tell(self) -> int:
        return self._fh.tell()

    def seek(self, offset: int, whence: int = 0) -> int:
        before = self._fh.tell()
        pos = self._fh.seek(offset, whence)
        if pos != before and self.hasher is not None:
            self.hasher = Hasher(self.hasher.kind, self.hasher.size) if pos == 0 else None
        self.on_bytes(pos - before)  # a server ignoring Range: the file starts over
        return pos

    def truncate(self, size: int | None = None) -> int:
        return self._fh.truncate(size)


def _download(ctx: FetchContext, w: Want) -> None:
    """Download one file into its partial (resuming one left earlier), check its hash, move it into place.

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
            digest = _fetch_xet(ctx, w, part, on_bytes) or _fetch(ctx, w, part, on_bytes)
            got = part.stat().st_size
            if got == w.size and digest == w.digest:
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


def _fetch_xet(ctx: FetchContext, w: Want, part: Path, on_bytes: Callable[[int], None]) -> str | None:
    """The digest of an LFS file the Hub keeps on Xet, fetched whole by hf_xet (its chunk cache, not the
    partial, is what a second try reuses) and hashed in one pass; None when the file is not on Xet (or
    hf_xet is off, or the adapter has no Xet route). Only the first LFS file is asked about when the answer
    is no: a Hub keeps a snapshot's LFS files on Xet or not."""
    xet_hub: Any = ctx.get_hub()
    if ctx.no_xet or w.kind != "sha256" or not hasattr(xet_hub, "xet_file"):
        return None
    xet = xet_hub.xet_file(ctx.entry.repo, ctx.entry.commit, w.repo_path)
    if xet is None:
        ctx.no_xet = True
        return None
    part.unlink(missing_ok=True)
    xet_hub.download_xet(ctx.entry.repo, ctx.entry.commit, w.repo_path, part, w.size, xet)
    on_bytes(w.size)
    with ctx.mu:
        ctx.report.downloaded_bytes += w.size
    with part.open("rb") as fh:
        os.fsync(fh.fileno())  # durable before the rename: the record will vouch for these bytes unhashed
        return hash_stream(w.kind, w.size, fh, stop=ctx.stop).hexdigest()


def _fetch(ctx: FetchContext, w: Want, part: Path, on_bytes: Callable[[int], None]) -> str:
    """The digest of ``part`` once huggingface_hub's ``http_get`` has written the rest of ``w`` into it,
    from where the partial ends (a range request); durable (fsynced) before the caller renames it."""
    have = part.stat().st_size if part.exists() else 0
    if have > w.size:
        part.unlink()
        have = 0
    if have:
        on_bytes(have)
        with ctx.mu:
            ctx.report.resumed_bytes += have
    with part.open("r+b" if have else "wb") as fh:
        # The resumed prefix is read once; the rest is hashed as it arrives.
        hasher = (
            hash_stream(w.kind, w.size, fh, limit=have, stop=ctx.stop) if have else Hasher(w.kind, w.size)
        )
        out = PartialFile(fh, on_bytes, ctx.stop, hasher)
        try:
            if have < w.size:
                ctx.get_hub().download(
                    ctx.entry.repo, ctx.entry.commit, w.repo_path, out, offset=have, size=w.size
                )
            fh.flush()
            os.fsync(fh.fileno())  # durable before the rename: the record will vouch for these bytes unhashed
        finally:
            with ctx.mu:
                ctx.report.downloaded_bytes += out.written
    return out.hasher.hexdigest() if out.hasher is not None else hash_file(part, w.kind, w.size, ctx.stop)


def download_all(ctx: FetchContext, todo: Sequence[Want], workers: int, progress: bool | None) -> None:
    """Download ``todo`` with ``workers`` files at once (a rich progress bar on a terminal); one error is
    raised as it is, several are listed in one message."""
    # rich loads here: a warm run (nothing to download) never needs it.
    from rigsmith.progress import bars

    errors: list[BaseException] = []
    with bars(progress) as prog:
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
    raise AdapterError(
        f"{len(errors)} files failed; the others are verified and kept:\n"
        + "\n".join(f"- {e}" for e in errors),
        hint="re-run `invoke fetch-model`: finished files are not downloaded again",
    )
