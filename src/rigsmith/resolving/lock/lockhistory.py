"""Every change of ``rigsmith.lock`` kept: ``<checkout>/.rigsmith/locks/``.

``NNNN.lock`` holds the lock's exact text after change N; ``index.jsonl`` one row per change (number,
UTC time, the command that made it, an optional reason, the text's sha256; an upgrade's row also names the
last-known-good it kept, ``last_good``, and a change its own command undid again is ``rolled_back``).
:func:`record` is called by the lock's one writer (``lock.locked``) while it still holds the lock's file
lock, so rows never interleave. The first change a checkout records also keeps the lock as it was before
(number 1, command ``(before history)``), so the very first change can be shown as a diff.

One entry per user action: every command runs inside :func:`because` (``rigsmith.cli.wiring.user_errors``),
and the writes one command makes (``pin``: its images, then its model; ``upgrade``: the repin, then the
config patches fetch applies) amend the entry its first write made. A command that puts the lock back where
it found it (an upgrade that rolls back) keeps its entry as the record of what it tried, marked rolled back,
and the lock is again the entry it started from.

Every file here is read through the confinement rule (``rigsmith.confine``): a regular file inside the
history directory, never through a link, never a FIFO (opened non-blocking); a missing or damaged entry is
a LockError naming it, never an empty lock.

Text only: this module knows nothing of the lock's fields (``rigsmith.resolving.lock.lockdiff`` compares two).
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from rigsmith import confine
from rigsmith.errors import LockError, shown
from rigsmith.writer import write_one

#: Where, beside a rigsmith.lock, its history lives.
HISTORY_DIR = Path(".rigsmith") / "locks"
INDEX = "index.jsonl"
#: Only a file of this name keeps a history (a staged lock written beside it does not).
LOCK_NAME = "rigsmith.lock"
_DAMAGED_HINT = (
    "restore .rigsmith/locks/ from a backup, or move that directory aside to start a new history "
    "(rigsmith.lock itself is not touched)"
)


@dataclass(frozen=True)
class _Cause:
    command: str
    reason: str | None = None
    last_good: int | None = None


@dataclass
class _Action:
    """One command's writes (per lock path): the entry it wrote, the lock's sha256 before its first write
    and after its last."""

    wrote: dict[str, int] = field(default_factory=dict)
    start: dict[str, str | None] = field(default_factory=dict)
    last: dict[str, str] = field(default_factory=dict)


_because: ContextVar[_Cause | None] = ContextVar("rigsmith_lock_because", default=None)
_action: ContextVar[_Action | None] = ContextVar("rigsmith_lock_action", default=None)


@dataclass(frozen=True)
class Entry:
    """One recorded lock."""

    n: int
    time: str
    command: str
    reason: str | None
    sha256: str
    last_good: int | None = None
    rolled_back: bool = False

    @property
    def name(self) -> str:
        return f"{self.n:04d}.lock"

    def text(self, lock_path: Path) -> str:
        """The lock text recorded as number ``n`` (LockError naming the entry when it is missing, not a
        regular file inside the history directory, or not the text its index row records)."""
        text = _read(lock_path, self.name, f"lock history entry {self.n}")
        if sha256(text) != self.sha256:
            raise LockError(
                f"lock history entry {self.n} ({history_dir(lock_path) / self.name}) is damaged: its text is "
                f"not the one {INDEX} records for it (sha256 differs)",
                hint=_DAMAGED_HINT,
            )
        return text

    def described(self) -> str:
        """The command and reason as the terminal may show them (foreign text: errors.shown)."""
        why = f" — {self.reason}" if self.reason else ""
        return shown(f"{self.command}{why}")


@contextmanager
def because(command: str, reason: str | None = None, *, last_good: int | None = None) -> Iterator[None]:
    """Lock changes made inside are recorded as made by ``command`` (and why, when given; ``last_good``:
    the entry an upgrade keeps to roll back to). The outermost one is the user's action: every change made
    inside it goes into one entry."""
    action, outer = _action.get(), _because.get()
    if last_good is None and outer is not None:
        last_good = outer.last_good
    token_a = _action.set(action or _Action())
    token = _because.set(_Cause(command, reason, last_good))
    try:
        yield
    finally:
        _because.reset(token)
        _action.reset(token_a)


def current_cause() -> tuple[str, str | None]:
    """(command, reason) a change made now is recorded with; without :func:`because`, the process's argv."""
    cause = _cause()
    return cause.command, cause.reason


