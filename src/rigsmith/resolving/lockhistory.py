"""Every change of ``rigsmith.lock`` kept: ``<checkout>/.rigsmith/locks/``.

``NNNN.lock`` holds the lock's exact text after change N; ``index.jsonl`` one row per change (number,
UTC time, the command that made it, an optional reason, the text's sha256). :func:`record` is called by
the lock's one writer (``lock.locked``) while it still holds the lock's file lock, so rows never interleave.
The first change a checkout records also keeps the lock as it was before (number 1, command
``(before history)``), so the very first change can be shown as a diff.

Text only: this module knows nothing of the lock's fields (``rigsmith.resolving.lockdiff`` compares two).
The command and reason come from :func:`because` (tasks name themselves; upgrade and rollback say why).
"""

from __future__ import annotations

import hashlib
import json
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

from rigsmith.errors import LockError
from rigsmith.writer import write_one

#: Where, beside a rigsmith.lock, its history lives.
HISTORY_DIR = Path(".rigsmith") / "locks"
INDEX = "index.jsonl"
#: Only a file of this name keeps a history (a staged lock written beside it does not).
LOCK_NAME = "rigsmith.lock"

_because: ContextVar[tuple[str, str | None] | None] = ContextVar("rigsmith_lock_because", default=None)


@dataclass(frozen=True)
class Entry:
    """One recorded lock."""

    n: int
    time: str
    command: str
    reason: str | None
    sha256: str

    def text(self, lock_path: Path) -> str:
        """The lock text recorded as number ``n``."""
        path = history_dir(lock_path) / f"{self.n:04d}.lock"
        try:
            return path.read_text(encoding="utf-8")
        except OSError as err:
            raise LockError(
                f"lock history entry {self.n} ({path}) cannot be read: {err.strerror or err}",
                hint="`invoke lock --history` lists the entries that are there",
            ) from None


@contextmanager
def because(command: str, reason: str | None = None) -> Iterator[None]:
    """Lock changes made inside are recorded as made by ``command`` (and why, when given)."""
    token = _because.set((command, reason))
    try:
        yield
    finally:
        _because.reset(token)


def current_cause() -> tuple[str, str | None]:
    """(command, reason) a change made now is recorded with; without :func:`because`, the process's argv."""
    set_ = _because.get()
    if set_ is not None:
        return set_
    return " ".join(Path(sys.argv[0]).name if i == 0 else a for i, a in enumerate(sys.argv)) or "?", None


def history_dir(lock_path: Path) -> Path:
    return lock_path.parent / HISTORY_DIR


def sha256(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


def entries(lock_path: Path) -> list[Entry]:
    """Recorded locks, oldest first (a torn or foreign row is skipped, not fatal)."""
    try:
        lines = (history_dir(lock_path) / INDEX).read_text(encoding="utf-8").splitlines()
    except FileNotFoundError:
        return []
    out = []
    for line in lines:
        try:
            row = json.loads(line)
            out.append(
                Entry(
                    int(row["n"]),
                    str(row["time"]),
                    str(row["command"]),
                    None if row.get("reason") is None else str(row["reason"]),
                    str(row["sha256"]),
                )
            )
        except (json.JSONDecodeError, KeyError, TypeError, ValueError):
            continue
    return out


def entry(lock_path: Path, n: int) -> Entry:
    """Recorded lock number ``n``, or a LockError naming the numbers there are."""
    have = entries(lock_path)
    for e in have:
        if e.n == n:
            return e
    there = f"entries {have[0].n}–{have[-1].n}" if have else "no entries yet"
    raise LockError(
        f"rigsmith.lock history has no entry {n} ({there})",
        hint="`invoke lock --history` lists them",
    )


def current_number(lock_path: Path, text: str | None = None) -> int | None:
    """The newest entry whose text is the lock's current text (None: the lock changed outside rigsmith)."""
    if text is None:
        try:
            text = lock_path.read_text(encoding="utf-8")
        except FileNotFoundError:
            return None
    digest = sha256(text)
    for e in reversed(entries(lock_path)):
        if e.sha256 == digest:
            return e.n
    return None


def _append(lock_path: Path, text: str, command: str, reason: str | None, when: str) -> int:
    d = history_dir(lock_path)
    d.mkdir(parents=True, exist_ok=True)
    have = entries(lock_path)
    n = (have[-1].n if have else 0) + 1
    write_one(d / f"{n:04d}.lock", text)
    row = {"n": n, "time": when, "command": command, "reason": reason, "sha256": sha256(text)}
    index = d / INDEX
    old = index.read_text(encoding="utf-8") if index.exists() else ""
    write_one(index, old + json.dumps(row, sort_keys=True) + "\n")
    return n


def record(lock_path: Path, before: str | None, after: str, when: str | None = None) -> int | None:
    """Keep ``after`` as the next entry (the caller holds the lock's file lock); None when nothing changed.

    A lock that already existed before its first recorded change is kept first, as it was."""
    if lock_path.name != LOCK_NAME or before == after:
        return None
    stamp = when or datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    have = entries(lock_path)
    if before and (not have or have[-1].sha256 != sha256(before)):
        how = "(before history)" if not have else "(changed outside rigsmith)"
        _append(lock_path, before, how, None, stamp)
    command, reason = current_cause()
    return _append(lock_path, after, command, reason, stamp)


def mark_current(lock_path: Path, reason: str | None = None) -> int:
    """The entry number of the lock as it is now, recording it first when no entry holds its text (the
    caller holds the lock's file lock)."""
    text = lock_path.read_text(encoding="utf-8")
    n = current_number(lock_path, text)
    if n is not None:
        return n
    stamp = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    return _append(lock_path, text, "(changed outside rigsmith)", reason, stamp)
