"""What ``invoke bundle`` and ``invoke unbundle`` share: what a deployment's bundle holds (worked out from
spec + lock), placing a file (hard link, or a copy hashed on the way), the verified-file record of a
directory, the disk-space check and the progress bars. See :mod:`.bundle`.
"""

from __future__ import annotations

import errno
import hashlib
import os
import shutil
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO

from rigsmith.errors import LockError, PreflightError
from rigsmith.operating import ociarchive
from rigsmith.operating.bundlemanifest import (
    IMAGE_MEMBER,
    MODEL_PREFIX,
    SECONDARY_PREFIX,
    SOURCES_PREFIX,
    BundleError,
)
from rigsmith.progress import bars
from rigsmith.resolving import lock as lockmod
from rigsmith.resolving.modelfiles import HASH_CHUNK, Hasher, HashKind, Want, patches_by_file, select, wants
from rigsmith.resolving.verified import (
    STATE_DIR,
    STATE_FILE,
    DirState,
    dump_state,
    read_state,
    seen,
    seen_at,
    verified,
    vouches,
)
from rigsmith.secondary import placements, view
from rigsmith.spec import Deployment
from rigsmith.writer import write_one

Echo = Callable[[str], None]
DiskFree = Callable[[Path], int]

# -- what a deployment's bundle holds ---------------------------------------------------------------------


@dataclass(frozen=True)
class ModelSet:
    """One Hub model a bundle carries (the main one, or a secondary one: draft, tokenizer, LoRA)."""

    spec: Deployment  # the deployment with this model as ``model`` (what fetch-model reads for it)
    entry: lockmod.LockedModel
    prefix: str  # its members' names start with this
    field: str  # the spec field, for messages
    wanted: list[Want]

    def member(self, w: Want) -> str:
        return self.prefix + w.repo_path


@dataclass(frozen=True)
class SourceSet:
    """The source tree (a git bundle of the locked commit) and release assets of ``images/<image>``."""

    image: str
    entry: lockmod.LockedSource

    @property
    def tree_member(self) -> str:
        return f"{SOURCES_PREFIX}{self.image}/{self.entry.commit}.bundle"

    def asset_member(self, a: lockmod.LockedAsset) -> str:
        return f"{SOURCES_PREFIX}{self.image}/assets/{a.sha256.removeprefix('sha256:')}"


@dataclass(frozen=True)
class Contents:
    """Everything a bundle of one deployment must hold, worked out from spec + lock (no disk reads)."""

    spec: Deployment
    lock: lockmod.Lock
    models: list[ModelSet]  # the main model first
    pin: ociarchive.ImagePin | None
    sources: SourceSet | None

    def locked(self) -> dict[str, tuple[HashKind, str, int]]:
        """Every member whose hash the lock holds: model files (their Hub hash), source tree (none: git
        checks it against the locked commit) and assets (sha256)."""
        out: dict[str, tuple[HashKind, str, int]] = {
            s.member(w): (w.kind, w.digest, w.size) for s in self.models for w in s.wanted
        }
        if self.sources is not None:
            for a in self.sources.entry.assets.values():
                out[self.sources.asset_member(a)] = ("sha256", a.sha256.removeprefix("sha256:"), a.size)
        return out

    def carried(self) -> set[str]:
        """Every member but the spec, the lock, the image definition and the artifacts."""
        tree = {self.sources.tree_member} if self.sources is not None else set()
        return set(self.locked()) | tree | ({IMAGE_MEMBER} if self.pin is not None else set())


