"""How fetch-model's files reach the disk and are checked there (:mod:`~rigsmith.resolving.model.modelfetch`
decides what to fetch). A file on disk is hashed against the lock (:func:`check_file`); a missing one is
moved by huggingface_hub (hf_xet where the Hub says Xet, ``http_get`` from where the partial ends otherwise)
into a partial file, hashed as the bytes arrive, and takes its real path only once that hash matches the
lock. Files go ``workers`` at a time; Ctrl-C cancels the queued ones, stops the running ones at their next
block and keeps their partials (:func:`run_all`). No hand-written ranged downloader (removed in issue 26):
``bench/bench_link.py`` at a tc-shaped 1 and 10 Gbit/s link found it no faster than this path.
"""

from __future__ import annotations

import os
import shutil
import threading
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any, cast

from rigsmith.errors import AdapterError, RigsmithError
from rigsmith.resolving.lock.lock import LockedModel
from rigsmith.resolving.model.modelfiles import (
    ORIGINAL_DIR,
    PARTIAL_DIR,
    FetchReport,
    Hasher,
    HashMismatch,
    Stopped,
    Want,
    hash_file,
    hash_stream,
)
from rigsmith.resolving.model.verified import (
    STATE_DIR,
    STATE_FILE,
    DirState,
    HashKind,
    dump_state,
    seen,
    verified,
)
from rigsmith.writer import write_one

if TYPE_CHECKING:
    from rich.progress import Progress, TaskID

    from rigsmith.resolving.model.hub import Hub

#: A file that hashes wrong after download is fetched once more before it is refused.
MISMATCH_ATTEMPTS = 2
#: Ask the kernel to start writing a partial out every this many new bytes (:func:`_sync_file_range`).
WRITEBACK_STEP = 16 << 20


class FetchInterrupted(KeyboardInterrupt):
    """Ctrl-C during a fetch: queued files were cancelled, transfers stopped, partial files kept."""


@dataclass
class FetchContext:
    """One fetch run's shared, mutable bits (guarded by ``mu``)."""

    entry: LockedModel
    root: Path
    state: DirState
    report: FetchReport
    get_hub: Callable[[], Hub]
    mu: threading.Lock = field(default_factory=threading.Lock)
    stop: threading.Event = field(default_factory=threading.Event)
    #: Set once an LFS file turned out not to be on Xet (or hf_xet is off): later files skip the question.
    no_xet: bool = False

    def inside(self, rel: str) -> Path:
        """``root/rel`` with its directories made, refusing it when a symlinked directory on the way leads
        out of the model dir."""
        path = self.root / rel
        if not path.parent.resolve().is_relative_to(self.root.resolve()):
            raise RigsmithError(
                f"{path}: a directory on the way is a symlink out of the model dir ({path.parent.resolve()})",
                hint=f"remove the symlink from {self.root}; rigsmith writes only inside the model dir",
            )
        path.parent.mkdir(parents=True, exist_ok=True)
        return path

    def record(self, rel: str, kind: HashKind, digest: str) -> None:
        """Remember that ``rel``, as it is on disk now, holds the bytes that hash to ``digest``."""
        rec = verified(seen((self.root / rel).stat()), kind, digest)
        with self.mu:
            self.state.files[rel] = rec
        self.save()

    def save(self) -> None:
        with self.mu:
            write_one(self.root / STATE_DIR / STATE_FILE, dump_state(self.state))

    def count(self, **add: int) -> None:
        """Add to the report's byte and file counters."""
        with self.mu:
            for name, n in add.items():
                setattr(self.report, name, getattr(self.report, name) + n)


def check_file(ctx: FetchContext, w: Want) -> bool:
    """Hash what is on disk for ``w``; adopt it (and record the verification) when it matches. A good copy
    of the Hub's bytes may also be at the real path of a newly patched file, or in the kept original of a
    file whose patch was dropped from the spec."""
    other = w.repo_path if w.disk_path != w.repo_path else f"{STATE_DIR}/{ORIGINAL_DIR}/{w.repo_path}"
    for rel in (w.disk_path, other):
        path = ctx.root / rel
        if not path.is_file() or path.stat().st_size != w.size:
            continue
        digest = hash_file(path, w.kind, w.size, ctx.stop)
        ctx.count(hashed_files=1, hashed_bytes=w.size)
        if digest != w.digest:
            continue
        if rel == w.repo_path != w.disk_path:
            shutil.copy2(path, ctx.inside(w.disk_path))  # keep the real path until the patch replaces it
        elif rel != w.disk_path:
            path.replace(ctx.inside(w.disk_path))
        ctx.record(w.disk_path, w.kind, w.digest)
        return True
    return False


