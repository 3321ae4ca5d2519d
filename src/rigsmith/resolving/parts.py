"""A large file downloaded as several byte ranges at once, hashed in order beside them, resumable exactly.

The partial file (``.rigsmith/partial/<hash>.incomplete``) is allocated at its full size; each range is
written at its offset (``os.pwrite``) by a connection of a shared pool, and a record beside it
(``<hash>.ranges``) lists the byte spans known to be written. The calling thread hashes the file from the
start as far as the spans reach without a gap, reading the bytes back from the page cache while later
ranges are still arriving (``hashlib`` releases the GIL on large buffers, so the hash runs beside the
transfers). A killed run leaves the partial and the record; the next run asks only for the spans the record
does not list, and hashes every byte again, resumed or not, before the file may take its real name.

A partial without a record (from a plain sequential download) counts as written from its start to its
length.
"""

from __future__ import annotations

import ctypes
import json
import os
import threading
from collections.abc import Callable
from concurrent.futures import Executor, Future
from pathlib import Path
from typing import cast

from rigsmith.resolving.modelfiles import Hasher, HashKind, Stopped, hash_stream

#: Bytes of one range request (a file smaller than two of these is downloaded in one request).
PART_BYTES = 64 << 20
#: Bytes hashed per read of the partial file.
HASH_READ = 1 << 20
#: The record is rewritten after at least this many new bytes (and when the download ends, either way).
RECORD_STEP = 64 << 20
RECORD_SUFFIX = ".ranges"
#: Ask the kernel to start writing the file out every this many new bytes (:func:`start_writeback`).
WRITEBACK_STEP = 16 << 20

#: ``get(start, end, write)``: fetch bytes ``start``..``end`` of the file, ``write(offset, block)`` each.
Get = Callable[[int, int, Callable[[int, memoryview], None]], None]


def _load_sync_file_range() -> Callable[[int, int, int, int], int] | None:
    try:
        fn = ctypes.CDLL(None, use_errno=True).sync_file_range
    except (AttributeError, OSError):
        return None  # not Linux/glibc: the fsync before the rename does all the work
    fn.argtypes = [ctypes.c_int, ctypes.c_int64, ctypes.c_int64, ctypes.c_uint]
    fn.restype = ctypes.c_int
    return cast(Callable[[int, int, int, int], int], fn)


_SYNC_FILE_RANGE = _load_sync_file_range()
_SYNC_FILE_RANGE_WRITE = 2  # <linux/fs.h>: start writeback of dirty pages in the range, do not wait


def start_writeback(fd: int, offset: int, n: int) -> None:
    """Start (not wait for) writing ``n`` bytes at ``offset`` to disk; a hint, errors are ignored.

    Without it a fresh download stays dirty in the page cache until the fsync (or the kernel's 30 s /
    dirty_background_ratio writeback), and the fsync then writes the whole file while nothing else
    happens. PostgreSQL does the same for its checkpoints (``pg_flush_data``, ``*_flush_after``).
    """
    if _SYNC_FILE_RANGE is not None:
        _SYNC_FILE_RANGE(fd, offset, n, _SYNC_FILE_RANGE_WRITE)


def record_path(partial: Path) -> Path:
    return partial.with_suffix(RECORD_SUFFIX)


def read_record(partial: Path, size: int) -> list[tuple[int, int]]:
    """The spans of ``partial`` known to hold the file's bytes (sorted, merged); [] when nothing is."""
    try:
        have = partial.stat().st_size
    except FileNotFoundError:
        return []
    try:
        data = json.loads(record_path(partial).read_text())
    except FileNotFoundError:
        return [(0, min(have, size))] if have else []  # a sequential partial: its length is what it holds
    except (OSError, ValueError):
        return []
    if not isinstance(data, dict) or data.get("size") != size or have != size:
        return []
    spans = data.get("done")
    if not isinstance(spans, list) or not all(
        isinstance(s, list)
        and len(s) == 2
        and all(isinstance(x, int) for x in s)
        and 0 <= s[0] < s[1] <= size
        for s in spans
    ):
        return []
    return _merge([(s[0], s[1]) for s in spans])