def contents(spec: Deployment, lock: lockmod.Lock) -> Contents:
    """The model files (Hub bytes, by repo path), secondary models, image pin and source tree of ``spec``."""
    m = spec.model
    if m.repo is None:
        raise LockError(
            f"deployment {spec.name!r} runs a local checkpoint (model.repo is null): rigsmith has no "
            "per-file hashes to carry it verified",
            hint="set model.repo, run `invoke pin` and `invoke fetch-model`; or copy the checkpoint yourself",
        )
    fetch = f"run `invoke fetch-model --deployment {spec.name}` first"
    entry = lock.models.get(spec.name)
    if entry is None or entry.repo != m.repo or not entry.files:
        raise LockError(f"rigsmith.lock holds no files for deployment {spec.name!r} ({m.repo})", hint=fetch)
    files = select(entry.files, m.allow_patterns, m.ignore_patterns)
    models = [ModelSet(spec, entry, MODEL_PREFIX, "model", wants(files, patches_by_file(m.config_patches)))]
    for p in placements(spec):
        sub = lock.secondary.get(spec.name, {}).get(p.repo)
        if sub is None or not sub.files:
            raise LockError(f"rigsmith.lock holds no files for {p.field} ({p.repo})", hint=fetch)
        v = view(spec, p)
        chosen = wants(select(sub.files, v.model.allow_patterns, ()), ())
        models.append(ModelSet(v, sub, f"{SECONDARY_PREFIX}{p.repo}/", p.field, chosen))
    build = spec.engine.build
    tree = lock.sources.get(build) if build else None
    srcs = SourceSet(build, tree) if build and tree else None
    return Contents(spec, lock, models, ociarchive.image_pin(spec, lock), srcs)


# -- the verified-file record of a directory --------------------------------------------------------------


class Record:
    """The verified-file record (:mod:`rigsmith.resolving.verified`) of a model dir or a bundle dir: the
    same file, the same rule; written after every change, so a killed run keeps what it verified."""

    def __init__(self, root: Path) -> None:
        self.path = root / STATE_DIR / STATE_FILE
        self.state: DirState = read_state(self.path)

    def vouches(self, rel: str, path: Path, kind: HashKind, digest: str) -> bool:
        return vouches(self.state.files.get(rel), seen_at(path), kind, digest)

    def digest(self, rel: str, path: Path) -> str | None:
        """The sha256 the record holds for ``rel`` while it still vouches for ``path``."""
        rec = self.state.files.get(rel)
        return rec.digest if rec is not None and self.vouches(rel, path, "sha256", rec.digest) else None

    def put(self, rel: str, path: Path, kind: HashKind, digest: str) -> None:
        new = verified(seen(path.stat()), kind, digest)
        if self.state.files.get(rel) != new:
            self.state.files[rel] = new
            self.save()

    def save(self) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        write_one(self.path, dump_state(self.state))


# -- hashing and placing files ----------------------------------------------------------------------------


def _none(n: int) -> None:
    """No progress to report."""


def hash_path(path: Path, kind: HashKind, size: int, on_bytes: Callable[[int], None] = _none) -> str:
    """The ``kind`` hash of a file, reporting progress per chunk."""
    h = Hasher(kind, size)
    view_ = memoryview(bytearray(HASH_CHUNK))
    with path.open("rb") as fh:
        while n := fh.readinto(view_):
            h.update(view_[:n])
            on_bytes(n)
    return h.hexdigest()


def same_filesystem(a: Path, b: Path) -> bool:
    """True when a hard link from ``a`` can land in ``b`` (a directory, or the nearest existing parent)."""
    return a.stat().st_dev == _existing(b).stat().st_dev


def place(
    src: Path, dst: Path, kind: HashKind, digest: str, size: int, on_bytes: Callable[[int], None] = _none
) -> bool:
    """Put ``src`` at ``dst``: a hard link where possible (True), else a copy that reaches ``dst`` only once
    it hashes to ``digest`` (False). A killed copy leaves no file at ``dst``."""
    dst.parent.mkdir(parents=True, exist_ok=True)
    tmp = beside(dst, "rigsmith-link")
    tmp.unlink(missing_ok=True)
    try:
        os.link(src, tmp)
    except OSError as err:
        if err.errno not in (errno.EXDEV, errno.EPERM, errno.EMLINK, errno.ENOTSUP):
            raise
    else:
        tmp.replace(dst)
        on_bytes(size)
        return True
    h = Hasher(kind, size)
    with src.open("rb") as fin, atomic(dst) as fout:
        view_ = memoryview(bytearray(HASH_CHUNK))
        while n := fin.readinto(view_):
            fout.write(view_[:n])
            h.update(view_[:n])
            on_bytes(n)
        if h.hexdigest() != digest:
            raise BundleError(
                f"{src}: copied bytes hash to {h.hexdigest()}, expected {digest}",
                hint="the source changed while it was copied; run the command again",
            )
    return False


@dataclass
class Moved:
    """How files got where they go: hard links or copies."""

    linked: int = 0
    copied: int = 0
    copied_bytes: int = 0

    def describe(self) -> str:
        return f"{self.linked} hard-linked, {self.copied} copied ({gib(self.copied_bytes)})"