def run_all(
    fn: Callable[[Want], Any], items: Sequence[Want], workers: int, stop: threading.Event, interrupted: str
) -> list[Any]:
    """``fn`` over ``items`` in a thread pool: each one's result, or the exception it raised, in order.
    Ctrl-C (KeyboardInterrupt in this, the main thread) cancels the queued items, sets ``stop`` so the
    running ones end at their next block, waits for them and raises :class:`FetchInterrupted`."""

    def one(w: Want) -> Any:
        try:
            return fn(w)
        except Exception as err:
            return err

    pool = ThreadPoolExecutor(max_workers=max(1, min(workers, len(items))))
    try:
        return list(pool.map(one, items))
    except KeyboardInterrupt:
        stop.set()
        pool.shutdown(wait=True, cancel_futures=True)
        raise FetchInterrupted(interrupted) from None
    finally:
        pool.shutdown(wait=True)


@cache
def _sync_file_range() -> Callable[[int, int, int, int], int]:
    """glibc's, to start (not wait for) writing a partial's dirty pages out: else a fresh download stays
    dirty in the page cache until the fsync before the rename, which then writes the whole file while
    nothing else happens (PostgreSQL's ``pg_flush_data`` does the same). Elsewhere a no-op."""
    import ctypes  # only when bytes are written: a warm run loads none of it (test_fetch_warm.py)

    fn = getattr(ctypes.CDLL(None, use_errno=True), "sync_file_range", None)
    if fn is None:
        return lambda *_: 0
    fn.argtypes = [ctypes.c_int, ctypes.c_int64, ctypes.c_int64, ctypes.c_uint]
    return cast(Callable[[int, int, int, int], int], fn)


class PartialFile:
    """The partial file as huggingface_hub writes into it: each block counted and hashed (``hasher``: every
    byte from the start to its position, None once a seek broke that), refused once ``stop`` is set
    (Ctrl-C; the bytes so far stay for the next run to resume from)."""

    def __init__(
        self,
        fh: IO[bytes],
        on_bytes: Callable[[int], None],
        stop: threading.Event,
        hasher: Hasher | None = None,
    ) -> None:
        self._fh, self.on_bytes, self.hasher, self.written = fh, on_bytes, hasher, 0
        self.stop = stop  # read by the Hub adapter too: a set stop also cuts a retry backoff short

    def write(self, data: bytes) -> int:
        if self.stop.is_set():
            raise Stopped("stopped")
        n = self._fh.write(data)
        if self.hasher is not None:
            self.hasher.update(data)  # hashlib releases the GIL: other files' threads keep going
        if (self.written + n) // WRITEBACK_STEP != self.written // WRITEBACK_STEP:
            self._fh.flush()
            _sync_file_range()(self._fh.fileno(), 0, 0, 2)  # SYNC_FILE_RANGE_WRITE
        self.written += n
        self.on_bytes(n)
        return n

    def tell(self) -> int:
        return self._fh.tell()

    def seek(self, offset: int, whence: int = 0) -> int:
        before, pos = self._fh.tell(), self._fh.seek(offset, whence)
        if pos != before:
            self.hasher = None  # a server ignoring Range: the file starts over
        self.on_bytes(pos - before)
        return pos

    def truncate(self, size: int | None = None) -> int:
        return self._fh.truncate(size)


def _download(ctx: FetchContext, w: Want, bars: Progress, overall: TaskID) -> None:
    """Download one file into its partial (resuming one left earlier), check its hash (a wrong one is
    fetched once more before it is refused), move it into place."""
    part = ctx.inside(f"{STATE_DIR}/{PARTIAL_DIR}/{w.partial_name}")
    task = bars.add_task(w.repo_path, total=w.size)

    def on_bytes(n: int) -> None:
        bars.advance(overall, n)
        bars.advance(task, n)

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
        part.replace(ctx.inside(w.disk_path))
        ctx.record(w.disk_path, w.kind, w.digest)
        ctx.report.downloaded.append(w.repo_path)  # list.append is atomic
    finally:
        bars.remove_task(task)