def _merge(spans: list[tuple[int, int]]) -> list[tuple[int, int]]:
    out: list[tuple[int, int]] = []
    for a, b in sorted(spans):
        if out and a <= out[-1][1]:
            out[-1] = (out[-1][0], max(out[-1][1], b))
        else:
            out.append((a, b))
    return out


def missing(done: list[tuple[int, int]], size: int, part: int | None = None) -> list[tuple[int, int]]:
    """The spans of ``0..size`` not in ``done``, cut into ranges of at most ``part`` (:data:`PART_BYTES`)."""
    part = part or PART_BYTES
    out: list[tuple[int, int]] = []
    pos = 0
    for a, b in [*done, (size, size)]:
        for s in range(pos, a, part):
            out.append((s, min(s + part, a)))
        pos = max(pos, b)
    return out


class _Written:
    """The spans written so far (shared by the transfers and the hashing thread)."""

    def __init__(self, partial: Path, size: int, done: list[tuple[int, int]]) -> None:
        self.spans = list(done)
        self.cond = threading.Condition()
        self.error: BaseException | None = None
        self._record, self._size = record_path(partial), size
        self._unrecorded = 0
        self._save_mu = threading.Lock()

    def add(self, a: int, b: int) -> None:
        with self.cond:
            self.spans = _merge([*self.spans, (a, b)])
            self._unrecorded += b - a
            due = self._unrecorded >= RECORD_STEP
            if due:
                self._unrecorded = 0
            spans = list(self.spans)
            self.cond.notify_all()
        if due:
            self.save(spans)

    def prefix(self) -> int:
        return self.spans[0][1] if self.spans and self.spans[0][0] == 0 else 0

    def save(self, spans: list[tuple[int, int]] | None = None) -> None:
        """Rewrite the record with ``spans`` (default: all written so far), replaced whole.

        Not fsynced, and never under ``cond``: an fsync here waits for the journal, that is for the
        writeback of every range in flight, and the transfers would wait with it. A record that claims
        bytes a power cut lost is caught by the hash before the rename, like any other wrong byte.
        """
        if spans is None:
            with self.cond:
                spans = list(self.spans)
        with self._save_mu:  # a slower save of an older list may land last: it claims less, never more
            tmp = self._record.with_name(self._record.name + ".tmp")
            tmp.write_text(json.dumps({"size": self._size, "done": spans}))
            tmp.replace(self._record)

    def fail(self, err: BaseException) -> None:
        with self.cond:
            if self.error is None:
                self.error = err
            self.cond.notify_all()


