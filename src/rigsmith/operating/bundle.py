"""``invoke bundle`` / ``invoke unbundle``: one verified bundle carries a deployment to an offline machine.

A bundle is a directory (optionally streamed as one tar)::

    manifest.json                each member's size and sha256, the lock's sha256, the model and image pins
    rigsmith.lock                the lock as it stands
    deployments/NAME.yaml        the spec
    images/BUILD/…               the image definition and its patches (engine.build)
    artifacts/TARGET/…           the rendered run artifacts (``--targets``)
    model/PATH                   the model files as the Hub serves them at the locked commit
    image/engine.oci.tar         the engine image, an OCI archive whose manifest digest is the lock's

Design:

- **No silent copies.** A model file enters the bundle (and leaves it) as a hard link when both sides are
  on one filesystem; otherwise it is copied with a progress bar, and the disk-space check counts it first.
- **Nothing is hashed twice.** The bundle side trusts fetch-model's verified-state cache
  (``LOCAL_DIR/.rigsmith/state.json``: size + mtime → the lock's hash); files it does not vouch for are
  hashed against the lock before they are bundled. The bundle keeps its own cache
  (``.rigsmith-bundle/state.json``), so a second run on an unchanged deployment does nothing.
- **Digest preserved.** See :mod:`.ociarchive`: ``podman save --format oci-archive`` where that
  reproduces the lock's manifest digest, else ``skopeo copy --preserve-digests`` from the registry; the
  archive's manifest digest is checked against the lock either way, and again after ``podman load``.
- **Verify before placing.** ``unbundle`` checks the disk space, then hashes every member against the
  manifest and the manifest against the lock, and only then writes: the spec and lock into the project,
  the image into local storage, the model into its directory through fetch-model's verified-state cache
  (so ``fetch-model`` afterwards makes no request and hashes nothing).
- **Resumable.** Copies stream into ``partial/<hash>.incomplete`` and resume from there; members verified
  by an interrupted unbundle are not hashed again (``.rigsmith/unbundle/verified-*.json`` in the checkout,
  never in the bundle: size, mtime and inode → sha256); placed model files are recorded in fetch-model's
  cache as they land.
"""

from __future__ import annotations

import errno
import hashlib
import json
import os
import shutil
import sys
import tarfile
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError
from rich.console import Console
from rich.progress import (
    BarColumn,
    DownloadColumn,
    Progress,
    TaskProgressColumn,
    TextColumn,
    TimeRemainingColumn,
    TransferSpeedColumn,
)

from rigsmith import spec as specmod
from rigsmith import writer
from rigsmith.errors import AdapterError, ConsentError, LockError, PreflightError, RigsmithError
from rigsmith.operating import ociarchive
from rigsmith.project import Project
from rigsmith.resolving import lock as lockmod
from rigsmith.resolving.modelfiles import (
    HASH_CHUNK,
    STATE_DIR,
    STATE_FILE,
    DirState,
    FileState,
    Hasher,
    HashKind,
    Want,
    dump_state,
    expand_dir,
    hash_stream,
    patches_by_file,
    read_state,
    select,
    still_verified,
    wants,
)
from rigsmith.spec import Deployment
from rigsmith.writer import write_one

Echo = Callable[[str], None]
DiskFree = Callable[[Path], int]

FORMAT = "rigsmith-bundle/1"
MANIFEST = "manifest.json"
LOCK_MEMBER = "rigsmith.lock"
IMAGE_MEMBER = "image/engine.oci.tar"
MODEL_PREFIX = "model/"
ARTIFACT_PREFIX = "artifacts/"
#: The bundle's own book-keeping (never a member, never in the tar).
BUNDLE_STATE = ".rigsmith-bundle"
DEFAULT_TARGETS = ("podman",)


class BundleError(RigsmithError):
    """A bundle is incomplete, tampered with, or does not match its lock."""


# -- the manifest ---------------------------------------------------------------------------------------