def _fetch_xet(ctx: FetchContext, w: Want, part: Path, on_bytes: Callable[[int], None]) -> str | None:
    """The digest of an LFS file the Hub keeps on Xet, fetched whole by hf_xet (its chunk cache is what a
    second try reuses) and hashed in one pass; None when it is not on Xet (or hf_xet is off), and then for
    every later file too: a Hub keeps a snapshot's LFS files on Xet or not."""
    hub: Any = ctx.get_hub()
    if ctx.no_xet or w.kind != "sha256" or not hasattr(hub, "xet_file"):
        return None
    xet = hub.xet_file(ctx.entry.repo, ctx.entry.commit, w.repo_path)
    if xet is None:
        ctx.no_xet = True
        return None
    part.unlink(missing_ok=True)
    hub.download_xet(ctx.entry.repo, ctx.entry.commit, w.repo_path, part, w.size, xet)
    on_bytes(w.size)
    ctx.count(downloaded_bytes=w.size)
    with part.open("rb") as fh:
        os.fsync(fh.fileno())  # durable before the rename: the record will vouch for these bytes unhashed
        return hash_stream(w.kind, w.size, fh, stop=ctx.stop).hexdigest()


def _fetch(ctx: FetchContext, w: Want, part: Path, on_bytes: Callable[[int], None]) -> str:
    """The digest of ``part`` once huggingface_hub's ``http_get`` has written the rest of ``w`` into it,
    from where the partial ends (a range request); durable (fsynced) before the caller renames it."""
    have = part.stat().st_size if part.exists() else 0
    have = have if have <= w.size else 0  # a partial longer than the file starts over ("wb" empties it)
    on_bytes(have)
    ctx.count(resumed_bytes=have)
    with part.open("r+b" if have else "wb") as fh:
        # The resumed prefix is read once; the rest is hashed as it arrives.
        out = PartialFile(fh, on_bytes, ctx.stop, hash_stream(w.kind, w.size, fh, limit=have, stop=ctx.stop))
        try:
            if have < w.size:
                ctx.get_hub().download(
                    ctx.entry.repo, ctx.entry.commit, w.repo_path, out, offset=have, size=w.size
                )
            fh.flush()
            os.fsync(fh.fileno())  # durable before the rename: the record will vouch for these bytes unhashed
        finally:
            ctx.count(downloaded_bytes=out.written)
    return out.hasher.hexdigest() if out.hasher is not None else hash_file(part, w.kind, w.size, ctx.stop)


def download_all(ctx: FetchContext, todo: Sequence[Want], workers: int, progress: bool | None) -> None:
    """Download ``todo`` with ``workers`` files at once (a rich progress bar on a terminal); one error is
    raised as it is, several are listed in one message."""
    from rigsmith.progress import bars  # rich: 19 ms (-X importtime) a warm run (nothing to download) skips

    stopped = (
        f"queued files cancelled; partial downloads kept in {ctx.root / STATE_DIR / PARTIAL_DIR}; "
        "run `invoke fetch-model` again to resume"
    )
    with bars(progress) as prog:
        overall = prog.add_task(ctx.entry.repo, total=sum(w.size for w in todo))
        results = run_all(lambda w: _download(ctx, w, prog, overall), todo, workers, ctx.stop, stopped)
    errors = [e for e in results if isinstance(e, BaseException)]
    if not errors:
        return
    if len(errors) == 1 or all(not isinstance(e, RigsmithError) for e in errors[1:]):
        if isinstance(errors[0], RigsmithError):
            raise errors[0]
        raise AdapterError(f"download failed: {type(errors[0]).__name__}: {errors[0]}") from errors[0]
    raise AdapterError(
        f"{len(errors)} files failed; the others are verified and kept:\n"
        + "\n".join(f"- {e}" for e in errors),
        hint="re-run `invoke fetch-model`: finished files are not downloaded again",
    )
