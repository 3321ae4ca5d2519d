"""Three-way merge: the user's file and rigsmith's new version, against what rigsmith last wrote (the base).

One engine serves every file rigsmith shares with its user (a spec after import, a pct.conf handed in).
The data are plain nested values (dicts, lists, scalars). For every place where the user's value (ours) and
rigsmith's new value (theirs) differ:

- only theirs moved away from the base: the upstream change is taken;
- only ours moved away: the user's edit is kept;
- both moved, to different values: a conflict, reported with the three values; mappings (and lists of
  mappings merged by a key, such as env entries by name) are merged key by key first, so a conflict is as
  small as a single field. An argv (a path named in ``argv``) is merged flag by flag: ``--max-num-seqs 8``
  is one item, so a conflict is one flag (``engine.args --max-num-seqs: yours 6 · upstream 16 · was 8``) and
  a flag only one side moved merges. Any other list is one value.

Pure: no I/O. Callers decide what a conflict means (ask, refuse, or an explicit ``--ours``/``--theirs``).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Collection, Mapping
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
    flag: bool = False  # one item of an argv: the values are its words after the flag

    def describe(self, limit: int | None = None) -> str:
        """``path: yours X, upstream Y (was Z)`` with absent values named as such; one flag of an argv as
        ``engine.args --max-num-seqs: yours 6 · upstream 16 · was 8``. ``limit``: the most characters of
        each value shown (the rest is ``…``), for a prompt that must stay one line."""
        if self.flag:
            ours, theirs, base = (_cut(_flag_value(v), limit) for v in (self.ours, self.theirs, self.base))
            return f"{self.path}: yours {ours} · upstream {theirs} · was {base}"
        ours, theirs, base = (_cut(repr(v), limit) for v in (self.ours, self.theirs, self.base))
        return f"{self.path}: yours {ours}, upstream {theirs} (was {base})"


def _cut(text: str, limit: int | None) -> str:
    return text if limit is None or len(text) <= limit else text[: max(limit - 1, 0)] + "…"


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


_NUMBER = re.compile(r"-\d")


def _is_flag(word: str) -> bool:
    return word.startswith("-") and len(word) > 1 and not _NUMBER.match(word)


def _flag_value(words: Any) -> str:
    """How one argv item reads in a conflict: its value words, ``set`` for a bare flag, ``not set``."""
    if words is MISSING or not isinstance(words, list) or not words:
        return "not set"
    head, *rest = words
    if rest:
        return " ".join(rest)
    flag, eq, value = head.partition("=")
    return value if eq and _is_flag(flag) else ("set" if _is_flag(head) else head)


def argv_items(argv: Any) -> dict[str, list[str]] | None:
    """An argv as ordered items: each word before the first flag on its own (``#0``, ``#1``), then each flag
    with the words after it up to the next flag (``--x=v`` is one item ``--x``); a flag given again is
    ``--x (2)``. None when ``argv`` is not a list of strings."""
    if argv is MISSING:
        return {}
    if not isinstance(argv, list) or not all(isinstance(w, str) for w in argv):
        return None
    out: dict[str, list[str]] = {}
    current: list[str] | None = None
    for word in argv:
        if _is_flag(word):
            name = word.partition("=")[0] if word.startswith("--") else word
            key, n = name, 1
            while key in out:
                n += 1
                key = f"{name} ({n})"
            current = out[key] = [word]
        elif current is not None:
            current.append(word)
        else:
            out[f"#{len(out)}"] = [word]
    return out


class _Merger:
    def __init__(
        self,
        keyed: Callable[[str], str | None],
        resolve: Resolve | Callable[[Conflict], Resolve] | None,
        argv: Collection[str] = (),
    ) -> None:
        self.keyed = keyed
        self.argv = argv
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
        if path in self.argv:
            words = self.args(path, base, ours, theirs)
            if words is not None:
                return words
        key = self.keyed(path)
        if key is not None:
            b, o, t = (_keyed_list(x, key) for x in (base, ours, theirs))
            if b is not None and o is not None and t is not None:
                merged = self.mapping(path, b, o, t, label=lambda k: f"{path}[{k}]")
                return list(merged.values())
        return self.conflict(Conflict(path, base, ours, theirs))

    def conflict(self, conflict: Conflict) -> Any:
        self.conflicts.append(conflict)
        side = self.resolve(conflict) if callable(self.resolve) else self.resolve
        return conflict.theirs if side == "theirs" else conflict.ours

    def args(self, path: str, base: Any, ours: Any, theirs: Any) -> list[str] | None:
        """An argv merged item by item (see ``argv_items``): the words before the first flag stay first, then
        the user's flags in their order, then flags upstream added."""
        b, o, t = (argv_items(x) for x in (base, ours, theirs))
        if b is None or o is None or t is None:
            return None
        keys = [*o, *(k for k in t if k not in o)]
        out: list[str] = []
        for k in sorted(keys, key=lambda k: not k.startswith("#")):
            bv, ov, tv = b.get(k, MISSING), o.get(k, MISSING), t.get(k, MISSING)
            label = f"{path} {k}"
            if ov == tv:
                v = ov
            elif bv == tv:
                self.kept.append(label)
                v = ov
            elif bv == ov:
                self.taken.append(label)
                v = tv
            else:
                v = self.conflict(Conflict(label, bv, ov, tv, flag=True))
            if v is not MISSING:
                out.extend(v)
        return out

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
    argv: Collection[str] = (),
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
        argv: the paths whose lists are argvs, merged flag by flag (``"engine.args"``).
    """
    m = _Merger(keyed, resolve, argv)
    value = m.value("", MISSING if base is None else base, ours, theirs)
    return Merged(value, tuple(m.conflicts), tuple(m.taken), tuple(m.kept))
