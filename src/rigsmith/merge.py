"""Three-way merge: the user's file and rigsmith's new version, against what rigsmith last wrote (the base).

One engine serves every file rigsmith shares with its user (a spec after import, a pct.conf handed in).
The data are plain nested values (dicts, lists, scalars). For every place where the user's value (ours) and
rigsmith's new value (theirs) differ:

- only theirs moved away from the base: the upstream change is taken;
- only ours moved away: the user's edit is kept;
- both moved, to different values: a conflict, reported with the three values; mappings (and lists of
  mappings merged by a key, such as env entries by name) are merged key by key first, so a conflict is as
  small as a single field. Any other list (an argv) is one value.

Pure: no I/O. Callers decide what a conflict means (ask, refuse, or an explicit ``--ours``/``--theirs``).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Literal

Resolve = Literal["ours", "theirs"]


class _Missing:
    """A key that one side does not have (distinct from an explicit None)."""

    def __repr__(self) -> str:
        return "<not set>"


MISSING: Any = _Missing()


@dataclass(frozen=True)
class Conflict:
    """One field both sides changed differently."""

    path: str
    base: Any
    ours: Any
    theirs: Any

    def describe(self) -> str:
        """``path: yours X, upstream Y (was Z)`` with absent values named as such."""
        return f"{self.path}: yours {self.ours!r}, upstream {self.theirs!r} (was {self.base!r})"


@dataclass(frozen=True)
class Merged:
    """The merged value, the conflicts found, and the paths where an upstream change was taken."""

    value: Any
    conflicts: tuple[Conflict, ...] = ()
    taken: tuple[str, ...] = ()
    kept: tuple[str, ...] = ()


def _join(path: str, key: object) -> str:
    return f"{path}.{key}" if path else str(key)


def _keyed_list(items: Any, key: str) -> dict[str, Any] | None:
    """A list of mappings that all carry a distinct string ``key`` as an ordered dict, else None."""
    if items is MISSING:
        return {}
    if not isinstance(items, list):
        return None
    out: dict[str, Any] = {}
    for item in items:
        if not isinstance(item, dict) or not isinstance(item.get(key), str) or item[key] in out:
            return None
        out[item[key]] = item
    return out


class _Merger:
    def __init__(
        self, keyed: Callable[[str], str | None], resolve: Resolve | Callable[[Conflict], Resolve] | None
    ) -> None:
        self.keyed = keyed
        self.resolve = resolve
        self.conflicts: list[Conflict] = []
        self.taken: list[str] = []
        self.kept: list[str] = []

    def value(self, path: str, base: Any, ours: Any, theirs: Any) -> Any:
        if ours == theirs:
            return ours
        if base == theirs:
            self.kept.append(path)
            return ours
        if base == ours:
            self.taken.append(path)
            return theirs
        if isinstance(ours, dict) and isinstance(theirs, dict):
            return self.mapping(path, base if isinstance(base, dict) else {}, ours, theirs)
        key = self.keyed(path)
        if key is not None:
            b, o, t = (_keyed_list(x, key) for x in (base, ours, theirs))
            if b is not None and o is not None and t is not None:
                merged = self.mapping(path, b, o, t, label=lambda k: f"{path}[{k}]")
                return list(merged.values())
        conflict = Conflict(path, base, ours, theirs)
        self.conflicts.append(conflict)
        side = self.resolve(conflict) if callable(self.resolve) else self.resolve
        return theirs if side == "theirs" else ours

    def mapping(
        self,
        path: str,
        base: Mapping[str, Any],
        ours: Mapping[str, Any],
        theirs: Mapping[str, Any],
        label: Callable[[str], str] | None = None,
    ) -> dict[str, Any]:
        out: dict[str, Any] = {}
        # the user's order first (their file), then keys upstream added, in upstream's order
        for k in [*ours, *(k for k in theirs if k not in ours)]:
            sub = label(k) if label else _join(path, k)
            v = self.value(sub, base.get(k, MISSING), ours.get(k, MISSING), theirs.get(k, MISSING))
            if v is not MISSING:
                out[k] = v
        return out


def merge3(
    base: Any,
    ours: Any,
    theirs: Any,
    *,
    keyed: Callable[[str], str | None] = lambda _path: None,
    resolve: Resolve | Callable[[Conflict], Resolve] | None = None,
) -> Merged:
    """Merge ``theirs`` (rigsmith's new version) into ``ours`` (the user's current one) against ``base``.

    Args:
        base: what rigsmith wrote last (MISSING or None when there is no record: then every difference
            between ours and theirs is a conflict, since nobody can tell whose it is).
        ours: the user's current data.
        theirs: rigsmith's new data (a re-import, a new render).
        keyed: for a path, the field by which that list of mappings is merged (e.g. ``"env"`` → ``"name"``);
            None merges the list as one value.
        resolve: how conflicts are settled in ``value``: the user's side (default) or upstream's, or a
            function asked per conflict. Conflicts are reported either way.
    """
    m = _Merger(keyed, resolve)
    value = m.value("", MISSING if base is None else base, ours, theirs)
    return Merged(value, tuple(m.conflicts), tuple(m.taken), tuple(m.kept))
