"""How a model's files reach the disk: each wanted file checked or downloaded (one stream through the
Hub client, byte ranges in parallel, or hf_xet), hashed beside the transfer, and renamed into place only
once its hash matches the lock. :mod:`rigsmith.resolving.modelfetch` decides what to fetch; this moves
the bytes.
"""

# Over 500 lines (530): the three routes a file takes (one Hub stream, byte ranges in parallel, hf_xet)
# share one context (stop flag, progress, hash pipe, range pool); split by route once a fourth appears.

from __future__ import annotations

import os
import queue
import shutil
import threading
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from rigsmith.errors import AdapterError, RigsmithError
from rigsmith.resolving import parts as partsmod
from rigsmith.resolving.lock import LockedModel
from rigsmith.resolving.modelfiles import (
    ORIGINAL_DIR,
    PARTIAL_DIR,
    STATE_DIR,
    STATE_FILE,
    DirState,
    FetchReport,
    FileState,
    Hasher,
    HashKind,
    HashMismatch,
    Stopped,
    Want,
    dump_state,
    hash_file,
    hash_stream,
)
from rigsmith.resolving.rangeget import NotRanged
from rigsmith.resolving.warmfetch import MAX_WORKERS as MAX_WORKERS
from rigsmith.resolving.warmfetch import WORKERS as WORKERS
from rigsmith.resolving.warmfetch import parse_workers as parse_workers
from rigsmith.spec import Deployment
from rigsmith.writer import write_one

if TYPE_CHECKING:
    from rich.progress import Progress, TaskID

    from rigsmith.resolving.hub import Hub

Echo = Callable[[str], None]

#: Report download progress in steps of at least this many bytes.
PROGRESS_STEP = 1 << 20
#: Ask the kernel to start writing a download out every this many bytes.
WRITEBACK_STEP = 16 << 20
#: Blocks (up to a socket read each, 1 MiB) waiting for a download's hashing thread, at most.
HASH_QUEUE = 16
#: A file that hashes wrong after download is fetched once more before it is refused.
MISMATCH_ATTEMPTS = 2


class FetchInterrupted(KeyboardInterrupt):
    """Ctrl-C during a fetch: queued files were cancelled, transfers stopped, partial files kept."""


class _HashPipe:
    """Hashes blocks in a thread of its own, in order, while the caller goes back to the socket.

    Inline, every block's hash update stalls the connection it came from (nothing reads the socket while
    the block is hashed, so the sender waits on a full window); here the next block is read meanwhile.
    hashlib releases the GIL for large buffers, so the two really overlap. At most :data:`HASH_QUEUE`
    blocks wait (bounded memory). :meth:`result` waits for the last block and ends the thread; the next
    :meth:`update` starts another.
    """

    def __init__(self, hasher: Hasher) -> None:
        self._hasher = hasher
        self._q: queue.Queue[bytes | memoryview | None] | None = None
        self._thread: threading.Thread | None = None
        self._error: BaseException | None = None

    def update(self, data: bytes | memoryview) -> None:
        if not isinstance(data, bytes):
            data = bytes(data)  # the caller may reuse its buffer once this returns
        if self._q is None:
            self._q = queue.Queue(maxsize=HASH_QUEUE)
            self._thread = threading.Thread(target=self._run, args=(self._q,), name="hash", daemon=True)
            self._thread.start()
        self._q.put(data)

    def _run(self, q: queue.Queue[bytes | memoryview | None]) -> None:
        while (block := q.get()) is not None:
            if self._error is None:
                try:
                    self._hasher.update(block)
                except BaseException as err:  # re-raised by result()
                    self._error = err

    def result(self) -> Hasher:
        """The hasher, every block given so far in it."""
        if self._q is not None and self._thread is not None:
            self._q.put(None)
            self._thread.join()
            self._q = self._thread = None
        if self._error is not None:
            raise self._error
        return self._hasher


