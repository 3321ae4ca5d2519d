"""A readable difference between two locks: what an upgrade, a repin or a rollback changes.

Per deployment: the model commit and its files added / removed / changed (with sizes), config patches,
each secondary model the same way; per image reference its digest; per build its image ID, pushed digest,
base and patches; per source tree its commit and assets. Lines are plain text, one fact each, in a stable
order, so a test (or a user) can read them. ``diff``/``summary`` are pure; ``history_lines``/``diff_lines``
read the recorded locks (``rigsmith.resolving.lock.lockhistory``).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from rigsmith.errors import shown
from rigsmith.resolving.lock import lockhistory
from rigsmith.resolving.lock.lock import (
    Lock,
    LockedBuild,
    LockedModel,
    LockedSource,
    file_changes,
    parse,
    read,
)


def human_size(n: int) -> str:
    """1536 → '1.5 KiB'."""
    size = float(n)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if size < 1024 or unit == "GiB":
            return f"{int(size)} {unit}" if unit == "B" else f"{size:.1f} {unit}"
        size /= 1024
    return f"{n} B"  # pragma: no cover (the loop returns at GiB)


def _short(value: str | None) -> str:
    """A commit, digest or hash cut to 12 hex digits (a name@digest keeps its name)."""
    if value is None:
        return "(none)"
    name, at, digest = value.rpartition("@")
    if at:
        return f"{name}@{_short(digest)}"
    if value.startswith("sha256:"):
        return "sha256:" + value[7:19]
    return value[:12] if re.fullmatch(r"[0-9a-f]{40}|[0-9a-f]{64}", value) else value


def _model(where: str, old: LockedModel | None, new: LockedModel | None) -> list[str]:
    if old is None and new is None:
        return []
    if old is None:
        assert new is not None
        return [f"{where}: added {new.repo}@{_short(new.commit)} ({len(new.files)} files)"]
    if new is None:
        return [f"{where}: removed {old.repo}@{_short(old.commit)}"]
    out = []
    if old.repo != new.repo:
        out.append(f"{where}: repo {old.repo} → {new.repo}")
    if old.commit != new.commit:
        out.append(f"{where}: commit {_short(old.commit)} → {_short(new.commit)} ({new.repo})")
    for sign, path, a, b in file_changes(old.files, new.files):
        sizes = [human_size(f.size) for f in (a, b) if f is not None]
        out.append(f"{where}: {sign} {path} ({' → '.join(sizes)})")
    pa = {p.file: p.patched_sha256 for p in old.patches}
    pb = {p.file: p.patched_sha256 for p in new.patches}
    for f in sorted(set(pa) | set(pb)):
        if pa.get(f) != pb.get(f):
            what = "added" if f not in pa else "removed" if f not in pb else "changed"
            out.append(f"{where}: config patch of {f} {what}")
    return out


def _table(where: str, old: Mapping[str, Any], new: Mapping[str, Any], fields: tuple[str, ...]) -> list[str]:
    out = []
    for key in sorted(set(old) | set(new)):
        a, b = old.get(key), new.get(key)
        if a is None:
            out.append(f"{where} {key}: added ({fields[0]} {_short(getattr(b, fields[0]))})")
        elif b is None:
            out.append(f"{where} {key}: removed")
        else:
            for f in fields:
                va, vb = getattr(a, f), getattr(b, f)
                if va != vb:
                    if isinstance(va, dict) or isinstance(vb, dict):
                        out += _mapping(f"{where} {key}: {f}", va or {}, vb or {})
                    else:
                        out.append(f"{where} {key}: {f} {_short(va)} → {_short(vb)}")
    return out


def _mapping(where: str, old: Mapping[str, Any], new: Mapping[str, Any]) -> list[str]:
    out = []
    for k in sorted(set(old) | set(new)):
        a, b = old.get(k), new.get(k)
        if a != b:
            out.append(f"{where} {k}: {_value(a)} → {_value(b)}")
    return out


def _value(v: object) -> str:
    """A table value as the diff shows it: a string shortened, an asset by its sha256."""
    return _short(v if isinstance(v, str) or v is None else getattr(v, "sha256", None))


_BUILD_FIELDS = tuple(f for f in LockedBuild.model_fields if f != "provides")
_SOURCE_FIELDS = tuple(f for f in LockedSource.model_fields if f != "ref")


def diff(old: Lock, new: Lock) -> list[str]:
    """Every difference from ``old`` to ``new``, one line each (empty: the same facts)."""
    out: list[str] = []
    for name in sorted(set(old.models) | set(new.models)):
        out += _model(f"model {name}", old.models.get(name), new.models.get(name))
    for name in sorted(set(old.secondary) | set(new.secondary)):
        a, b = old.secondary.get(name, {}), new.secondary.get(name, {})
        for repo in sorted(set(a) | set(b)):
            out += _model(f"secondary {name} {repo}", a.get(repo), b.get(repo))
    out += _table("image", old.images, new.images, ("digest",))
    out += _table("build", old.builds, new.builds, _BUILD_FIELDS)
    out += _table("source", old.sources, new.sources, _SOURCE_FIELDS)
    return out


def summary(old: Lock, new: Lock) -> str:
    """One line: which parts changed (for the history listing)."""
    parts = []
    for name in sorted(set(old.models) | set(new.models)):
        a, b = old.models.get(name), new.models.get(name)
        if a != b:
            how = "added" if a is None else "removed" if b is None else "changed"
            if a and b and a.commit != b.commit:
                how = f"{_short(a.commit)}→{_short(b.commit)}"
            parts.append(f"model {name} {how}")
    for label, table_a, table_b in (
        ("secondary", old.secondary, new.secondary),
        ("image", old.images, new.images),
        ("build", old.builds, new.builds),
        ("source", old.sources, new.sources),
    ):
        changed = sorted(k for k in set(table_a) | set(table_b) if table_a.get(k) != table_b.get(k))
        parts += [f"{label} {k}" for k in changed]
    return "; ".join(parts) if parts else "no change in the pinned facts"


# -- recorded locks -----------------------------------------------------------------------------------


def history_lines(lock_path: Path) -> list[str]:
    """``lock --history``: one line per recorded lock, what changed against the one before, and which one
    the lock is now."""
    have = lockhistory.entries(lock_path)
    if not have:
        return [f"no lock history yet ({lockhistory.history_dir(lock_path)} is empty)"]
    now = lockhistory.current_number(lock_path)
    out = []
    prev = Lock()
    for e in have:
        this = recorded(lock_path, e.n)
        what = shown(e.reason or "") or summary(prev, this)
        mark = "*" if e.n == now else " "
        back = " (rolled back)" if e.rolled_back and "rolled back" not in what else ""
        out.append(f"{mark}{e.n:>4}  {shown(e.time)}  {shown(e.command)}  — {what}{back}")
        prev = this
    if now is None:
        out.append("  (rigsmith.lock now matches none of these: it was changed outside rigsmith)")
    return out


def recorded(lock_path: Path, n: int) -> Lock:
    """Recorded lock number ``n``, parsed (LockError naming the entry when it is not a valid lock)."""
    e = lockhistory.entry(lock_path, n)
    where = f"lock history entry {n} ({lockhistory.history_dir(lock_path) / e.name})"
    return parse(
        e.text(lock_path), where, hint="restore .rigsmith/locks/ from a backup, or pick another entry"
    )


def diff_lines(lock_path: Path, n: int, m: int | None = None) -> list[str]:
    """``lock --diff N [M]``: from recorded lock N to M (default: rigsmith.lock as it is now)."""
    old = recorded(lock_path, n)
    new = recorded(lock_path, m) if m is not None else read(lock_path)
    head = f"lock {n} → {m if m is not None else 'current'}"
    lines = diff(old, new)
    return [f"{head}:", *(f"  {ln}" for ln in lines)] if lines else [f"{head}: no change in the pinned facts"]