def _cause() -> _Cause:
    set_ = _because.get()
    if set_ is not None:
        return set_
    argv = " ".join(Path(sys.argv[0]).name if i == 0 else a for i, a in enumerate(sys.argv))
    return _Cause(argv or "?")


def history_dir(lock_path: Path) -> Path:
    return lock_path.parent / HISTORY_DIR


def sha256(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


def _read(lock_path: Path, name: str, what: str) -> str:
    """A file of the history directory as text, through the confinement rule."""
    rel = f"{HISTORY_DIR.as_posix()}/{name}"
    try:
        data = confine.read_regular(lock_path.parent, rel, what, LockError)
    except LockError as err:
        raise LockError(err.message, hint=_DAMAGED_HINT) from None
    except OSError as err:
        raise LockError(
            f"{what} ({lock_path.parent / rel}) cannot be read: {err.strerror}", hint=_DAMAGED_HINT
        ) from None
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as err:
        raise LockError(
            f"{what} ({lock_path.parent / rel}) is damaged: byte {err.start} is not UTF-8 text",
            hint=_DAMAGED_HINT,
        ) from None


def _exists(lock_path: Path, name: str) -> bool:
    try:
        os.lstat(history_dir(lock_path) / name)
    except FileNotFoundError:
        return False
    except NotADirectoryError:
        return True  # a file where the directory should be: reading it says so
    return True


_SHA = re.compile(r"[0-9a-f]{64}")


def _row(row: Any) -> Entry:
    """One index row as an Entry (ValueError saying what is wrong)."""
    if not isinstance(row, dict):
        raise ValueError("it is not a JSON object")
    n, sha, time, command = row.get("n"), row.get("sha256"), row.get("time"), row.get("command")
    if not isinstance(n, int) or isinstance(n, bool) or not 0 < n < 10**6:
        raise ValueError("'n' is not an entry number")
    if not isinstance(sha, str) or not _SHA.fullmatch(sha):
        raise ValueError("'sha256' is not a sha256")
    if not isinstance(time, str) or not isinstance(command, str):
        raise ValueError("'time' or 'command' is not text")
    reason, last_good, rolled = row.get("reason"), row.get("last_good"), row.get("rolled_back", False)
    if reason is not None and not isinstance(reason, str):
        raise ValueError("'reason' is not text")
    if last_good is not None and (not isinstance(last_good, int) or isinstance(last_good, bool)):
        raise ValueError("'last_good' is not an entry number")
    if not isinstance(rolled, bool):
        raise ValueError("'rolled_back' is not true or false")
    return Entry(n, time, command, reason, sha, last_good, rolled)


def entries(lock_path: Path) -> list[Entry]:
    """Recorded locks, oldest first; none when there is no history yet. A row that is not one (torn JSON,
    a missing field, a number out of order) is a LockError naming its line."""
    if not _exists(lock_path, INDEX):
        return []
    out: list[Entry] = []
    for i, line in enumerate(_read(lock_path, INDEX, "lock history index").splitlines(), 1):
        try:
            e = _row(json.loads(line))
            if out and e.n <= out[-1].n:
                raise ValueError(f"entry {e.n} comes after entry {out[-1].n}")
        except ValueError as err:  # json.JSONDecodeError is a ValueError
            raise LockError(
                f"lock history index {history_dir(lock_path) / INDEX} line {i} is damaged: {shown(str(err))}",
                hint=_DAMAGED_HINT,
            ) from None
        out.append(e)
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


def _write_index(lock_path: Path, rows: list[Entry]) -> None:
    lines = []
    for e in rows:
        row: dict[str, Any] = {
            "n": e.n,
            "time": e.time,
            "command": e.command,
            "reason": e.reason,
            "sha256": e.sha256,
        }
        if e.last_good is not None:
            row["last_good"] = e.last_good
        if e.rolled_back:
            row["rolled_back"] = True
        lines.append(json.dumps(row, sort_keys=True) + "\n")
    write_one(history_dir(lock_path) / INDEX, "".join(lines))


def _append(lock_path: Path, have: list[Entry], text: str, cause: _Cause, when: str) -> Entry:
    history_dir(lock_path).mkdir(parents=True, exist_ok=True)
    e = Entry(
        (have[-1].n if have else 0) + 1, when, cause.command, cause.reason, sha256(text), cause.last_good
    )
    write_one(history_dir(lock_path) / e.name, text)
    _write_index(lock_path, [*have, e])
    have.append(e)
    return e


def record(lock_path: Path, before: str | None, after: str, when: str | None = None) -> int | None:
    """Keep ``after`` as this action's entry (the caller holds the lock's file lock); None when nothing
    changed. A lock that already existed before its first recorded change is kept first, as it was."""
    if lock_path.name != LOCK_NAME or before == after:
        return None
    stamp = when or datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    have = entries(lock_path)
    action = _action.get()
    key = str(lock_path.absolute())
    last_written = action.last.get(key) if action else None
    if before and (not have or have[-1].sha256 != sha256(before)) and sha256(before) != last_written:
        how = "(before history)" if not have else "(changed outside rigsmith)"
        _append(lock_path, have, before, _Cause(how), stamp)
    cause = _cause()
    mine = action.wrote.get(key) if action else None
    if action is None or mine is None or have[-1].n != mine:
        e = _append(lock_path, have, after, cause, stamp)
        if action is not None:
            action.wrote[key], action.start[key] = e.n, sha256(before) if before else None
            action.last[key] = e.sha256
        return e.n
    last = have[-1]
    reason = cause.reason if cause.reason and cause.reason != last.reason else None
    action.last[key] = sha256(after)
    if action.start.get(key) == sha256(after):
        # the action put the lock back where it found it: its entry stays as the record of what it tried
        joined = "; ".join(r for r in (last.reason, reason) if r) or None
        _write_index(lock_path, [*have[:-1], replace(last, reason=joined, rolled_back=True)])
        del action.wrote[key]  # a later write of this action is a change of its own
        return current_number(lock_path, after)
    write_one(history_dir(lock_path) / last.name, after)
    amended = replace(
        last,
        time=stamp,
        sha256=sha256(after),
        reason=reason or last.reason,
        last_good=cause.last_good if cause.last_good is not None else last.last_good,
    )
    _write_index(lock_path, [*have[:-1], amended])
    return last.n


def mark_current(lock_path: Path, reason: str | None = None) -> int:
    """The entry number of the lock as it is now, recording it first when no entry holds its text (the
    caller holds the lock's file lock)."""
    text = lock_path.read_text(encoding="utf-8")
    n = current_number(lock_path, text)
    if n is not None:
        return n
    stamp = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    return _append(lock_path, entries(lock_path), text, _Cause("(changed outside rigsmith)", reason), stamp).n


def rollback_target(lock_path: Path) -> Entry | None:
    """What a bare ``rollback`` returns to: when the lock is an upgrade's entry, the last-known-good it
    kept; else the newest earlier entry that ran (not one its own command rolled back) with other text."""
    have = entries(lock_path)
    try:
        text = lock_path.read_text(encoding="utf-8")
    except FileNotFoundError:
        text = ""
    now = current_number(lock_path, text)
    by_n = {e.n: e for e in have}
    here = by_n.get(now) if now is not None else None
    if here is not None and here.last_good in by_n and by_n[here.last_good].sha256 != here.sha256:
        return by_n[here.last_good]
    digest = sha256(text)
    for e in reversed(have):
        if (now is None or e.n < now) and e.sha256 != digest and not e.rolled_back:
            return e
    return None