class _M(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class Member(_M):
    """One file of the bundle."""

    size: int
    sha256: str


class ModelFile(_M):
    """A model file: its member, and the hash the lock holds for it."""

    member: str
    size: int
    kind: HashKind
    digest: str


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
    """``manifest.json``."""

    format: str = FORMAT
    deployment: str
    lock_sha256: str
    model_repo: str
    model_commit: str
    model: dict[str, ModelFile] = Field(default_factory=dict)  # key: path in the repo
    image: ImageEntry | None = None
    targets: list[str] = Field(default_factory=list)
    members: dict[str, Member] = Field(default_factory=dict)


def dump_manifest(m: Manifest) -> str:
    return json.dumps(m.model_dump(mode="json"), indent=1, sort_keys=True) + "\n"


def read_manifest(bundle: Path) -> Manifest:
    """The bundle's manifest, or a BundleError saying the bundle is incomplete or not one."""
    path = bundle / MANIFEST
    try:
        m = Manifest.model_validate_json(path.read_bytes())
    except FileNotFoundError:
        raise BundleError(
            f"{bundle} is not a complete bundle: {MANIFEST} is missing",
            hint="an interrupted `invoke bundle` writes the manifest last; run it again on the connected "
            "machine and copy the whole directory",
        ) from None
    except (OSError, ValidationError, ValueError) as err:
        raise BundleError(f"{path}: not a rigsmith bundle manifest ({err})") from None
    if m.format != FORMAT:
        raise BundleError(f"{path}: format {m.format!r}, this rigsmith reads {FORMAT!r}")
    return m


def _member_path(bundle: Path, member: str) -> Path:
    """The file of a member, refusing names that would leave the bundle (the manifest is untrusted)."""
    parts = Path(member).parts
    if not member or member.startswith("/") or ".." in parts or parts[0] == BUNDLE_STATE:
        raise BundleError(f"{bundle / MANIFEST}: member name {member!r} is not a path inside the bundle")
    return bundle / member


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
    tmp = dst.with_name(f".{dst.name}.rigsmith-link")
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


def _progress(show: bool | None) -> Progress:
    """One bar per phase; with a percentage, since a 100 GiB phase moves the bar slowly."""
    console = Console(stderr=True)
    return Progress(
        TextColumn("{task.description}"),
        BarColumn(),
        TaskProgressColumn(),
        DownloadColumn(binary_units=True),
        TransferSpeedColumn(),
        TimeRemainingColumn(),
        console=console,
        disable=not (console.is_terminal if show is None else show),
        transient=True,
    )


@dataclass
class Moved:
    """How model files got where they go: hard links, copies (and what a resumed copy did not redo)."""

    linked: int = 0
    copied: int = 0
    copied_bytes: int = 0
    resumed_bytes: int = 0

    def describe(self) -> str:
        resumed = f", {_gib(self.resumed_bytes)} resumed" if self.resumed_bytes else ""
        return f"{self.linked} hard-linked, {self.copied} copied ({_gib(self.copied_bytes)}{resumed})"


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
    with _progress(progress) as prog:
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


def _gib(n: int) -> str:
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
                f"not enough disk space in {where}: {what} needs {_gib(total)}, {_gib(free)} is free; "
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


# -- bundle -----------------------------------------------------------------------------------------------


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
            head += f"{_gib(self.total_bytes)})"
        else:
            parts = [
                self.moved.describe(),
                f"{len(self.written)} written, {self.unchanged} unchanged, {_gib(self.hashed_bytes)} hashed",
            ]
            if self.image:
                parts.append(f"image exported: {self.image}")
            head = f"bundle {self.out}: {self.members} members, {_gib(self.total_bytes)}; " + "; ".join(parts)
        head += f"\nlock sha256 {self.lock_sha256} (compare it on the offline machine)"
        return head + (f"\ntar: {self.tar}" if self.tar else "")


def _small_members(project: Project, c: Contents, targets: Sequence[str]) -> dict[str, bytes]:
    """Spec, lock, image definition and rendered artifacts: member name → bytes (all read or rendered now)."""
    from rigsmith.rendering import deploy as deploymod  # the targets: loaded only by the commands that render

    name = c.spec.name
    out: dict[str, bytes] = {
        f"deployments/{name}.yaml": project.spec_path(name).read_bytes(),
        LOCK_MEMBER: project.lock_path.read_bytes(),
    }
    if c.spec.engine.build:
        home = project.images / c.spec.engine.build
        for p in sorted(home.rglob("*")):
            if p.is_file():
                out[f"images/{c.spec.engine.build}/{p.relative_to(home).as_posix()}"] = p.read_bytes()
    for target in targets:
        _plan, files = deploymod.artifacts(project, target, deployment=name, out=project.root)
        for a in files:
            rel = a.path.relative_to(project.root.resolve()).as_posix()
            out[ARTIFACT_PREFIX + rel] = a.content.encode("utf-8")
    return out


def bundle(
    project: Project,
    deployment: str | None,
    out: Path,
    *,
    targets: Sequence[str] = DEFAULT_TARGETS,
    tar: Path | None = None,
    io: Io = DEFAULT_IO,
) -> BundleReport:
    """Write (or bring up to date) the bundle of one deployment in ``out``; optionally tar it.

    Raises:
        LockError: the model or image is not locked.
        HashMismatch / BundleError: a model file on disk is not what the lock says.
        ImageMismatch: the image cannot be exported with the lock's digest.
        PreflightError: too little disk space (checked before anything is copied).
    """
    echo, progress, run, disk_free = io.echo, io.progress, io.run, io.disk_free
    spec = project.load(deployment)
    lock = lockmod.read(project.lock_path)
    c = contents(spec, lock)
    root = expand_dir(spec.model.local_dir)
    out = out.absolute()
    report = BundleReport(out=str(out))
    small = _small_members(project, c, targets)
    state_path = out / BUNDLE_STATE / STATE_FILE
    bstate = read_state(state_path)
    fetched = read_state(root / STATE_DIR / STATE_FILE)

    def vouched(member: str, path: Path, kind: HashKind, digest: str | None = None) -> str | None:
        """The digest the bundle's cache holds for a member still as it was recorded (and as wanted)."""
        try:
            st = path.stat()
        except FileNotFoundError:
            return None
        fs = bstate.files.get(member)
        if fs is None or not still_verified(fs, st.st_size, st.st_mtime_ns, kind, digest or fs.digest):
            return None
        return fs.digest

    def remember(member: str, path: Path, kind: HashKind, digest: str) -> None:
        st = path.stat()
        new = FileState(size=st.st_size, mtime_ns=st.st_mtime_ns, kind=kind, digest=digest)
        if bstate.files.get(member) != new:
            bstate.files[member] = new
            write_one(state_path, dump_state(bstate))

    # Plan the model: which sources are verified, which members must be placed, what must be copied.
    todo: list[Want] = []
    for w in c.wanted:
        src = root / w.disk_path
        try:
            st = src.stat()
        except FileNotFoundError:
            raise BundleError(
                f"{src}: missing — the model is not fetched (or was moved)",
                hint=f"run `invoke fetch-model --deployment {spec.name}` first",
            ) from None
        if not still_verified(fetched.files.get(w.disk_path), st.st_size, st.st_mtime_ns, w.kind, w.digest):
            _verify_source(src, w, report)
        dst = out / (MODEL_PREFIX + w.repo_path)
        member = MODEL_PREFIX + w.repo_path
        if not (dst.exists() and (src.samefile(dst) or vouched(member, dst, w.kind, w.digest))):
            todo.append(w)
    copy_bytes = sum(w.size for w in todo if not same_filesystem(root / w.disk_path, out))
    image_dst = out / IMAGE_MEMBER
    image_fresh = c.pin is None or (
        vouched(IMAGE_MEMBER, image_dst, "sha256") is not None and bstate.commit == _pin_key(c.pin)
    )
    image_need = 0 if image_fresh or c.pin is None else _image_size(c.pin, run)
    check_space(
        {out: copy_bytes + image_need},
        disk_free,
        "the bundle (model files that cannot be hard-linked across filesystems, and the image archive)",
        "free space there, or bundle into a directory on the model's filesystem (hard links, no copy)",
    )
    (out / BUNDLE_STATE).mkdir(parents=True, exist_ok=True)
    stale_small = [m for m, data in small.items() if not _same_bytes(out / m, data)]
    if todo or not image_fresh or stale_small:
        # The manifest is written last: while members change, no manifest vouches for a half-made bundle.
        (out / MANIFEST).unlink(missing_ok=True)
    if copy_bytes:
        echo(
            f"bundle: {out} is on another filesystem than {root}: copying {_gib(copy_bytes)} of model files "
            "(a directory on the model's filesystem would take hard links instead)"
        )

    for member, data in small.items():
        path = out / member
        if member in stale_small:
            path.parent.mkdir(parents=True, exist_ok=True)
            _write_bytes(path, data)
            report.written.append(member)
        else:
            report.unchanged += 1
        remember(member, path, "sha256", hashlib.sha256(data).hexdigest())
    if _drop_stale(out, set(small) | {MODEL_PREFIX + w.repo_path for w in c.wanted} | {IMAGE_MEMBER}, bstate):
        write_one(state_path, dump_state(bstate))

    place_all(
        todo,
        lambda w: (
            root / w.disk_path,
            out / (MODEL_PREFIX + w.repo_path),
            out / BUNDLE_STATE / "partial" / w.partial_name,
        ),
        report.moved,
        title=f"bundle {spec.name}",
        progress=progress,
    )
    report.unchanged += len(c.wanted) - len(todo)

    model: dict[str, ModelFile] = {}
    members: dict[str, Member] = {}
    for w in c.wanted:
        member = MODEL_PREFIX + w.repo_path
        path = out / member
        if w.kind == "sha256":
            sha = w.digest
        else:  # a small (non-LFS) file: the lock has its git blob sha1, the manifest wants sha256
            sha = sha256_file(path)
            report.hashed_bytes += w.size
        remember(member, path, w.kind, w.digest)
        model[w.repo_path] = ModelFile(member=member, size=w.size, kind=w.kind, digest=w.digest)
        members[member] = Member(size=w.size, sha256=sha)
    for member, data in small.items():
        members[member] = Member(size=len(data), sha256=hashlib.sha256(data).hexdigest())

    image = None
    if c.pin is not None:
        image, exported = _bundle_image(c.pin, out, bstate, vouched, remember, run, echo, progress)
        if exported:
            report.image = c.pin.pinned_ref
            report.hashed_bytes += image_dst.stat().st_size
        members[IMAGE_MEMBER] = Member(
            size=image_dst.stat().st_size, sha256=bstate.files[IMAGE_MEMBER].digest
        )
        if bstate.commit != _pin_key(c.pin):
            bstate.commit = _pin_key(c.pin)
            write_one(state_path, dump_state(bstate))

    manifest = Manifest(
        deployment=spec.name,
        lock_sha256=members[LOCK_MEMBER].sha256,
        model_repo=c.entry.repo,
        model_commit=c.entry.commit,
        model=model,
        image=image,
        targets=list(targets),
        members=dict(sorted(members.items())),
    )
    text = dump_manifest(manifest)
    mpath = out / MANIFEST
    if not (mpath.is_file() and mpath.read_text(encoding="utf-8") == text):
        write_one(mpath, text)
        report.written.append(MANIFEST)
    report.members = len(members)
    report.total_bytes = sum(m.size for m in members.values())
    report.lock_sha256 = manifest.lock_sha256
    if tar is not None:
        write_tar(out, manifest, tar, progress=progress)
        report.tar = str(tar)
    return report


@contextmanager
def _atomic(path: Path) -> Iterator[IO[bytes]]:
    """Write a file beside ``path``, fsync it, rename it over ``path``; on any error leave no trace."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.rigsmith-tmp")
    try:
        with tmp.open("wb") as fh:
            yield fh
            fh.flush()
            os.fsync(fh.fileno())
        tmp.replace(path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def _write_bytes(path: Path, data: bytes) -> None:
    with _atomic(path) as fh:
        fh.write(data)


def _same_bytes(path: Path, data: bytes) -> bool:
    try:
        return path.stat().st_size == len(data) and path.read_bytes() == data
    except FileNotFoundError:
        return False


def _pin_key(pin: ociarchive.ImagePin) -> str:
    return f"{pin.pinned_ref} {pin.digest} {pin.image_id}"


def _image_size(pin: ociarchive.ImagePin, run: ociarchive.Run) -> int:
    for src in pin.sources:
        info = ociarchive.inspect(src, run)
        if info is not None:
            return int(info.get("Size") or 0)
    return 0


def _verify_source(src: Path, w: Want, report: BundleReport) -> None:
    """Hash a model file fetch-model's cache does not vouch for; refuse one that is not the lock's."""
    with src.open("rb") as fh:
        got = hash_stream(w.kind, w.size, fh).hexdigest()
    report.hashed_bytes += w.size
    if got != w.digest or src.stat().st_size != w.size:
        raise BundleError(
            f"{src}: {w.kind} {got} on disk, the lock says {w.digest}; it is not bundled",
            hint="run `invoke fetch-model --verify` to restore the locked file, then `invoke bundle` again",
        )


def _drop_stale(out: Path, keep: set[str], bstate: DirState) -> list[str]:
    """Remove members an earlier bundle of another lock state left (files the lock no longer names)."""
    stale = [m for m in bstate.files if m not in keep]
    for member in stale:
        (out / member).unlink(missing_ok=True)
        del bstate.files[member]
    return stale


def _bundle_image(
    pin: ociarchive.ImagePin,
    out: Path,
    bstate: DirState,
    vouched: Callable[[str, Path, HashKind], str | None],
    remember: Callable[[str, Path, HashKind, str], None],
    run: ociarchive.Run,
    echo: Echo,
    progress: bool | None,
) -> tuple[ImageEntry, bool]:
    dst = out / IMAGE_MEMBER
    sha = vouched(IMAGE_MEMBER, dst, "sha256") if bstate.commit == _pin_key(pin) else None
    exported = sha is None
    if sha is None:
        stage = out / BUNDLE_STATE / "partial" / "engine.oci.tar"
        stage.parent.mkdir(parents=True, exist_ok=True)
        echo(f"bundle: exporting {pin.pinned_ref} as an OCI archive")
        ociarchive.export(pin, stage, run=run, echo=echo)
        size = stage.stat().st_size
        with _progress(progress) as prog:
            task = prog.add_task("hash image archive", total=size)
            sha = sha256_file(stage, lambda n: prog.advance(task, n))
        dst.parent.mkdir(parents=True, exist_ok=True)
        stage.replace(dst)
        remember(IMAGE_MEMBER, dst, "sha256", sha)
    facts = ociarchive.archive_facts(dst, IMAGE_MEMBER)
    entry = ImageEntry(
        member=IMAGE_MEMBER,
        name=pin.name,
        tag=pin.tag,
        digest=pin.digest,
        image_id=pin.image_id,
        pinned_ref=pin.pinned_ref,
        config_digest=facts.config_digest,
    )
    return entry, exported


def write_tar(out: Path, manifest: Manifest, dest: Path, *, progress: bool | None = None) -> None:
    """The bundle as one tar: manifest first (an unpacker can refuse early), then the members in order.

    ``dest`` of ``-`` streams to stdout; a file is written beside its final name and renamed at the end.
    """
    names = [MANIFEST, *manifest.members]
    total = sum((out / n).stat().st_size for n in names)
    if str(dest) == "-":
        _tar_to(sys.stdout.buffer, out, names, total, progress)
        return
    dest = dest.absolute()
    with _atomic(dest) as fh:
        _tar_to(fh, out, names, total, progress)


def _tar_to(fh: IO[bytes], out: Path, names: Sequence[str], total: int, progress: bool | None) -> None:
    with _progress(progress) as prog, tarfile.open(fileobj=fh, mode="w|", format=tarfile.PAX_FORMAT) as tf:
        task = prog.add_task("tar", total=total)
        for name in names:
            path = out / name
            info = tarfile.TarInfo(name)
            info.size = path.stat().st_size
            info.mode = 0o644
            with path.open("rb") as src:
                tf.addfile(info, src)
            prog.advance(task, info.size)


# -- unbundle ---------------------------------------------------------------------------------------------


@dataclass
class UnbundleReport:
    """What one ``unbundle`` run did."""

    deployment: str = ""
    local_dir: str = ""
    verified: int = 0
    verified_earlier: int = 0
    hashed_bytes: int = 0
    moved: Moved = field(default_factory=Moved)
    already_placed: int = 0
    image: str = ""
    image_loaded: bool = False
    fetch_summary: str = ""
    lock_sha256: str = ""

    def summary(self) -> str:
        parts = [
            f"unbundled {self.deployment}: {self.verified + self.verified_earlier} members verified "
            f"({self.verified_earlier} earlier, {_gib(self.hashed_bytes)} hashed)",
            f"model in {self.local_dir}: {self.moved.describe()}, {self.already_placed} already in place",
        ]
        if self.image:
            parts.append(f"image {self.image} " + ("loaded" if self.image_loaded else "already present"))
        text = "; ".join(parts) + f"\nlock sha256 {self.lock_sha256} (the bundling machine printed it too)"
        return text + (f"\nfetch-model: {self.fetch_summary}" if self.fetch_summary else "")


class OfflineHub:
    """The Hub as unbundle sees it: there is none. fetch-model must find everything verified on disk."""

    endpoint = "offline:"

    def _refuse(self) -> AdapterError:
        return AdapterError(
            "unbundle is offline: a model file was not placed verified, so fetch-model would need the Hub",
            hint="run `invoke unbundle` again (it resumes); if it persists the bundle lacks a file",
        )

    def resolve(self, repo: str, revision: str) -> str:
        raise self._refuse()

    def tree(self, repo: str, commit: str) -> list[Any]:
        raise self._refuse()

    def download(self, repo: str, commit: str, path: str, out: Any, *, offset: int, size: int) -> None:
        raise self._refuse()


@contextmanager
def _offline() -> Iterator[None]:
    """HF_HUB_OFFLINE=1 for the duration (anything that would still reach for the Hub fails fast)."""
    old = os.environ.get("HF_HUB_OFFLINE")
    os.environ["HF_HUB_OFFLINE"] = "1"
    try:
        yield
    finally:
        if old is None:
            os.environ.pop("HF_HUB_OFFLINE", None)
        else:
            os.environ["HF_HUB_OFFLINE"] = old


def unbundle(
    project: Project,
    path: Path,
    *,
    into: Path | None = None,
    yes: bool = False,
    confirm: Callable[[str], bool] | None = None,
    io: Io = DEFAULT_IO,
) -> UnbundleReport:
    """Verify a bundle completely, then place spec, lock, image and model; never touches the network.

    Raises:
        BundleError: a member is missing or does not hash to the manifest, or the manifest is not the lock's.
        PreflightError: too little space for the model or the image (checked before the first byte).
        ImageMismatch: the engine holds another image than the lock pins after the load.
        ConsentError: the project holds a different spec or artifact and ``yes`` was not given.
    """
    echo, progress, run, disk_free = io.echo, io.progress, io.run, io.disk_free
    with _offline():
        bundle_dir = _unpacked(project, path.absolute(), echo, progress, disk_free)
        report = _unbundle_dir(project, bundle_dir, into, yes, confirm, echo, progress, run, disk_free)
        if bundle_dir != path.absolute():
            # The model holds hard links to what was unpacked (or copies): the unpacked tree can go.
            shutil.rmtree(bundle_dir)
        return report


def _unpacked(project: Project, path: Path, echo: Echo, progress: bool | None, disk_free: DiskFree) -> Path:
    """A bundle directory as is; a tar is unpacked (safely) into the project first, resumably."""
    if path.is_dir():
        return path
    if not path.is_file():
        raise BundleError(f"{path}: no such bundle (a directory made by `invoke bundle`, or its --tar file)")
    dest = _work_dir(project) / path.name.removesuffix(".tar")
    try:
        with tarfile.open(path, "r:") as tf:
            infos = tf.getmembers()
    except tarfile.TarError as err:
        raise BundleError(f"{path}: not a bundle tar ({err})") from None
    need = sum(i.size for i in infos if not _have(dest / i.name, i.size))
    check_space(
        {dest: need}, disk_free, f"unpacking {path.name}", "unpack it elsewhere and pass the directory"
    )
    echo(f"unbundle: unpacking {path} into {dest}")
    dest.mkdir(parents=True, exist_ok=True)
    with tarfile.open(path, "r:") as tf, _progress(progress) as prog:
        task = prog.add_task(f"unpack {path.name}", total=sum(i.size for i in infos))
        for info in tf:
            if not (info.isfile() and _have(dest / info.name, info.size)):
                try:
                    tf.extract(info, dest, filter="data")
                except tarfile.TarError as err:  # FilterError: a name leaving the bundle, a link, a device
                    raise BundleError(f"{path}: refusing member {info.name!r}: {err}") from None
            prog.advance(task, info.size)
    return dest


def _work_dir(project: Project) -> Path:
    """Unbundle's own book-keeping in the checkout (``.rigsmith/`` is git-ignored): unpacked tars and the
    cache of members verified so far."""
    return project.root / STATE_DIR / "unbundle"


def _have(p: Path, size: int) -> bool:
    try:
        return p.stat().st_size == size
    except FileNotFoundError:
        return False


def _unbundle_dir(
    project: Project,
    bundle_dir: Path,
    into: Path | None,
    yes: bool,
    confirm: Callable[[str], bool] | None,
    echo: Echo,
    progress: bool | None,
    run: ociarchive.Run,
    disk_free: DiskFree,
) -> UnbundleReport:
    manifest = read_manifest(bundle_dir)
    name = manifest.deployment
    for member in manifest.members:
        _member_path(bundle_dir, member)
    missing = [m for m in manifest.members if not (bundle_dir / m).is_file()]
    if missing:
        raise BundleError(
            f"{bundle_dir} is incomplete: {len(missing)} member(s) missing: " + ", ".join(missing[:10]),
            hint="copy the whole bundle directory again (or re-run `invoke bundle`; it resumes)",
        )
    short = [
        f"{m}: {(bundle_dir / m).stat().st_size} bytes, the manifest says {e.size}"
        for m, e in manifest.members.items()
        if (bundle_dir / m).stat().st_size != e.size
    ]
    if short:
        raise BundleError(f"{bundle_dir}: member(s) of the wrong size: " + "; ".join(short),
                          hint="the copy is damaged or incomplete; copy the bundle again")  # fmt: skip

    # The manifest against the lock it carries (cheap: before hashing anything).
    spec_member = f"deployments/{name}.yaml"
    if spec_member not in manifest.members or LOCK_MEMBER not in manifest.members:
        raise BundleError(f"{bundle_dir / MANIFEST}: lists no {spec_member} or {LOCK_MEMBER}")
    lock_bytes = (bundle_dir / LOCK_MEMBER).read_bytes()
    lock_sha = hashlib.sha256(lock_bytes).hexdigest()
    if lock_sha != manifest.lock_sha256 or manifest.members[LOCK_MEMBER].sha256 != manifest.lock_sha256:
        raise BundleError(
            f"{LOCK_MEMBER}: sha256 {lock_sha}, the manifest says {manifest.lock_sha256}; bundle refused",
            hint="the lock in the bundle was changed after bundling; bundle again on the connected machine",
        )
    try:
        bundle_lock = lockmod.Lock.model_validate_json(lock_bytes)
    except ValidationError as err:
        raise BundleError(
            f"{LOCK_MEMBER} in {bundle_dir}: not a rigsmith lock ({err.errors()[0]['msg']})"
        ) from None
    spec_bytes = (bundle_dir / spec_member).read_bytes()
    spec = specmod.loads(spec_bytes.decode("utf-8"), source=spec_member)
    c = contents(spec, bundle_lock)
    problems = check_against_lock(manifest, c)
    if problems:
        raise BundleError(f"{bundle_dir / MANIFEST} does not match its lock: " + "; ".join(problems),
                          hint="bundle again on the connected machine")  # fmt: skip

    root = into.absolute() if into is not None else expand_dir(spec.model.local_dir)
    report = UnbundleReport(deployment=name, local_dir=str(root), lock_sha256=lock_sha)
    fetched = read_state(root / STATE_DIR / STATE_FILE)

    def in_place(w: Want) -> bool:
        try:
            st = (root / w.disk_path).stat()
        except FileNotFoundError:
            return False
        return still_verified(fetched.files.get(w.disk_path), st.st_size, st.st_mtime_ns, w.kind, w.digest)

    todo = [w for w in c.wanted if not in_place(w)]
    copy_bytes = sum(
        w.size for w in todo if not same_filesystem(bundle_dir / (MODEL_PREFIX + w.repo_path), root)
    )
    image_present = c.pin is None or ociarchive.present(c.pin, run)
    needs = {root: copy_bytes}
    if not image_present:
        store = ociarchive.storage_root(run)
        if store is not None:
            needs[store] = needs.get(store, 0) + manifest.members[IMAGE_MEMBER].size
    check_space(
        needs,
        disk_free,
        "unbundling (model files copied across filesystems, and the image in podman's storage)",
        "free space there, or pass --into DIR on a bigger disk (on the bundle's filesystem the model is "
        "hard-linked, not copied)",
    )

    key = hashlib.sha256(str(bundle_dir).encode()).hexdigest()[:16]
    _verify_members(bundle_dir, manifest, c, report, progress, _work_dir(project) / f"verified-{key}.json")

    # Everything checks out: place the project files, the image, the model.
    _place_project(project, bundle_dir, manifest, spec, bundle_lock, c, into, root, yes, confirm, echo)
    if c.pin is not None:
        report.image = c.pin.pinned_ref
        if not image_present:
            echo(f"unbundle: loading {c.pin.pinned_ref} into local storage")
            ociarchive.load(c.pin, bundle_dir / IMAGE_MEMBER, run=run)
            report.image_loaded = True
    _place_model(bundle_dir, c, root, todo, fetched, report, progress)
    report.already_placed = len(c.wanted) - len(todo)

    from rigsmith.resolving import modelfetch  # re-check through fetch-model itself: offline, from the cache

    placed = project.load(name)
    fetch = modelfetch.fetch_model(
        project, placed, dest=None if into is None else root, hub=OfflineHub(), echo=echo, progress=False
    )
    if fetch.downloaded or fetch.cached != len(c.wanted):
        raise BundleError(
            f"{root}: after unbundling, fetch-model verified {fetch.cached} of {len(c.wanted)} files from "
            "its cache",
            hint="run `invoke unbundle` again",
        )
    report.fetch_summary = fetch.summary()
    return report


def _verify_members(
    bundle_dir: Path,
    manifest: Manifest,
    c: Contents,
    report: UnbundleReport,
    progress: bool | None,
    cache_path: Path,
) -> None:
    """Hash every member (sha256, plus the git blob sha1 of small model files); refuse any mismatch.

    Members an earlier (interrupted) run hashed, still at the same size, mtime and inode, are taken from
    ``cache_path``. It lives on this machine, never in the bundle: a cache that travelled with the bundle
    could vouch for tampered bytes.
    """
    cache = read_state(cache_path)
    if cache.commit != manifest.lock_sha256 or cache.repo != str(bundle_dir):
        cache = DirState(repo=str(bundle_dir), commit=manifest.lock_sha256)
    git = {f.member: f for f in manifest.model.values() if f.kind == "git_sha1"}
    bad: list[str] = []
    todo = []
    for member, e in manifest.members.items():
        st = (bundle_dir / member).stat()
        fs = cache.files.get(member)
        if (
            fs is not None
            and (fs.size, fs.mtime_ns) == (st.st_size, st.st_mtime_ns)
            and fs.digest == f"{e.sha256}:{st.st_ino}"
        ):
            report.verified_earlier += 1
        else:
            todo.append(member)
    with _progress(progress) as prog:
        task = prog.add_task("verify bundle", total=sum(manifest.members[m].size for m in todo))
        for member in todo:
            e = manifest.members[member]
            path = bundle_dir / member
            st = path.stat()
            h = hashlib.sha256()
            g = Hasher("git_sha1", e.size) if member in git else None
            buf = bytearray(HASH_CHUNK)
            view = memoryview(buf)
            with path.open("rb") as fh:
                while n := fh.readinto(view):
                    h.update(view[:n])
                    if g is not None:
                        g.update(view[:n])
                    prog.advance(task, n)
            report.hashed_bytes += e.size
            got = h.hexdigest()
            if got != e.sha256:
                bad.append(f"{member}: sha256 {got}, the manifest says {e.sha256}")
                continue
            if g is not None and g.hexdigest() != git[member].digest:
                bad.append(f"{member}: git blob sha1 {g.hexdigest()}, the lock says {git[member].digest}")
                continue
            report.verified += 1
            cache.files[member] = FileState(
                size=st.st_size, mtime_ns=st.st_mtime_ns, kind="sha256", digest=f"{got}:{st.st_ino}"
            )
            cache_path.parent.mkdir(parents=True, exist_ok=True)
            write_one(cache_path, dump_state(cache))
    if bad:
        raise BundleError(
            f"refusing the bundle {bundle_dir}: {len(bad)} member(s) do not match: "
            + "; ".join(bad)
            + "; nothing was placed",
            hint="the bundle was changed or damaged in transit; copy it again from the connected machine",
        )
    if c.pin is not None:
        facts = ociarchive.archive_facts(bundle_dir / IMAGE_MEMBER, IMAGE_MEMBER)
        if not ociarchive.matches(c.pin, facts):
            raise BundleError(
                f"{IMAGE_MEMBER}: holds manifest {facts.manifest_digest} (image ID {facts.config_digest}), "
                f"the lock pins {c.pin.digest or c.pin.image_id}",
                hint="bundle again on the connected machine",
            )


def _place_project(
    project: Project,
    bundle_dir: Path,
    manifest: Manifest,
    spec: Deployment,
    bundle_lock: lockmod.Lock,
    c: Contents,
    into: Path | None,
    root: Path,
    yes: bool,
    confirm: Callable[[str], bool] | None,
    echo: Echo,
) -> None:
    """Spec, image definition and artifacts through the writer (consent rules); the lock entries merged."""
    from rigsmith.rendering import deploy as deploymod

    name = spec.name
    relocated = into is not None and root != expand_dir(spec.model.local_dir)
    files: list[writer.Artifact] = []
    spec_text = (bundle_dir / f"deployments/{name}.yaml").read_text(encoding="utf-8")
    if relocated:
        data = specmod.to_data(spec)
        data["model"]["local_dir"] = str(root)
        spec_text = specmod.dump(specmod.from_data(data))
        echo(f"unbundle: model.local_dir of deployments/{name}.yaml set to {root} (--into)")
    files.append(writer.Artifact(project.spec_path(name), spec_text))
    # Image-definition files that are not text go around the (text-only) writer, under the same consent.
    binary: list[tuple[Path, bytes]] = []
    for member in manifest.members:
        if member.startswith("images/"):
            blob = (bundle_dir / member).read_bytes()
            try:
                files.append(writer.Artifact(project.root / member, blob.decode("utf-8")))
            except UnicodeDecodeError:
                binary.append((project.root / member, blob))
        elif member.startswith(ARTIFACT_PREFIX) and not relocated:
            p = project.root / member.removeprefix(ARTIFACT_PREFIX)
            mode = 0o755 if p.suffix == ".sh" else 0o644
            files.append(writer.Artifact(p, (bundle_dir / member).read_text(encoding="utf-8"), mode))
    differs = [str(p) for p, b in binary if p.exists() and not _same_bytes(p, b)]
    if differs and not yes:
        raise ConsentError(
            f"would replace existing file(s) with the bundle's: {', '.join(differs)}; nothing was written",
            hint="re-run with --yes to accept them",
        )
    writer.write(files, yes=yes, confirm=confirm, echo=echo, root=project.root)
    for path, b in binary:
        if not _same_bytes(path, b):
            _write_bytes(path, b)
    with lockmod.locked(project.lock_path) as lk:
        lk.models[name] = c.entry
        if spec.engine.image and spec.engine.image in bundle_lock.images:
            lk.images[spec.engine.image] = bundle_lock.images[spec.engine.image]
        if spec.engine.build and spec.engine.build in bundle_lock.builds:
            lk.builds[spec.engine.build] = bundle_lock.builds[spec.engine.build]
    if relocated and manifest.targets:
        for target in manifest.targets:
            _plan, arts = deploymod.artifacts(project, target, deployment=name)
            writer.write(arts, yes=yes, confirm=confirm, echo=echo, root=project.root)


def _place_model(
    bundle_dir: Path,
    c: Contents,
    root: Path,
    todo: Sequence[Want],
    fetched: DirState,
    report: UnbundleReport,
    progress: bool | None,
) -> None:
    """Link or copy each verified member to where fetch-model keeps it; record it in fetch-model's cache."""
    state_path = root / STATE_DIR / STATE_FILE
    (root / STATE_DIR).mkdir(parents=True, exist_ok=True)
    fetched.repo, fetched.commit = c.entry.repo, c.entry.commit

    def record(w: Want) -> None:
        st = (root / w.disk_path).stat()
        fetched.files[w.disk_path] = FileState(
            size=st.st_size, mtime_ns=st.st_mtime_ns, kind=w.kind, digest=w.digest
        )
        write_one(state_path, dump_state(fetched))

    place_all(
        todo,
        lambda w: (
            bundle_dir / (MODEL_PREFIX + w.repo_path),
            root / w.disk_path,
            root / STATE_DIR / "partial" / w.partial_name,
        ),
        report.moved,
        title=f"place {c.spec.name}",
        progress=progress,
        placed=record,
    )