class HashingWriter:
    """The download sink: writes, hashes and counts each block as it arrives; absolute positions.

    The hashing runs beside the download (:class:`_HashPipe`); :attr:`hasher` waits for it. Progress is
    reported in steps of at least :data:`PROGRESS_STEP` bytes (a rich update per 64 KiB
    block costs more than the hashing). Every :data:`WRITEBACK_STEP` bytes the kernel is asked to start
    writing the range out (:func:`~rigsmith.resolving.parts.start_writeback`), so the fsync before the
    rename waits for the last few MiB rather than for the whole file.
    """

    def __init__(
        self,
        fh: Any,
        hasher: Hasher,
        kind: HashKind,
        size: int,
        on_bytes: Callable[[int], None],
        stop: threading.Event | None = None,
    ) -> None:
        self._fh = fh
        self.stop = stop  # read by the Hub adapter too: a set stop also cuts a retry backoff short
        self._fd: int = fh.fileno()
        self._kind = kind
        self._size = size
        self._pipe = _HashPipe(hasher)
        self.on_bytes = on_bytes
        self.written = 0
        self._pos: int = fh.tell()
        self._unreported = 0
        self._synced = self._pos

    def write(self, data: bytes) -> int:
        if self.stop is not None and self.stop.is_set():
            self._fh.flush()  # what arrived stays in the partial file: the next run resumes from it
            raise Stopped("stopped")
        n: int = self._fh.write(data)
        self._pipe.update(data)
        self.written += n
        self._pos += n
        self._unreported += n
        if self._unreported >= PROGRESS_STEP:
            self.on_bytes(self._unreported)
            self._unreported = 0
        if self._pos - self._synced >= WRITEBACK_STEP:
            self._fh.flush()
            partsmod.start_writeback(self._fd, self._synced, self._pos - self._synced)
            self._synced = self._pos
        return n

    @property
    def hasher(self) -> Hasher:
        """The hash of every byte written so far (waits for the hashing thread to catch up)."""
        return self._pipe.result()

    def close(self) -> None:
        """End the hashing thread (after an error: the bytes so far are not needed)."""
        self._pipe.result()

    def tell(self) -> int:
        return self._pos

    def seek(self, offset: int, whence: int = 0) -> int:
        # The adapter rewinds to 0 when a server ignores Range; the hash restarts with it.
        pos: int = self._fh.seek(offset, whence)
        if pos != self._pos:
            if pos != 0:
                raise ValueError("only a rewind to the start is supported")
            self._pipe.result()
            self._pipe = _HashPipe(Hasher(self._kind, self._size))
            self.on_bytes(self._unreported - self._pos)
            self._unreported = 0
            self._synced = 0
        self._pos = pos
        return pos

    def truncate(self, size: int | None = None) -> int:
        n: int = self._fh.truncate(size)
        return n

    def flush(self) -> None:
        self._fh.flush()
        if self._unreported:
            self.on_bytes(self._unreported)
            self._unreported = 0


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
    #: The connections that download ranges of large files (:mod:`~rigsmith.resolving.parts`).
    ranges: ThreadPoolExecutor | None = None
    #: Set once a server answered a range other than as asked: later files skip the ranged route.
    no_ranges: bool = False
    #: Set once a large file turned out not to be on Xet (or hf_xet is off): later files skip the question.
    no_xet: bool = False
    #: Large files (a range or more) not started yet: the last ones to start go as several ranges.
    waiting: int = 0

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
        st = (self.root / rel).stat()
        with self.mu:
            self.state.files[rel] = FileState(
                size=st.st_size, mtime_ns=st.st_mtime_ns, kind=kind, digest=digest
            )
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
    """Hash what is on disk for ``w``; adopt it (and cache the verification) when it matches."""
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


def _download(ctx: FetchContext, w: Want) -> None:
    """Download one file into its partial, verify, move into place; resume from a partial left earlier.

    A large file goes as several ranges at once when the Hub serves ranges (:func:`_fetch_ranged`), any
    other by one streamed request (:func:`_fetch_stream`); either way every byte is hashed before the
    rename, and a file that hashes wrong is fetched once more before it is refused.
    """
    part = ctx.inside(f"{STATE_DIR}/{PARTIAL_DIR}/{w.partial_name}")
    part.parent.mkdir(parents=True, exist_ok=True)
    task = None
    if ctx.progress is not None:
        task = ctx.progress.add_task(w.repo_path, total=w.size)

    def on_bytes(n: int) -> None:
        ctx.advance(n)
        if task is not None and ctx.progress is not None:
            ctx.progress.advance(task, n)

    try:
        for attempt in range(1, MISMATCH_ATTEMPTS + 1):
            done = _fetch_xet(ctx, w, part, on_bytes) or _fetch_ranged(ctx, w, part, on_bytes)
            digest, got, written = done if done is not None else _fetch_stream(ctx, w, part, on_bytes)
            if got == w.size and digest == w.digest:
                # Durable before the rename: the state cache will vouch for these bytes unhashed.
                fd = os.open(part, os.O_RDONLY)
                try:
                    os.fsync(fd)
                finally:
                    os.close(fd)
            with ctx.mu:
                ctx.report.downloaded_bytes += written
            if got == w.size and digest == w.digest:
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