def place_all(
    todo: Sequence[tuple[Path, Path, Want]],
    moved: Moved,
    *,
    title: str,
    progress: bool | None,
    placed: Callable[[Path, Want, bool], None],
) -> None:
    """:func:`place` each (source, destination, file) under one progress bar; ``placed`` after each."""
    with bars(progress) as prog:
        task = prog.add_task(title, total=sum(w.size for _s, _d, w in todo))
        for src, dst, w in todo:
            linked = place(src, dst, w.kind, w.digest, w.size, lambda n: prog.advance(task, n))
            if linked:
                moved.linked += 1
            else:
                moved.copied += 1
                moved.copied_bytes += w.size
            placed(dst, w, linked)


def gib(n: int) -> str:
    return f"{n / 2**30:.2f} GiB" if n >= 2**30 else f"{n / 2**20:.1f} MiB"


def check_space(needs: Mapping[Path, int], disk_free: DiskFree, what: str, hint: str) -> None:
    """Refuse before the first byte when any filesystem lacks room (paths on one device are summed)."""
    per_dev: dict[int, tuple[Path, int]] = {}
    for path, n in needs.items():
        if n > 0:
            dev = _existing(path).stat().st_dev
            where, total = per_dev.get(dev, (path, 0))
            per_dev[dev] = (where, total + n)
    for where, total in per_dev.values():
        free = disk_free(where)
        if total > free:
            raise PreflightError(
                f"not enough disk space in {where}: {what} needs {gib(total)}, {gib(free)} is free; "
                "nothing was written",
                hint=hint,
            )


def _existing(p: Path) -> Path:
    return next((q for q in (p, *p.parents) if q.exists()), Path("/"))


def free_bytes(path: Path) -> int:
    """Free bytes on the filesystem holding ``path`` (host fact; tests pass their own)."""
    return shutil.disk_usage(_existing(path)).free


@dataclass(frozen=True)
class Io:
    """How bundle and unbundle reach the host: status lines, progress bars (default: when stderr is a
    terminal), the podman/skopeo runner and free space (tests pass their own)."""

    echo: Echo = print
    progress: bool | None = None
    run: ociarchive.Run = ociarchive.run_command
    disk_free: DiskFree = free_bytes


DEFAULT_IO = Io()


@dataclass
class BundleReport:
    """What one ``bundle`` run did."""

    out: str = ""
    members: int = 0
    total_bytes: int = 0
    moved: Moved = field(default_factory=Moved)
    hashed_bytes: int = 0
    written: list[str] = field(default_factory=list)
    tar: str | None = None
    lock_sha256: str = ""

    def summary(self) -> str:
        head = f"bundle {self.out}: {self.members} members, {gib(self.total_bytes)}; "
        if not (self.moved.linked or self.moved.copied or self.written):
            head += "up to date, nothing to do"
        else:
            head += f"{self.moved.describe()}, {len(self.written)} written, {gib(self.hashed_bytes)} hashed"
        head += f"\nlock sha256 {self.lock_sha256} (compare it on the offline machine)"
        return head + (f"\ntar: {self.tar}" if self.tar else "")


@contextmanager
def atomic(path: Path) -> Iterator[IO[bytes]]:
    """Write a file beside ``path``, fsync it, rename it over ``path``; on any error leave no trace."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = beside(path, "rigsmith-tmp")
    tmp.unlink(missing_ok=True)
    try:
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o644)
        with os.fdopen(fd, "wb") as fh:
            yield fh
            fh.flush()
            os.fsync(fh.fileno())
        tmp.replace(path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def beside(path: Path, tag: str) -> Path:
    """A hidden temporary name next to ``path`` that fits NAME_MAX whatever the length of ``path``'s name."""
    name = path.name if len(path.name.encode()) <= 200 else hashlib.sha256(path.name.encode()).hexdigest()
    return path.with_name(f".{name}.{tag}")


def write_bytes(path: Path, data: bytes) -> None:
    with atomic(path) as fh:
        fh.write(data)


def same_bytes(path: Path, data: bytes) -> bool:
    try:
        return path.stat().st_size == len(data) and path.read_bytes() == data
    except FileNotFoundError:
        return False
