"""The last-known-good a rollback returns to: its model files kept as hard links, its image kept by a tag.

Model files: for each model dir of a deployment (the main model and every secondary one), the files the
lock pins are hard-linked into ``LOCAL_DIR/.rigsmith/kept/<commit>/`` (``files/`` as the engine reads them,
``original/`` the Hub's bytes of a patched config). fetch-model replaces a changed file by renaming a new
one over it, so the kept link still holds the old bytes; an unchanged file costs nothing. Restoring links
them back (each by an atomic rename); fetch-model's verification then vouches for them again.

Image: ``podman tag IMAGE localhost/rigsmith-kept/NAME:lock-N`` keeps it from ``podman image prune``.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from rigsmith.operating.host import Host
from rigsmith.resolving.lock import lock as lockmod
from rigsmith.resolving.lock.lockdiff import human_size
from rigsmith.resolving.model.modelfiles import ORIGINAL_DIR, STATE_DIR, expand_dir, select
from rigsmith.secondary import placements, view
from rigsmith.spec import Deployment, ModelSpec

KEPT_DIR = "kept"


@dataclass(frozen=True)
class Slot:
    """One model dir of a deployment and what a lock pins there."""

    label: str  # "model" or "secondary REPO"
    root: Path
    entry: lockmod.LockedModel
    wanted: tuple[str, ...]  # the pinned files fetch-model puts there (allow/ignore patterns applied)

    @property
    def kept(self) -> Path:
        return self.root / STATE_DIR / KEPT_DIR / self.entry.commit

    @property
    def patched(self) -> frozenset[str]:
        return frozenset(p.file for p in self.entry.patches)


def slots(spec: Deployment, lock: lockmod.Lock, env: Mapping[str, str] = os.environ) -> list[Slot]:
    """The model dirs of ``spec`` with what ``lock`` pins in each (a model without an entry: none)."""
    out = []

    def add(label: str, m: ModelSpec, entry: lockmod.LockedModel | None) -> None:
        if m.repo is not None and entry is not None:
            files = select(entry.files, m.allow_patterns, m.ignore_patterns)
            out.append(Slot(label, expand_dir(m.local_dir, env), entry, tuple(sorted(files))))

    add("model", spec.model, lock.models.get(spec.name))
    for p in placements(spec):
        add(f"secondary {p.repo}", view(spec, p).model, lock.secondary.get(spec.name, {}).get(p.repo))
    return out


def _pairs(slot: Slot, path: str) -> list[tuple[Path, Path]]:
    """(file in the model dir, its kept link) for one pinned file: the patched copy and the original."""
    out = [(slot.root / path, slot.kept / "files" / path)]
    if path in slot.patched:
        out.append((slot.root / STATE_DIR / ORIGINAL_DIR / path, slot.kept / ORIGINAL_DIR / path))
    return out


def _link(src: Path, dst: Path) -> None:
    """Make ``dst`` a hard link of ``src``, replacing it atomically."""
    dst.parent.mkdir(parents=True, exist_ok=True)
    tmp = dst.with_name(f".{dst.name}.{os.getpid()}.link")
    tmp.unlink(missing_ok=True)
    os.link(src, tmp)
    tmp.replace(dst)


def _sync(found: Sequence[Slot], back: bool) -> int:
    """Link each pinned file into its kept snapshot (or, ``back``, from it into the model dir) where the
    source exists and the two are not already one file; the number linked."""
    n = 0
    for slot in found:
        for path in slot.wanted:
            for here, kept in _pairs(slot, path):
                src, dst = (kept, here) if back else (here, kept)
                if src.is_file() and not (dst.exists() and src.samefile(dst)):
                    _link(src, dst)
                    n += 1
    return n


def keep(found: Sequence[Slot]) -> int:
    """Hard-link every pinned file present in each model dir into its kept snapshot; the number linked."""
    return _sync(found, back=False)


def missing(found: Sequence[Slot]) -> list[str]:
    """Pinned files neither kept nor in the model dir at their pinned size (a restore could not put them
    back), as ``LABEL: PATH (SIZE)``."""
    out = []
    for slot in found:
        for path in slot.wanted:
            size = slot.entry.files[path].size
            pairs = _pairs(slot, path)
            hub_bytes = pairs[-1]  # the original of a patched file, else the file itself
            here = all(p.is_file() for p, _ in pairs) and hub_bytes[0].stat().st_size == size
            kept = all(k.is_file() for _, k in pairs) and hub_bytes[1].stat().st_size == size
            if not (here or kept):
                out.append(f"{slot.label}: {slot.root / path} ({human_size(size)})")
    return out


def restore(found: Sequence[Slot]) -> int:
    """Link each kept file back into its model dir (only where a kept copy exists); the number restored."""
    return _sync(found, back=True)


def drop_unpinned(current: Sequence[Slot], target: Sequence[Slot]) -> list[str]:
    """Remove from each model dir the files ``current`` pins there and ``target`` does not (keep them
    first: :func:`keep`), so the dir holds the target snapshot and nothing of the other; never a file
    neither lock pins. The paths removed."""
    wanted = {(s.root, p) for s in target for p in s.wanted}
    gone = []
    for slot in current:
        for path in slot.wanted:
            if (slot.root, path) in wanted:
                continue
            for here, _kept in _pairs(slot, path):
                if here.is_file():
                    here.unlink()
                    gone.append(str(here))
    return gone


def bytes_needed(old: Sequence[Slot], new: Sequence[Slot]) -> dict[Path, int]:
    """Per model dir: the bytes the new lock's files take beyond the old one's (added or changed files),
    which the kept old snapshot does not share."""

    def key(s: Slot, p: str) -> tuple[Path, str, int, str | None, str | None]:
        f = s.entry.files[p]
        return s.root, p, f.size, f.sha256, f.git_sha1

    have = {key(s, p) for s in old for p in s.wanted}
    out: dict[Path, int] = {}
    for s in new:
        extra = sum(s.entry.files[p].size for p in s.wanted if key(s, p) not in have)
        out[s.root] = out.get(s.root, 0) + extra
    return out


def kept_tag(name: str, n: int) -> str:
    return f"localhost/rigsmith-kept/{name}:lock-{n}"


def keep_image(host: Host, image: str, name: str, n: int) -> str | None:
    """Tag ``image`` so no prune removes it; the tag, or None when podman could not tag it."""
    tag = kept_tag(name, n)
    res = host.run(["podman", "tag", image, tag])
    return tag if res.code == 0 else None