def _fetch_ranged(
    ctx: FetchContext, w: Want, part: Path, on_bytes: Callable[[int], None]
) -> tuple[str, int, int] | None:
    """(digest, size, bytes downloaded) of ``w`` fetched by range requests (:mod:`~rigsmith.resolving.
    parts`); None when the Hub adapter has no ranged route or the server does not serve ranges (the
    partial is then left for the streamed route).

    A file of :data:`~rigsmith.resolving.parts.PART_BYTES` or more goes by range requests (a smaller one:
    None). The last large file to start goes as several ranges in flight together on the shared
    connections, so a single large file (or the tail of a snapshot) still fills the wire; any other as one
    range, written and hashed as it arrives, since the other files keep the connections busy.
    """
    hub = ctx.get_hub()
    if ctx.no_ranges or ctx.ranges is None or not hasattr(hub, "download_range"):
        if partsmod.record_path(part).exists():
            _sequential_partial(part, w.size)
        return None
    if w.size < partsmod.PART_BYTES and not partsmod.record_path(part).exists():
        return None  # small: huggingface_hub's stream costs little here, and reports errors itself
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
        ctx.no_ranges = True  # the streamed route reports HTTP errors properly, and resumes from the prefix
        _sequential_partial(part, w.size)
        on_bytes(-reported[0])
        return None
    with ctx.mu:
        ctx.report.resumed_bytes += resumed
    ctx.hashed(resumed)
    return digest, w.size, written


def _fetch_xet(
    ctx: FetchContext, w: Want, part: Path, on_bytes: Callable[[int], None]
) -> tuple[str, int, int] | None:
    """(digest, size, bytes downloaded) of a large file the Hub keeps on Xet, fetched by hf_xet and then
    hashed from the page cache; None when the file is not on Xet (or hf_xet is off), asked once per file.

    hf_xet writes the whole file itself: a partial of the other routes is dropped (its chunk cache, not
    the partial, is what makes a second try cheap)."""
    hub = ctx.get_hub()
    if (
        ctx.no_xet
        or w.size < 2 * partsmod.PART_BYTES
        or not (hasattr(hub, "xet_file") and hasattr(hub, "download_xet"))
    ):
        return None
    xet = hub.xet_file(ctx.entry.repo, ctx.entry.commit, w.repo_path)
    if xet is None:
        ctx.no_xet = True  # a Hub either keeps a snapshot's large files on Xet or not: one HEAD is enough
        return None
    part.unlink(missing_ok=True)
    partsmod.record_path(part).unlink(missing_ok=True)
    hub.download_xet(ctx.entry.repo, ctx.entry.commit, w.repo_path, part, w.size, xet)
    got = part.stat().st_size
    on_bytes(got)
    return hash_file(part, w.kind, w.size, ctx.stop), got, got


def _sequential_partial(part: Path, size: int) -> None:
    """Make a ranged partial one the streamed route resumes: cut at the first gap, record removed."""
    spans = partsmod.read_record(part, size)
    keep = spans[0][1] if spans and spans[0][0] == 0 else 0
    if part.exists():
        os.truncate(part, keep)
    partsmod.record_path(part).unlink(missing_ok=True)


def _fetch_stream(
    ctx: FetchContext, w: Want, part: Path, on_bytes: Callable[[int], None]
) -> tuple[str, int, int]:
    """(digest, bytes in the partial, bytes downloaded) of ``w`` streamed by one request from where its
    partial ends, hashed as it arrives (the resumed prefix hashed from disk first)."""
    have = part.stat().st_size if part.exists() else 0
    if have > w.size:
        part.unlink()
        have = 0
    with part.open("r+b" if have else "w+b") as fh:
        hasher = (
            hash_stream(w.kind, w.size, fh, limit=have, stop=ctx.stop) if have else Hasher(w.kind, w.size)
        )
        if have:
            ctx.hashed(have)
            on_bytes(have)
            with ctx.mu:
                ctx.report.resumed_bytes += have
        fh.seek(have)
        out = HashingWriter(fh, hasher, w.kind, w.size, on_bytes, ctx.stop)
        try:
            if have < w.size:
                ctx.get_hub().download(
                    ctx.entry.repo, ctx.entry.commit, w.repo_path, out, offset=have, size=w.size
                )
        finally:
            out.close()
        out.flush()
        return out.hasher.hexdigest(), out.tell(), out.written


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
