"""What ``invoke bundle`` and ``invoke unbundle`` share: the manifest, hashing and placing files (hard link or
copy with progress), the disk-space check, and what a deployment's bundle holds. See :mod:`.bundle`.
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
from typing import IO, Literal

from rigsmith.errors import LockError, PreflightError
from rigsmith.operating import ociarchive
from rigsmith.operating.bundlemanifest import IMAGE_MEMBER, MODEL_PREFIX, BundleError, Manifest
from rigsmith.progress import bars
from rigsmith.resolving import lock as lockmod
from rigsmith.resolving.modelfiles import (
    HASH_CHUNK,
    DirState,
    Hasher,
    HashKind,
    Want,
    hash_stream,
    patches_by_file,
    select,
    wants,
)
from rigsmith.spec import Deployment

Echo = Callable[[str], None]
DiskFree = Callable[[Path], int]

# -- hashing and placing files ----------------------------------------------------------------------------


def sha256_file(path: Path, on_bytes: Callable[[int], None] = lambda n: None) -> str:
    """sha256 of a file, reporting progress per chunk."""
    h = hashlib.sha256()
    buf = bytearray(HASH_CHUNK)
    view = memoryview(buf)
    with path.open("rb") as fh:
        while n := fh.readinto(view):
            h.update(view[:n])
            on_bytes(n)
    return h.hexdigest()


def same_filesystem(a: Path, b: Path) -> bool:
    """True when a hard link from ``a`` can land in ``b`` (a directory, or the nearest existing parent)."""
    for p in (b, *b.parents):
        if p.exists():
            return a.stat().st_dev == p.stat().st_dev
    return False


Placed = Literal["linked", "copied"]


def place(
    src: Path,
    dst: Path,
    *,
    partial: Path,
    kind: HashKind,
    digest: str,
    size: int,
    on_bytes: Callable[[int], None],
) -> tuple[Placed, int]:
    """Put ``src`` at ``dst``: a hard link where possible, else a hashed copy that resumes from ``partial``.

    The copy reaches ``dst`` only once it hashes to ``digest``. Returns how it was placed and the bytes a
    resumed copy did not have to copy again.
    """
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
        return "linked", 0
    partial.parent.mkdir(parents=True, exist_ok=True)
    have = partial.stat().st_size if partial.exists() else 0
    if have > size:
        partial.unlink()
        have = 0
    with src.open("rb") as fin, partial.open("r+b" if have else "wb") as fout:
        hasher = hash_stream(kind, size, fout, limit=have) if have else Hasher(kind, size)
        on_bytes(have)
        fin.seek(have)
        fout.seek(have)
        buf = bytearray(HASH_CHUNK)
        view = memoryview(buf)
        while n := fin.readinto(view):
            fout.write(view[:n])
            hasher.update(view[:n])
            on_bytes(n)
        fout.flush()
        os.fsync(fout.fileno())
    got = hasher.hexdigest()
    if got != digest:
        partial.unlink(missing_ok=True)
        raise BundleError(
            f"{src}: copied bytes hash to {got}, expected {digest}",
            hint="the source changed while it was copied; run the command again",
        )
    partial.replace(dst)
    return "copied", have


@dataclass
class Moved:
    """How model files got where they go: hard links, copies (and what a resumed copy did not redo)."""

    linked: int = 0
    copied: int = 0
    copied_bytes: int = 0
    resumed_bytes: int = 0

    def describe(self) -> str:
        resumed = f", {gib(self.resumed_bytes)} resumed" if self.resumed_bytes else ""
        return f"{self.linked} hard-linked, {self.copied} copied ({gib(self.copied_bytes)}{resumed})"


def place_all(
    todo: Sequence[Want],
    where: Callable[[Want], tuple[Path, Path, Path]],
    moved: Moved,
    *,
    title: str,
    progress: bool | None,
    placed: Callable[[Want], None] = lambda w: None,
) -> None:
    """:func:`place` each file (``where(w)`` = source, destination, partial) under one progress bar."""
    with bars(progress) as prog:
        task = prog.add_task(title, total=sum(w.size for w in todo))
        for w in todo:
            src, dst, partial = where(w)
            how, resumed = place(
                src, dst, partial=partial, kind=w.kind, digest=w.digest, size=w.size,
                on_bytes=lambda n: prog.advance(task, n),
            )  # fmt: skip
            if how == "linked":
                moved.linked += 1
            else:
                moved.copied += 1
                moved.copied_bytes += w.size - resumed
                moved.resumed_bytes += resumed
            placed(w)


def gib(n: int) -> str:
    return f"{n / 2**30:.2f} GiB" if n >= 2**30 else f"{n / 2**20:.1f} MiB"


def check_space(needs: Mapping[Path, int], disk_free: DiskFree, what: str, hint: str) -> None:
    """Refuse before the first byte when any filesystem lacks room (paths on one device are summed)."""
    per_dev: dict[int, tuple[Path, int]] = {}
    for path, n in needs.items():
        if n <= 0:
            continue
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
    for q in (p, *p.parents):
        if q.exists():
            return q
    return Path("/")


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


# -- what a deployment's bundle holds ---------------------------------------------------------------------


@dataclass(frozen=True)
class Contents:
    """Everything a bundle of one deployment must hold, worked out from spec + lock (no disk reads)."""

    spec: Deployment
    lock: lockmod.Lock
    entry: lockmod.LockedModel
    wanted: list[Want]
    pin: ociarchive.ImagePin | None


def contents(spec: Deployment, lock: lockmod.Lock) -> Contents:
    """The model files (Hub bytes, by repo path) and the image pin a bundle of ``spec`` carries."""
    m = spec.model
    if m.repo is None:
        raise LockError(
            f"deployment {spec.name!r} runs a local checkpoint (model.repo is null): rigsmith has no "
            "per-file hashes to carry it verified",
            hint="set model.repo, run `invoke pin` and `invoke fetch-model`; or copy the checkpoint yourself",
        )
    entry = lock.models.get(spec.name)
    if entry is None or entry.repo != m.repo or not entry.files:
        raise LockError(
            f"rigsmith.lock holds no files for deployment {spec.name!r} ({m.repo})",
            hint=f"run `invoke fetch-model --deployment {spec.name}` first",
        )
    files = select(entry.files, m.allow_patterns, m.ignore_patterns)
    wanted = wants(files, patches_by_file(m.config_patches))
    return Contents(spec, lock, entry, wanted, ociarchive.image_pin(spec, lock))


def check_against_lock(manifest: Manifest, c: Contents) -> list[str]:
    """Where the manifest disagrees with the lock it carries (model files, commit, image pin)."""
    problems = []
    if manifest.model_commit != c.entry.commit or manifest.model_repo != c.entry.repo:
        problems.append(
            f"model: the manifest has {manifest.model_repo}@{manifest.model_commit}, the lock "
            f"{c.entry.repo}@{c.entry.commit}"
        )
    want = {w.repo_path: w for w in c.wanted}
    for path in sorted(set(want) | set(manifest.model)):
        w, f = want.get(path), manifest.model.get(path)
        if w is None:
            problems.append(f"{MODEL_PREFIX}{path}: in the manifest, not among the lock's files")
        elif f is None:
            problems.append(f"{MODEL_PREFIX}{path}: locked ({w.kind} {w.digest}) but not in the manifest")
        elif (f.size, f.kind, f.digest) != (w.size, w.kind, w.digest):
            problems.append(
                f"{f.member}: the manifest says {f.kind} {f.digest} ({f.size} bytes), the lock "
                f"{w.kind} {w.digest} ({w.size} bytes)"
            )
        elif f.member != MODEL_PREFIX + path or f.member not in manifest.members:
            problems.append(f"{MODEL_PREFIX}{path}: no such member in the manifest")
        elif f.kind == "sha256" and manifest.members[f.member].sha256 != f.digest:
            problems.append(
                f"{f.member}: the manifest lists sha256 {manifest.members[f.member].sha256}, the lock "
                f"{f.digest}"
            )
    pin, img = c.pin, manifest.image
    if (pin is None) != (img is None):
        problems.append(f"{IMAGE_MEMBER}: the lock pins {pin.pinned_ref if pin else 'no image'}, the "
                        f"manifest {img.pinned_ref if img else 'no image'}")  # fmt: skip
    elif pin is not None and img is not None:
        if (img.digest, img.image_id, img.pinned_ref) != (pin.digest, pin.image_id, pin.pinned_ref):
            problems.append(
                f"{img.member}: the manifest pins {img.pinned_ref} ({img.digest or img.image_id}), the "
                f"lock {pin.pinned_ref} ({pin.digest or pin.image_id})"
            )
        if img.member not in manifest.members:
            problems.append(f"{img.member}: not listed among the manifest's members")
    return problems


@dataclass
class BundleReport:
    """What one ``bundle`` run did."""

    out: str = ""
    members: int = 0
    total_bytes: int = 0
    moved: Moved = field(default_factory=Moved)
    hashed_bytes: int = 0
    unchanged: int = 0
    written: list[str] = field(default_factory=list)
    image: str = ""
    tar: str | None = None
    lock_sha256: str = ""

    @property
    def nothing_done(self) -> bool:
        return not (self.moved.linked or self.moved.copied or self.written or self.image)

    def summary(self) -> str:
        if self.nothing_done:
            head = f"bundle {self.out}: up to date, nothing to do ({self.members} members, "
            head += f"{gib(self.total_bytes)})"
        else:
            parts = [
                self.moved.describe(),
                f"{len(self.written)} written, {self.unchanged} unchanged, {gib(self.hashed_bytes)} hashed",
            ]
            if self.image:
                parts.append(f"image exported: {self.image}")
            head = f"bundle {self.out}: {self.members} members, {gib(self.total_bytes)}; " + "; ".join(parts)
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


def pin_key(pin: ociarchive.ImagePin) -> str:
    return f"{pin.pinned_ref} {pin.digest} {pin.image_id}"


def image_size(pin: ociarchive.ImagePin, run: ociarchive.Run) -> int:
    for src in pin.sources:
        info = ociarchive.inspect(src, run)
        if info is not None:
            return int(info.get("Size") or 0)
    return 0


def verify_source(src: Path, w: Want, report: BundleReport) -> None:
    """Hash a model file fetch-model's cache does not vouch for; refuse one that is not the lock's."""
    with src.open("rb") as fh:
        got = hash_stream(w.kind, w.size, fh).hexdigest()
    report.hashed_bytes += w.size
    if got != w.digest or src.stat().st_size != w.size:
        raise BundleError(
            f"{src}: {w.kind} {got} on disk, the lock says {w.digest}; it is not bundled",
            hint="run `invoke fetch-model --verify` to restore the locked file, then `invoke bundle OUT` "
            "again",
        )


def drop_stale(out: Path, keep: set[str], bstate: DirState) -> list[str]:
    """Remove members an earlier bundle of another lock state left (files the lock no longer names)."""
    stale = [m for m in bstate.files if m not in keep]
    for member in stale:
        (out / member).unlink(missing_ok=True)
        del bstate.files[member]
    return stale
