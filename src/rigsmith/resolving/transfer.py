"""What every fetch shares, warm or not: the run's context (the verified-file record, the report, the stop
flag), checking a file already on disk against the lock, and the worker pool that stops on Ctrl-C.
Moving bytes is :mod:`rigsmith.resolving.download`, loaded only when something must be downloaded.
"""

from __future__ import annotations

import shutil
import threading
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from rigsmith.errors import RigsmithError
from rigsmith.resolving.lock import LockedModel
from rigsmith.resolving.modelfiles import (
    ORIGINAL_DIR,
    STATE_DIR,
    STATE_FILE,
    DirState,
    FetchReport,
    HashKind,
    Want,
    dump_state,
    hash_file,
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
    #: Set once a large file turned out not to be on Xet (or hf_xet is off): later files skip the question.
    no_xet: bool = False
    #: The connections that download ranges of large files (:mod:`~rigsmith.resolving.parts`).
    ranges: ThreadPoolExecutor | None = None
    #: Set once a server answered a range other than as asked: later files skip the ranged route.
    no_ranges: bool = False
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
