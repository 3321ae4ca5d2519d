"""The bundle's format, and what ``invoke bundle`` and ``invoke unbundle`` share. The manifest is untrusted on
the offline side: it is read into frozen models, a member is only ever a safe name of a regular file inside
the bundle, and what a model, source-tree or asset member must hash to comes from the bundle's lock. Also:
what a deployment's bundle holds (from spec + lock), the verified-file record of a directory, placing a file
(a hard link, or a copy hashed on the way) and the disk-space check. See :mod:`.bundle`.
"""

from __future__ import annotations

import errno
import hashlib
import os
import shutil
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import IO

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from rigsmith import confine
from rigsmith.errors import LockError, PreflightError, RigsmithError
from rigsmith.operating.bundle import ociarchive
from rigsmith.operating.host import LocalHost
from rigsmith.progress import bars
from rigsmith.resolving.lock import lock as lockmod
from rigsmith.resolving.model import verified as vf
from rigsmith.resolving.model.modelfiles import (
    HASH_CHUNK,
    Hasher,
    HashKind,
    Want,
    expand_dir,
    gib,
    patches_by_file,
    select,
    wants,
)
from rigsmith.secondary import placements, view
from rigsmith.spec import Deployment
from rigsmith.writer import write_one

FORMAT = "rigsmith-bundle/2"
MANIFEST = "manifest.json"
LOCK_MEMBER = "rigsmith.lock"
IMAGE_MEMBER = "image/engine.oci.tar"
MODEL_PREFIX = "model/"
SECONDARY_PREFIX = "secondary/"
SOURCES_PREFIX = "sources/"
ARTIFACT_PREFIX = "artifacts/"
DEFAULT_TARGETS = ("podman",)


class BundleError(RigsmithError):
    """A bundle is incomplete, tampered with, or does not match its lock."""