def fetch_parts(
    partial: Path,
    kind: HashKind,
    size: int,
    get: Get,
    pool: Executor,
    on_bytes: Callable[[int], None],
    stop: threading.Event,
) -> tuple[str, int, int]:
    """Download what ``partial`` lacks as ranges on ``pool``, hashing the whole file in order meanwhile.

    Returns:
        (hex digest of all ``size`` bytes, bytes resumed from an earlier run, bytes downloaded now).

    Raises:
        whatever a range raised first (the others are stopped and the record is saved, so a re-run resumes),
        Stopped: ``stop`` was set.
    """
    done = read_record(partial, size)
    resumed = sum(b - a for a, b in done)
    fd = os.open(partial, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        if os.fstat(fd).st_size != size:
            os.ftruncate(fd, size)
        written = _Written(partial, size, done)
        written.save()  # from here on the partial's length says nothing; the record does
        halt = threading.Event()
        got = [0]

        def write(off: int, block: memoryview) -> None:
            if halt.is_set():
                raise Stopped("stopped")
            n = _pwrite_all(fd, block, off)
            written.add(off, off + n)
            got[0] += n
            if got[0] // WRITEBACK_STEP != (got[0] - n) // WRITEBACK_STEP:
                start_writeback(fd, 0, 0)  # the whole file's dirty pages (0 bytes: to its end)
            on_bytes(n)

        def one(a: int, b: int) -> None:
            try:
                if not halt.is_set():
                    get(a, b, write)
                    with written.cond:
                        if not any(x <= a and b <= y for x, y in written.spans):
                            raise OSError(f"bytes {a}-{b - 1} did not all arrive")
            except BaseException as err:
                written.fail(err)

        futs: list[Future[None]] = [pool.submit(one, a, b) for a, b in missing(done, size)]
        try:
            digest = _hash_along(fd, kind, size, written, stop)
        finally:
            halt.set()
            for f in futs:
                f.cancel()
            for f in futs:
                if not f.cancelled():
                    f.result()
            written.save()
        return digest, resumed, got[0]
    finally:
        os.close(fd)


def fetch_whole(
    partial: Path,
    kind: HashKind,
    size: int,
    get: Get,
    on_bytes: Callable[[int], None],
    stop: threading.Event,
) -> tuple[str, int, int]:
    """Download what ``partial`` lacks after its written prefix as one range, hashed as it arrives.

    The route for a file that does not need ranges in flight together (other files keep the connections
    busy): each block is written and then hashed straight from the receive buffer, still in cache, not
    read back. A ranged partial (with a record) is first cut at its first gap.

    Returns:
        (hex digest of all ``size`` bytes, bytes resumed from an earlier run, bytes downloaded now).
    """
    spans = read_record(partial, size)
    have = spans[0][1] if spans and spans[0][0] == 0 else 0
    fd = os.open(partial, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        os.ftruncate(fd, have)
        record_path(partial).unlink(missing_ok=True)
        with open(fd, "rb", closefd=False) as fh:
            hasher = hash_stream(kind, size, fh, limit=have, stop=stop) if have else Hasher(kind, size)
        on_bytes(have)
        pos = have

        def write(off: int, block: memoryview) -> None:
            nonlocal pos
            if stop.is_set():
                raise Stopped("stopped")
            if off != pos:
                raise OSError(f"a block for byte {off} arrived at byte {pos}")
            n = _pwrite_all(fd, block, off)
            hasher.update(block)
            pos += n
            if pos // WRITEBACK_STEP != (pos - n) // WRITEBACK_STEP:
                start_writeback(fd, 0, 0)  # the whole file's dirty pages (0 bytes: to its end)
            on_bytes(n)

        if have < size:
            get(have, size, write)
        return hasher.hexdigest(), have, pos - have
    finally:
        os.close(fd)


def _pwrite_all(fd: int, block: memoryview, off: int) -> int:
    """Write all of ``block`` at ``off`` (a write may take less than it was given); its length."""
    n = 0
    while n < len(block):
        n += os.pwrite(fd, block[n:], off + n)
    return n


def _hash_along(fd: int, kind: HashKind, size: int, written: _Written, stop: threading.Event) -> str:
    """Hash bytes 0..size of ``fd`` as the written spans reach them; raise the first range's error.

    The bytes are read back (``preadv`` into one small buffer) from the page cache, where they have just
    been written; the ranges arrive out of order, so they cannot be hashed as they come."""
    hasher = Hasher(kind, size)
    buf = memoryview(bytearray(HASH_READ))
    pos = 0
    while pos < size:
        with written.cond:
            while written.prefix() <= pos and written.error is None and not stop.is_set():
                written.cond.wait(0.2)
            if written.error is not None:
                raise written.error
            if stop.is_set():
                raise Stopped("stopped")
            upto = written.prefix()
        while pos < upto:
            n = os.preadv(fd, [buf[: min(HASH_READ, upto - pos)]], pos)
            if n <= 0:
                raise OSError(f"the partial file ended at byte {pos} of {size}")
            hasher.update(buf[:n])
            pos += n
    return hasher.hexdigest()
