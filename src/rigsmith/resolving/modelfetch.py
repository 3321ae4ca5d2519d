"""``pin`` (model part) and ``fetch-model``: a locked commit, downloaded, verified, patched.

The flow (converge, act, re-check):

1. :func:`pin_model` resolves the spec's branch/tag once into ``rigsmith.lock`` (commit + every file's
   size and Hub hash). Afterwards the locked commit is used until the spec changes or ``--repin``.
2. :func:`fetch_model` takes a per-directory file lock, removes stale partial downloads, and sorts the
   wanted files into *verified earlier* (size and mtime match the verified-state cache: no hashing, no
   network), *to check* (hash the file on disk) and *to download*. It checks disk space for what is left,
   then downloads in parallel. Each file streams into ``.rigsmith/partial/<hash>.incomplete`` while being
   hashed, so a killed run resumes from the partial file with an HTTP range request; a file reaches its
   real path only once its hash matches the lock.
3. Config patches are applied to a copy: the Hub's bytes stay in ``.rigsmith/original/<file>``, the
   patched file takes the real path, and the lock records both sha256s.

A local checkpoint (``model.repo: null``) skips 1 and 2: nothing is pinned or downloaded, the task reports
what the directory holds, and config patches are applied the same way (original kept) but not locked — the
lock records Hub facts only.
"""

# Over 500 lines, left whole for now: pin and fetch share the Hub client, the file lock and the
# verified-state cache; the module is being reworked for lazy imports in parallel, and is split after that.

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

from filelock import FileLock, Timeout