class _M(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class Member(_M):
    size: int
    sha256: str


class ImageEntry(_M):
    """The engine image archive and the pin it must match."""

    member: str
    name: str
    tag: str | None
    digest: str | None
    image_id: str | None
    pinned_ref: str
    config_digest: str


class Manifest(_M):
    format: str = FORMAT
    deployment: str
    lock_sha256: str
    image: ImageEntry | None = None
    targets: list[str] = Field(default_factory=list)
    members: dict[str, Member] = Field(default_factory=dict)


def read_manifest(bundle: Path) -> Manifest:
    """The bundle's manifest, or a BundleError saying the bundle is incomplete or not one."""
    path = bundle / MANIFEST
    again = "run `invoke bundle OUT` again on the connected machine"
    try:
        m = Manifest.model_validate_json(path.read_bytes())
    except FileNotFoundError:
        raise BundleError(
            f"{bundle} is not a complete bundle: {MANIFEST} is missing",
            hint=f"an interrupted bundle has no manifest (it is written last): {again} and copy the whole "
            "directory",
        ) from None
    except ValidationError as err:
        raise BundleError(
            f"{path}: not a rigsmith bundle manifest ({err.error_count()} problem(s); first: "
            f"{lockmod.first_problem(err)})",
            hint=f"unbundle reads the manifest.json that bundle writes; {again}",
        ) from None
    except (OSError, ValueError) as err:
        raise BundleError(f"{path}: not a rigsmith bundle manifest ({err})") from None
    if m.format != FORMAT:
        raise BundleError(f"{path}: format {m.format!r}, this rigsmith reads {FORMAT!r}", hint=again)
    return m


def member_path(bundle: Path, member: str) -> Path:
    """The file of a member: a safe name (:mod:`rigsmith.confine`), not the bundle's verified-file record,
    and on disk a regular file reached through no symlink (the manifest and the directory are untrusted)."""
    where = f"{bundle / MANIFEST}: member"
    path = confine.under(bundle, member, where, BundleError)
    if member.split("/")[0] == vf.STATE_DIR:
        raise BundleError(f"{where} {member!r} is not a path inside the bundle's members (book-keeping)")
    if path.exists() and not path.is_file():  # under() refused a link
        raise BundleError(f"{where} {member!r}: {path} is not a regular file (a link, FIFO or device)",
                          hint="copy the bundle again from the connected machine")  # fmt: skip
    return path


@dataclass(frozen=True)
class ModelSet:
    """One Hub model a bundle carries (the main one, or a secondary one: draft, tokenizer, LoRA)."""

    root: Path  # its model dir on this machine
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
    tree_member: str
    assets: dict[str, tuple[lockmod.LockedAsset, str]]  # member → (asset, its sha256 in hex)


@dataclass(frozen=True)
class Contents:
    """Everything a bundle of one deployment must hold, worked out from spec + lock (no disk reads)."""

    spec: Deployment
    models: list[ModelSet]  # the main model first
    pin: ociarchive.ImagePin | None
    sources: SourceSet | None

    def locked(self) -> dict[str, tuple[HashKind, str, int]]:
        """Every member whose hash the lock holds: model files (their Hub hash) and assets (sha256)."""
        out = {s.member(w): (w.kind, w.digest, w.size) for s in self.models for w in s.wanted}
        assets = self.sources.assets.items() if self.sources else ()
        return out | {m: ("sha256", h, a.size) for m, (a, h) in assets}

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
    wanted = wants(files, patches_by_file(m.config_patches))
    models = [ModelSet(expand_dir(m.local_dir), entry, MODEL_PREFIX, "model", wanted)]
    for p in placements(spec):
        sub = lock.secondary.get(spec.name, {}).get(p.repo)
        if sub is None or not sub.files:
            raise LockError(f"rigsmith.lock holds no files for {p.field} ({p.repo})", hint=fetch)
        v = view(spec, p).model
        chosen = wants(select(sub.files, v.allow_patterns, ()), ())
        models.append(ModelSet(expand_dir(v.local_dir), sub, f"{SECONDARY_PREFIX}{p.repo}/", p.field, chosen))
    srcs, build = None, spec.engine.build
    if build and (tree := lock.sources.get(build)):
        hexes = {a.sha256.removeprefix("sha256:"): a for a in tree.assets.values()}
        at = f"{SOURCES_PREFIX}{build}/"
        assets = {f"{at}assets/{h}": (a, h) for h, a in hexes.items()}
        srcs = SourceSet(build, tree, f"{at}{tree.commit}.bundle", assets)
    return Contents(spec, models, ociarchive.image_pin(spec, lock), srcs)


class Record:
    """The verified-file record (:mod:`rigsmith.resolving.model.verified`) of a model dir or a bundle dir: the
    same file, the same rule; written after every change, so a killed run keeps what it verified."""

    def __init__(self, root: Path) -> None:
        self.path = root / vf.STATE_DIR / vf.STATE_FILE
        self.state = vf.read_state(self.path)

    def vouches(self, rel: str, path: Path, kind: HashKind, digest: str) -> bool:
        return vf.vouches(self.state.files.get(rel), vf.seen_at(path), kind, digest)

    def digest(self, rel: str, path: Path) -> str | None:
        """The sha256 the record holds for ``rel`` while it still vouches for ``path``."""
        rec = self.state.files.get(rel)
        return rec.digest if rec is not None and self.vouches(rel, path, "sha256", rec.digest) else None

    def put(self, rel: str, path: Path, kind: HashKind, digest: str) -> None:
        new = vf.verified(vf.seen(path.stat()), kind, digest)
        if self.state.files.get(rel) != new:
            self.state.files[rel] = new
            self.save()

    def save(self) -> None:
        write_one(self.path, vf.dump_state(self.state))


def place(
    src: Path, dst: Path, kind: HashKind, digest: str, size: int, on_bytes: Callable[[int], None]
) -> bool:
    """Put ``src`` at ``dst``: a hard link where possible (True), else a copy that reaches ``dst`` only once
    it hashes to ``digest`` (False). A killed copy leaves no file at ``dst``."""
    tmp = beside(dst, "rigsmith-link")
    tmp.parent.mkdir(parents=True, exist_ok=True)
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
    todo: Sequence[tuple[Path, Path, Want]], moved: Moved, title: str, progress: bool | None,
    placed: Callable[[Path, Want, bool], None],
) -> None:  # fmt: skip
    """:func:`place` each (source, destination, file) under one progress bar; ``placed`` after each."""
    with bars(progress) as prog:
        task = prog.add_task(title, total=sum(w.size for _s, _d, w in todo))
        for src, dst, w in todo:
            linked = place(src, dst, w.kind, w.digest, w.size, lambda n: prog.advance(task, n))
            moved.linked += linked
            moved.copied += not linked
            moved.copied_bytes += 0 if linked else w.size
            placed(dst, w, linked)


def check_space(needs: Mapping[Path, int], disk_free: Callable[[Path], int], what: str, hint: str) -> None:
    """Refuse before the first byte when any filesystem lacks room (paths on one device are summed)."""
    per_dev: dict[int, tuple[Path, int]] = {}
    for path, n in needs.items():
        if n > 0:
            dev = _existing(path).stat().st_dev
            where, total = per_dev.get(dev, (path, 0))
            per_dev[dev] = (where, total + n)
    for where, total in per_dev.values():
        if total > (free := disk_free(where)):
            raise PreflightError(
                f"not enough disk space in {where}: {what} needs {gib(total)}, {gib(free)} is free; "
                "nothing was written",
                hint=hint,
            )


def _existing(p: Path) -> Path:
    return next((q for q in (p, *p.parents) if q.exists()), Path("/"))


def same_filesystem(a: Path, b: Path) -> bool:
    """True when a hard link from ``a`` can land in ``b`` (a directory, or the nearest existing parent)."""
    return a.stat().st_dev == _existing(b).stat().st_dev


@dataclass(frozen=True)
class Io:
    """How bundle and unbundle reach the host (tests pass their own); progress None: on a terminal."""

    echo: Callable[[str], None] = print
    progress: bool | None = None
    run: ociarchive.Run = LocalHost(timeout=3600).run
    disk_free: Callable[[Path], int] = lambda p: shutil.disk_usage(_existing(p)).free


DEFAULT_IO = Io()


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
    """``data`` at ``path`` (atomically) unless the file already holds it."""
    if not same_bytes(path, data):
        with atomic(path) as fh:
            fh.write(data)


def same_bytes(path: Path, data: bytes) -> bool:
    try:
        return path.stat().st_size == len(data) and path.read_bytes() == data
    except FileNotFoundError:
        return False