from rigsmith.errors import AdapterError, ConsentError, RigsmithError, SpecError
from rigsmith.modeldir import check_model_dir
from rigsmith.project import Project
from rigsmith.resolving import lock as lockmod
from rigsmith.resolving import parts as partsmod
from rigsmith.resolving import warmfetch
from rigsmith.resolving.lock import LockedModel
from rigsmith.resolving.modelfiles import (
    HF_DOWNLOAD_DIR,
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
    check_disk,
    check_patch_files,
    describe_repin,
    dump_state,
    expand_dir,
    hash_file,
    hash_stream,
    locked_model,
    locked_patches,
    patch_json,
    patches_by_file,
    read_state,
    select,
    sha256_bytes,
    stale_partials,
    still_verified,
    wants,
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
HubFactory = Callable[[], "Hub"]
#: Asks the user a yes/no question (None: no terminal, so nothing may be asked and the answer is no).
Confirm = Callable[[str], bool]

#: Report download progress in steps of at least this many bytes.
PROGRESS_STEP = 1 << 20
#: Ask the kernel to start writing a download out every this many bytes.
WRITEBACK_STEP = 16 << 20
#: Blocks (up to a socket read each, 1 MiB) waiting for a download's hashing thread, at most.
HASH_QUEUE = 16
#: A file that hashes wrong after download is fetched once more before it is refused.
MISMATCH_ATTEMPTS = 2
#: Entries of a non-empty model dir looked at before deciding it holds something else.
SCAN_LIMIT = 10_000
#: The flags that give consent (named in the refusals).
ADOPT_FLAG = "--adopt-dir"
OVERWRITE_FLAG = "--overwrite-edited"


class FetchInterrupted(KeyboardInterrupt):
    """Ctrl-C during a fetch: queued files were cancelled, transfers stopped, partial files kept."""


def _lazy(hub: Hub | HubFactory | None) -> Callable[[], Hub]:
    """Build the Hub client only when the network is really needed (a warm run makes no requests)."""
    cache: list[Hub] = []

    def get() -> Hub:
        if not cache:
            if hub is None:
                from rigsmith.resolving.hub import (
                    HfHub,  # huggingface_hub's HTTP stack: import only when needed
                )

                cache.append(HfHub.from_env())
            elif callable(hub) and not hasattr(hub, "download"):
                cache.append(hub())
            else:
                cache.append(hub)  # type: ignore[arg-type]
        return cache[0]

    return get


def _up_to_date(entry: LockedModel | None, spec: Deployment) -> bool:
    m = spec.model
    return (
        entry is not None
        and entry.repo == m.repo
        and entry.requested == m.revision
        and bool(entry.files)
        and (not m.pinned or entry.commit == m.revision)
    )


def pin_model(
    project: Project,
    spec: Deployment,
    *,
    repin: bool = False,
    echo: Echo = print,
    hub: Hub | HubFactory | None = None,
    slot: lockmod.Slot | None = None,
) -> LockedModel | None:
    """Resolve the spec's model revision into ``rigsmith.lock`` once; re-resolve only when asked.

    Args:
        project: the checkout (its ``rigsmith.lock`` is read and written).
        spec: the deployment; ``spec.model.repo`` and ``revision`` (None means ``main``) are resolved.
        repin: resolve the branch/tag again even when the lock already has a commit; prints what changed.
        echo: where status lines go.
        hub: a Hub (or a factory for one); default: huggingface_hub with HF_ENDPOINT / HF_TOKEN.
        slot: where the entry lives in the lock (default: ``models[spec.name]``; a secondary model's is
            ``secondary[NAME][REPO]``, its ``spec`` a copy whose ``model`` is the secondary one).

    Returns:
        The lock entry (``models[spec.name]``): repo, requested revision, commit, every file's hashes;
        None for a local checkpoint (``model.repo: null``), which has nothing to pin.

    Raises:
        AdapterError: the Hub said no (not found, gated, bad revision) or stayed unreachable.
    """
    get_hub = _lazy(hub)
    slot = slot or lockmod.Slot(spec.name)
    old = slot.get(lockmod.read(project.lock_path))
    m = spec.model
    if m.repo is None:
        echo(
            f"{spec.name}: model skipped — model.repo is null (a local checkpoint in {m.local_dir}); "
            "nothing to pin"
        )
        if old is not None:
            # The lock must not claim a Hub commit for a checkpoint rigsmith no longer fetches.
            with lockmod.locked(project.lock_path) as lock:
                slot.put(lock, None)
            echo(
                f"{spec.name}: dropped the lock's {old.repo}@{old.commit[:12]} (the spec no longer names "
                "a repo)"
            )
        return None
    if _up_to_date(old, spec) and not repin:
        assert old is not None
        return old
    repo = m.repo
    commit = get_hub().resolve(repo, m.revision or "main")
    if old is not None and _up_to_date(old, spec) and old.commit == commit:
        echo(describe_repin(old, old)[0])
        return old
    new = locked_model(repo, m.revision, commit, get_hub().tree(repo, commit))
    with lockmod.locked(project.lock_path) as lock:
        current = slot.get(lock)
        if not repin and _up_to_date(current, spec):
            assert current is not None
            return current  # a concurrent pin got there first; keep its commit
        if current is not None and current.commit == new.commit:
            new = new.model_copy(update={"patches": current.patches})
        slot.put(lock, new)
    for line in describe_repin(old, new):
        echo(line)
    return new


# --------------------------------------------------------------------------------------------------


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


class _HashingWriter:
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
class _Ctx:
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


def _check(ctx: _Ctx, w: Want) -> bool:
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


def _download(ctx: _Ctx, w: Want) -> None:
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
    ctx: _Ctx, w: Want, part: Path, on_bytes: Callable[[int], None]
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
    ctx: _Ctx, w: Want, part: Path, on_bytes: Callable[[int], None]
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


def _fetch_stream(ctx: _Ctx, w: Want, part: Path, on_bytes: Callable[[int], None]) -> tuple[str, int, int]:
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
        out = _HashingWriter(fh, hasher, w.kind, w.size, on_bytes, ctx.stop)
        try:
            if have < w.size:
                ctx.get_hub().download(
                    ctx.entry.repo, ctx.entry.commit, w.repo_path, out, offset=have, size=w.size
                )
        finally:
            out.close()
        out.flush()
        return out.hasher.hexdigest(), out.tell(), out.written


def _run_all(
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


def _clean(root: Path, wanted: Sequence[Want]) -> list[str]:
    """Remove partial downloads nothing can resume from, and huggingface_hub's own orphaned temp files."""
    removed = []
    pdir = root / STATE_DIR / PARTIAL_DIR
    if pdir.is_dir():
        names = [p.name for p in pdir.iterdir() if p.is_file()]
        for name in stale_partials(names, wanted):
            (pdir / name).unlink(missing_ok=True)
            removed.append(f"{STATE_DIR}/{PARTIAL_DIR}/{name}")
    hf = root / HF_DOWNLOAD_DIR
    if hf.is_dir():
        for p in sorted(hf.rglob("*.incomplete")):
            p.unlink(missing_ok=True)
            removed.append(str(p.relative_to(root)))
    return removed


def _dir_lock(path: Path, echo: Echo) -> FileLock:
    lock = FileLock(str(path), timeout=-1)
    try:
        lock.acquire(timeout=0)
    except Timeout:
        echo(f"waiting for another fetch into {path.parent.parent} to finish …")
        lock.acquire()
    return lock


def free_bytes(path: Path) -> int:
    """Free space on the filesystem that holds ``path`` (host fact; tests pass their own)."""
    for p in (path, *path.parents):
        if p.exists():
            return shutil.disk_usage(p).free
    return shutil.disk_usage("/").free


def _patch(
    ctx: _Ctx, verify: bool, confirm: Confirm | None, overwrite_edited: bool
) -> dict[str, tuple[str, str]]:
    """Apply the spec's config patches from the kept originals; idempotent.

    A patched file whose bytes are neither the patch rigsmith wrote last (the lock's ``patched_sha256``)
    nor the one it would write now was edited by hand: it is replaced only with consent (asked, or
    :data:`OVERWRITE_FLAG`); without a terminal the fetch stops, naming the file.
    """
    spec_patches = [p.model_dump(mode="json", exclude={"note"}) for p in ctx.spec.model.config_patches]
    recorded = {p.file: p for p in ctx.entry.patches}
    applied: dict[str, tuple[str, str]] = {}
    for file, plist in patches_by_file(ctx.spec.model.config_patches).items():
        target = ctx.root / file
        rec = recorded.get(file)
        if not verify and rec is not None and ctx.state.patches == spec_patches:
            try:
                st = target.stat()
            except FileNotFoundError:
                st = None
            if st is not None and still_verified(
                ctx.state.files.get(file), st.st_size, st.st_mtime_ns, "sha256", rec.patched_sha256
            ):
                applied[file] = (rec.original_sha256, rec.patched_sha256)
                continue
        original = (ctx.root / STATE_DIR / ORIGINAL_DIR / file).read_bytes()
        new = _patched(original, plist, file)
        a, b = sha256_bytes(original), sha256_bytes(new)
        ctx.hashed(len(original))
        current = target.read_bytes() if target.is_file() else None
        have = sha256_bytes(current) if current is not None else None
        if (
            rec is not None
            and have is not None
            and have not in (rec.patched_sha256, b, a)
            and not overwrite_edited
        ):
            question = (
                f"{target} was edited since fetch-model patched it (sha256 {have[:12]}, rigsmith wrote "
                f"{rec.patched_sha256[:12]}); replace your edit with the patched file?"
            )
            if confirm is None or not confirm(question):
                raise ConsentError(
                    f"{target} was changed by hand since fetch-model patched it; not replacing your edit",
                    hint=f"to keep the change, put it in model.config_patches of the spec; to discard it, "
                    f"re-run with {OVERWRITE_FLAG}",
                )
        if current is None or have != b:
            target = ctx.inside(file)
            write_one(target, new.decode("utf-8"))
            ctx.report.patched.append(file)
        ctx.record(file, "sha256", b)
        applied[file] = (a, b)
    ctx.state.patches = spec_patches
    return applied


# Over 80 lines, left whole for now: fetch-model's order (resolve, plan, disk space, download, verify, lock)
# is the function; it is also being reworked for lazy imports in parallel, so it is split after that lands.
def fetch_model(
    project: Project,
    spec: Deployment,
    *,
    dest: Path | None = None,
    verify: bool = False,
    repin: bool = False,
    echo: Echo = print,
    hub: Hub | HubFactory | None = None,
    disk_free: Callable[[Path], int] = free_bytes,
    workers: int = WORKERS,
    progress: bool | None = None,
    confirm: Confirm | None = None,
    adopt_dir: bool = False,
    overwrite_edited: bool = False,
    home: str | None = None,
    slot: lockmod.Slot | None = None,
    where: str = "model",
) -> FetchReport:
    """Download the locked model revision into its local dir, verify every file, apply config patches.

    Args:
        project: the checkout (lock read/written).
        spec: the deployment whose ``model`` section is fetched.
        dest: directory to fetch into instead of ``spec.model.local_dir``.
        verify: hash every file again even where the verified-state cache vouches for it.
        repin: re-resolve a branch/tag before fetching (shows what changed).
        echo: where status lines go.
        hub: Hub adapter (or factory); built only when a request is needed.
        disk_free: bytes free at a path (host fact).
        workers: files downloaded (or hashed) at once, 1 to :data:`MAX_WORKERS`.
        progress: show a rich progress bar (default: when stderr is a terminal).
        confirm: asks the user yes/no; None when there is no terminal (then every question is a no).
        adopt_dir: fetch into a non-empty directory that does not hold this model yet, without asking.
        overwrite_edited: replace a hand-edited patched file (config.json) without asking.
        home: the user's home directory (default: ``$HOME``), for the model-dir check.
        slot: where the model's lock entry lives (see :func:`pin_model`).
        where: the spec field of the model, for messages (``model``, ``secondary_models[0]``).

    Returns:
        What was done (downloaded, hashed, cached, cleaned, patched).

    Raises:
        RigsmithError: a bad spec field, the Hub refusing, a hash mismatch, too little disk space.
    """
    if not 1 <= workers <= MAX_WORKERS:
        raise RigsmithError(
            f"--workers {workers}: must be between 1 and {MAX_WORKERS}",
            hint=f"the default, {WORKERS}, matches `hf download`",
        )
    home = home if home is not None else warmfetch.user_home()
    if spec.model.repo is None:
        return _local(spec, dest, echo, home)
    field = "--dest" if dest is not None else f"{where}.local_dir"
    written = str(dest) if dest is not None else spec.model.local_dir
    check_model_dir(written, home, field)
    get_hub = _lazy(hub)
    slot = slot or lockmod.Slot(spec.name)
    entry = pin_model(project, spec, repin=repin, echo=echo, hub=get_hub, slot=slot)
    assert entry is not None
    m = spec.model
    root = dest.absolute() if dest is not None else expand_dir(m.local_dir, {"HOME": home})
    files = select(entry.files, m.allow_patterns, m.ignore_patterns)
    if not files:
        raise SpecError(
            where,
            [
                (
                    f"{where}.allow_patterns",
                    f"no file of {entry.repo}@{entry.commit[:12]} matches the allow/ignore patterns",
                )
            ],
        )
    check_patch_files(m.config_patches, files)
    by_file = patches_by_file(m.config_patches)
    wanted = wants(files, by_file)
    _guard_dir(root, field, home, entry, wanted, confirm, adopt_dir)

    try:
        (root / STATE_DIR).mkdir(parents=True, exist_ok=True)
    except OSError as err:
        raise RigsmithError(
            f"cannot create {root}: {err.strerror}", hint="pass --dest DIR you can write to"
        ) from None
    report = FetchReport(commit=entry.commit, local_dir=str(root), files=len(wanted))
    with _dir_lock(root / STATE_DIR / "fetch.lock", echo):
        state = read_state(root / STATE_DIR / STATE_FILE)
        state.repo, state.commit = entry.repo, entry.commit
        ctx = _Ctx(spec, entry, root, state, report, threading.Lock(), get_hub, threading.Event())
        report.cleaned = _clean(root, wanted)

        to_check: list[Want] = []
        for w in wanted:
            try:
                st = (root / w.disk_path).stat()
            except FileNotFoundError:
                st = None
            fresh = st is not None and still_verified(
                state.files.get(w.disk_path), st.st_size, st.st_mtime_ns, w.kind, w.digest
            )
            if fresh and not verify:
                report.cached += 1
            else:
                to_check.append(w)
        try:
            checked = _run_all(lambda w: _check(ctx, w), to_check, workers, ctx.stop)
        except KeyboardInterrupt:
            raise FetchInterrupted(
                "stopped while verifying the files on disk (those verified so far are remembered); run "
                "`invoke fetch-model` again to continue"
            ) from None
        for _w, res in checked:
            if isinstance(res, BaseException):
                raise res
        todo = [w for w, ok in checked if ok is not True]

        if todo:
            pdir = root / STATE_DIR / PARTIAL_DIR
            have = {w.repo_path: _size(pdir / w.partial_name) for w in todo}
            check_disk(sum(max(w.size - have[w.repo_path], 0) for w in todo), disk_free(root), root)
            for w in todo:
                if verify and (root / w.disk_path).exists():
                    echo(f"{w.repo_path}: does not match the lock; downloading it again")
            try:
                _download_all(ctx, todo, workers, progress)
            except KeyboardInterrupt:
                raise FetchInterrupted(
                    f"queued files cancelled; partial downloads kept in {root / STATE_DIR / PARTIAL_DIR}; "
                    "run `invoke fetch-model` again to resume"
                ) from None

        applied = _patch(ctx, verify, confirm, overwrite_edited)
        with ctx.mu:
            write_one(ctx.state_path, dump_state(state))

    new_patches = locked_patches(applied)
    if new_patches != entry.patches:
        with lockmod.locked(project.lock_path) as lock:
            cur = slot.get(lock)
            if cur is not None and cur.commit == entry.commit:
                slot.put(lock, cur.model_copy(update={"patches": new_patches}))
    if slot.repo is None and not spec.secondary_models:
        _mark(project, spec.name, dest, home, root, report)
    else:
        # A warm answer covers one model dir; with secondary models every run checks them all.
        warmfetch.forget(project.root, spec.name)
    return report


def _mark(project: Project, name: str, dest: Path | None, home: str, root: Path, report: FetchReport) -> None:
    """A run that changed nothing leaves the mark a warm re-run answers from (stats only); others drop it."""
    busy = report.downloaded or report.hashed_files or report.cleaned or report.patched
    if report.cached == report.files and not busy:
        warmfetch.record(project.root, name, dest, home, root, report.summary())
    else:
        warmfetch.forget(project.root, name)


def _guard_dir(
    root: Path,
    field: str,
    home: str,
    entry: LockedModel,
    wanted: Sequence[Want],
    confirm: Confirm | None,
    adopt: bool,
) -> None:
    """Refuse a model dir that is not dedicated to this model, on the disk (the text was checked before).

    The directory may be missing or empty, hold rigsmith's verified-state cache (a model dir rigsmith
    made), or hold only files of the locked snapshot (an earlier ``hf download``). Anything else is
    someone's directory: ask, showing what would be written over, or (no terminal) refuse naming the
    directory and :data:`ADOPT_FLAG`. Files that are not part of the snapshot are never touched either
    way: rigsmith writes only the snapshot's paths and its own ``.rigsmith/``.
    """
    real = root.resolve()
    if real != root:
        check_model_dir(str(real), _real(home), f"{field} (resolved through symlinks)")
    if not root.exists():
        return
    if not root.is_dir():
        raise RigsmithError(
            f"{root} is not a directory", hint=f"point {field} at a directory of its own for the model"
        )
    for book in (STATE_DIR, ".cache"):
        if (root / book).is_symlink():
            raise RigsmithError(
                f"{root / book} is a symlink; rigsmith keeps its book-keeping (and deletes stale partial "
                "files) there, so it must be a plain directory inside the model dir",
                hint=f"remove the symlink {root / book}",
            )
    if (root / STATE_DIR / STATE_FILE).is_file():
        return
    foreign = _foreign_files(root, entry)
    if not foreign or adopt:
        return
    present = sorted(w.repo_path for w in wanted if (root / w.repo_path).exists())
    shown = ", ".join(foreign[:5]) + (f" and {len(foreign) - 5} more" if len(foreign) > 5 else "")
    replaced = ", ".join(present[:10]) + (f" and {len(present) - 10} more" if len(present) > 10 else "")
    what = (
        f"{root} is not empty and does not hold {entry.repo} (not in the snapshot: {shown}); "
        f"fetch-model writes {len(wanted)} file(s) there"
        + (f", replacing any that differ from the snapshot: {replaced}" if present else "")
    )
    if confirm is not None and confirm(f"{what}. Files not in the snapshot are left alone. Fetch into it?"):
        return
    raise ConsentError(
        what,
        hint=f"point {field} at an empty directory of its own, or re-run with {ADOPT_FLAG} to fetch into "
        f"{root} anyway (files not in the snapshot are never touched)",
    )


def _real(home: str) -> str:
    """The home directory through its symlinks (``/home`` is ``/var/home`` on Fedora Atomic), so a model
    dir under it is judged as a subdirectory of home, not as something in ``/var``."""
    return str(Path(home).resolve()) if home else home


def _foreign_files(root: Path, entry: LockedModel) -> list[str]:
    """Paths under ``root`` that are not files of the locked snapshot (book-keeping dirs aside)."""
    foreign: list[str] = []
    seen = 0
    for dirpath, dirnames, filenames in os.walk(root):
        rel_dir = Path(dirpath).relative_to(root)
        if rel_dir == Path():
            dirnames[:] = [d for d in dirnames if d not in (STATE_DIR, ".cache")]
        for name in (*filenames, *(d for d in dirnames if Path(dirpath, d).is_symlink())):
            seen += 1
            rel = (rel_dir / name).as_posix()
            if rel not in entry.files:
                foreign.append(rel)
            if seen >= SCAN_LIMIT or len(foreign) >= 100:
                return sorted(foreign)
    return sorted(foreign)


def _size(p: Path) -> int:
    try:
        return p.stat().st_size
    except FileNotFoundError:
        return 0


def _download_all(ctx: _Ctx, todo: Sequence[Want], workers: int, progress: bool | None) -> None:
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
            for _w, res in _run_all(lambda w: _download(ctx, w), todo, workers, ctx.stop):
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


# -- local checkpoints (model.repo: null) ---------------------------------------------------------------

#: File suffixes that hold weights, for the report.
_WEIGHT_SUFFIXES = (".safetensors", ".bin", ".pt", ".pth", ".gguf")


def _local(spec: Deployment, dest: Path | None, echo: Echo, home: str) -> FetchReport:
    """A checkpoint already on disk: report what is there and apply the config patches; download nothing."""
    m = spec.model
    if dest is None and not m.local_dir.startswith(("/", "~")):
        raise SpecError(
            "model.local_dir",
            [
                (
                    "model.local_dir",
                    f"{m.local_dir!r} is relative (to where the recipe ran); set the checkpoint's absolute "
                    "path",
                )
            ],
        )
    root = dest.absolute() if dest is not None else expand_dir(m.local_dir, {"HOME": home})
    if not root.is_dir():
        raise RigsmithError(
            f"{spec.name}: model.repo is null, so the checkpoint is local and there is nothing to download "
            f"— but {root} is not a directory",
            hint="copy the checkpoint there, point model.local_dir at it, or set model.repo to owner/name to "
            "download it",
        )
    files = sorted(p for p in root.rglob("*") if p.is_file() and p.relative_to(root).parts[0] != STATE_DIR)
    report = FetchReport(
        local_dir=str(root),
        files=len(files),
        local=True,
        local_bytes=sum(p.stat().st_size for p in files),
        weight_files=sum(p.name.endswith(_WEIGHT_SUFFIXES) for p in files),
        has_config=(root / "config.json").is_file(),
    )
    if m.config_patches:
        # Patching writes into the checkpoint dir: the same refusals as a download.
        check_model_dir(
            str(dest) if dest is not None else m.local_dir, home, "--dest" if dest else "model.local_dir"
        )
        check_model_dir(str(root.resolve()), _real(home), "model.local_dir (resolved through symlinks)")
        with _dir_lock(root / STATE_DIR / "fetch.lock", echo):
            _patch_local(spec, root, report, echo)
    return report


def _patch_local(spec: Deployment, root: Path, report: FetchReport, echo: Echo) -> None:
    """Config patches on a local checkpoint: the first-seen bytes are kept as the original, as for the Hub.

    A file that matches neither the kept original nor its patched form was replaced outside rigsmith (a new
    checkpoint copied in); it becomes the new original, and rigsmith says so.
    """
    missing = [
        (f"model.config_patches[{i}].file", f"{p.file} is not in the local checkpoint {root}")
        for i, p in enumerate(spec.model.config_patches)
        if not (root / p.file).is_file() and not (root / STATE_DIR / ORIGINAL_DIR / p.file).is_file()
    ]
    if missing:
        raise SpecError("model.config_patches", missing)
    for file, plist in patches_by_file(spec.model.config_patches).items():
        target, kept = root / file, root / STATE_DIR / ORIGINAL_DIR / file
        current = target.read_bytes() if target.is_file() else None
        original = kept.read_bytes() if kept.is_file() else current
        assert original is not None
        new = _patched(original, plist, file)
        if current is not None and current not in (original, new):
            echo(f"{file}: changed outside rigsmith since it was patched; keeping it as the new original")
            original = current
            new = _patched(original, plist, file)
        if not kept.is_file() or kept.read_bytes() != original:
            kept.parent.mkdir(parents=True, exist_ok=True)
            write_one(kept, original.decode("utf-8"))
        if current != new:
            write_one(target, new.decode("utf-8"))
            report.patched.append(file)


def _patched(original: bytes, plist: Sequence[tuple[int, Any]], file: str) -> bytes:
    try:
        text = original.decode("utf-8")
    except UnicodeDecodeError:
        raise SpecError(
            "model.config_patches",
            [(f"model.config_patches[{plist[0][0]}].file", f"{file} is not UTF-8 text")],
        ) from None
    return patch_json(text, plist, file).encode("utf-8")
