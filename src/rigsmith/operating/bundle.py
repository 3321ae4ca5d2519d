"""``invoke bundle`` / ``invoke unbundle``: one verified bundle carries a deployment to an offline machine.

A bundle is a directory (optionally streamed as one tar)::

    manifest.json                each member's size and sha256, the lock's sha256, the image pin
    rigsmith.lock                the lock as it stands
    deployments/NAME.yaml        the spec
    images/BUILD/…               the image definition and its patches (engine.build)
    artifacts/TARGET/…           the rendered run artifacts (``--targets``)
    model/PATH                   the model files as the Hub serves them at the locked commit
    secondary/OWNER/NAME/PATH    the secondary models (draft, tokenizer, LoRA), likewise
    image/engine.oci.tar         the engine image, an OCI archive whose manifest digest is the lock's
    sources/BUILD/COMMIT.bundle  the source tree of a source-built image: a git bundle of the locked commit
    sources/BUILD/assets/SHA256  its release assets

Design:

- **No silent copies.** A model file enters the bundle (and leaves it) as a hard link when both sides are
  on one filesystem; otherwise it is copied, hashed on the way, and the disk-space check counts it first.
- **One verified-file record.** A model file is trusted unhashed only while its model dir's record
  (:mod:`rigsmith.resolving.verified`: size, mtime, ctime, inode, device → the lock's hash) vouches for it;
  else it is hashed against the lock first. Members that are not hard links to such files (copies, the
  image archive, the source tree, assets) are kept in the same record in the bundle dir
  (``.rigsmith/state.json``, never a member): a re-run on an unchanged deployment hashes and writes
  nothing. Re-hashing the image archive instead would cost ~15 s per 10 GiB here (sha256 at ~650 MiB/s on
  this 2-core machine, measured), so the record stays.
- **Digest preserved.** See :mod:`.ociarchive`: ``podman save --format oci-archive`` where that
  reproduces the lock's manifest digest, else ``skopeo copy --preserve-digests`` from the registry; the
  archive's manifest digest is checked against the lock either way, and again after ``podman load``.
- **Verify before placing.** ``unbundle`` checks the disk space, then hashes every member it will place
  (model files against the lock, the rest against the manifest, the manifest against the lock) and only
  then writes: the spec and lock into the project, the image into local storage, the source tree and
  assets into the source cache, the models into their directories, each recorded in that directory's
  verified-file record as it lands (so ``fetch-model`` afterwards makes no request and hashes nothing).
- **Resumable at file level.** A file reaches its final name only whole and verified; a model file already
  in place and vouched for by its record is neither hashed nor placed again.
"""

from __future__ import annotations

import hashlib
import sys
import tarfile
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import IO, TYPE_CHECKING

from rigsmith.operating import ociarchive
from rigsmith.operating.bundlefiles import (
    DEFAULT_IO,
    BundleReport,
    Contents,
    Io,
    Record,
    atomic,
    beside,
    check_space,
    contents,
    gib,
    hash_path,
    place_all,
    same_bytes,
    same_filesystem,
    write_bytes,
)
from rigsmith.operating.bundlemanifest import (
    ARTIFACT_PREFIX,
    DEFAULT_TARGETS,
    IMAGE_MEMBER,
    LOCK_MEMBER,
    MANIFEST,
    BundleError,
    ImageEntry,
    Manifest,
    Member,
    dump_manifest,
)
from rigsmith.progress import bars
from rigsmith.project import Project
from rigsmith.resolving import lock as lockmod
from rigsmith.resolving.modelfiles import Want, expand_dir
from rigsmith.writer import write_one

if TYPE_CHECKING:
    from rigsmith.resolving.sources import Sources


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


@dataclass(frozen=True)
class _Model:
    """A model file's way into the bundle: its member, source, destination, and its model dir's record."""

    member: str
    src: Path
    dst: Path
    w: Want
    source: Record


def _plan_models(c: Contents, out: Path, rec: Record, report: BundleReport) -> list[_Model]:
    """Every model file (main and secondary), its source checked against the lock; those still to place."""
    todo = []
    for s in c.models:
        root = expand_dir(s.spec.model.local_dir)
        source = Record(root)
        for w in s.wanted:
            src, dst = root / w.disk_path, out / s.member(w)
            if not src.is_file():
                raise BundleError(
                    f"{src}: missing — {s.field} ({s.entry.repo}) is not fetched (or was moved)",
                    hint=f"run `invoke fetch-model --deployment {c.spec.name}` first",
                )
            if not source.vouches(w.disk_path, src, w.kind, w.digest):
                got = hash_path(src, w.kind, w.size)
                report.hashed_bytes += w.size
                if got != w.digest or src.stat().st_size != w.size:
                    raise BundleError(
                        f"{src}: {w.kind} {got} on disk, the lock says {w.digest}; it is not bundled",
                        hint="run `invoke fetch-model --verify` to restore the locked file, then `invoke "
                        "bundle OUT` again",
                    )
                source.put(w.disk_path, src, w.kind, w.digest)
            linked = dst.exists() and dst.samefile(src)
            if not (linked or rec.vouches(s.member(w), dst, w.kind, w.digest)):
                todo.append(_Model(s.member(w), src, dst, w, source))
    return todo


def _made(c: Contents, out: Path, rec: Record, io: Io) -> dict[str, Callable[[Path], None]]:
    """The members made by a command or taken from a cache (image archive, source tree, assets) that are
    missing or no longer as the record has them: member → what writes it (to a temporary file)."""
    todo: dict[str, Callable[[Path], None]] = {}
    pin = c.pin
    if pin is not None and not _image_fresh(pin, out / IMAGE_MEMBER, rec):

        def image(tmp: Path) -> None:
            io.echo(f"bundle: exporting {pin.pinned_ref} as an OCI archive")
            ociarchive.export(pin, tmp, run=io.run, echo=io.echo)

        todo[IMAGE_MEMBER] = image
    s = c.sources
    if s is None:
        return todo
    from rigsmith.resolving.sources import Sources, cache_root  # the git cache: only for a source build

    cache, where = Sources(cache_root()), f"images/{s.image}/image.yaml tree"
    if rec.digest(s.tree_member, out / s.tree_member) is None:
        todo[s.tree_member] = lambda tmp: cache.bundle_tree(s.entry.repo, s.entry.commit, tmp, where)
    for a in s.entry.assets.values():
        if rec.digest(s.asset_member(a), out / s.asset_member(a)) != a.sha256.removeprefix("sha256:"):
            todo[s.asset_member(a)] = partial(_asset, cache, a, where)
    return todo


def _image_fresh(pin: ociarchive.ImagePin, dst: Path, rec: Record) -> bool:
    """True when the bundle's archive is as recorded (bytes unchanged) and holds the pinned image."""
    try:
        return rec.digest(IMAGE_MEMBER, dst) is not None and ociarchive.matches(
            pin, ociarchive.archive_facts(dst, IMAGE_MEMBER)
        )
    except ociarchive.ImageMismatch:
        return False


def _asset(cache: Sources, a: lockmod.LockedAsset, where: str, tmp: Path) -> None:
    data = cache.cached(a.sha256)  # verified against its hash as it is read
    if data is None:
        raise BundleError(
            f"{where}: the asset {a.url} ({a.sha256}) is not in the source cache {cache.cache}",
            hint="run `invoke build` on this machine first (it fills the cache), then bundle again",
        )
    tmp.write_bytes(data)


def _make(out: Path, member: str, make: Callable[[Path], None], rec: Record, progress: bool | None) -> None:
    """Write a member beside its name, hash it, move it in, record it."""
    dst = out / member
    tmp = beside(dst, "rigsmith-tmp")
    tmp.parent.mkdir(parents=True, exist_ok=True)
    tmp.unlink(missing_ok=True)
    make(tmp)
    size = tmp.stat().st_size
    with bars(progress) as prog:
        task = prog.add_task(f"hash {member}", total=size)
        sha = hash_path(tmp, "sha256", size, lambda n: prog.advance(task, n))
    tmp.replace(dst)
    rec.put(member, dst, "sha256", sha)


# Over 80 lines on purpose: one ordered pass: plan (what is stale), space, the manifest removed before any
# member changes, the members, the manifest written last. Split, each phase would take the same values.
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
        LockError: the model, a secondary model or the image is not locked.
        BundleError: a model file on disk is not what the lock says.
        ImageMismatch: the image cannot be exported with the lock's digest.
        PreflightError: too little disk space (checked before anything is copied).
    """
    spec = project.load(deployment)
    c = contents(spec, lockmod.read(project.lock_path))
    out = out.absolute()
    report = BundleReport(out=str(out))
    small = _small_members(project, c, targets)
    rec = Record(out)
    todo = _plan_models(c, out, rec, report)
    made = _made(c, out, rec, io)
    stale = sorted(set(rec.state.files) - set(small) - c.carried())
    stale_small = [m for m, data in small.items() if not same_bytes(out / m, data)]

    copy_bytes = sum(m.w.size for m in todo if not same_filesystem(m.src, out))
    image_need = ociarchive.image_size(c.pin, io.run) if c.pin is not None and IMAGE_MEMBER in made else 0
    check_space(
        {out: copy_bytes + image_need},
        io.disk_free,
        "the bundle (model files that cannot be hard-linked across filesystems, and the image archive)",
        "free space there, or bundle into a directory on the model's filesystem (hard links, no copy)",
    )
    if todo or made or stale or stale_small:
        # The manifest is written last: while members change, no manifest vouches for a half-made bundle.
        (out / MANIFEST).unlink(missing_ok=True)
    if copy_bytes:
        io.echo(
            f"bundle: {out} is on another filesystem than the model: copying {gib(copy_bytes)} of model "
            "files (a directory on the model's filesystem would take hard links instead)"
        )
    for member in stale:
        (out / member).unlink(missing_ok=True)
        del rec.state.files[member]
        rec.save()
    members = {}
    for member, data in small.items():
        if member in stale_small:
            write_bytes(out / member, data)
            report.written.append(member)
        rec.put(member, out / member, "sha256", hashlib.sha256(data).hexdigest())
        members[member] = Member(size=len(data), sha256=hashlib.sha256(data).hexdigest())

    jobs = {m.dst: m for m in todo}

    def placed(dst: Path, w: Want, linked: bool) -> None:
        m = jobs[dst]
        if linked:  # a new link changes the source's ctime: it is still the file just vouched for
            m.source.put(w.disk_path, m.src, w.kind, w.digest)
        rec.put(m.member, dst, w.kind, w.digest)

    place_all([(m.src, m.dst, m.w) for m in todo], report.moved, title=f"bundle {spec.name}",
              progress=io.progress, placed=placed)  # fmt: skip
    for member, make in made.items():
        _make(out, member, make, rec, io.progress)
        report.written.append(member)
    locked = c.locked()
    for member in c.carried():
        kind, digest, size = locked.get(member, ("sha256", rec.state.files[member].digest, -1))
        sha = digest if kind == "sha256" else hash_path(out / member, "sha256", size)
        members[member] = Member(size=(out / member).stat().st_size, sha256=sha)
    image = None
    if c.pin is not None:
        facts, p = ociarchive.archive_facts(out / IMAGE_MEMBER, IMAGE_MEMBER), c.pin
        image = ImageEntry(member=IMAGE_MEMBER, name=p.name, tag=p.tag, digest=p.digest, image_id=p.image_id,
                           pinned_ref=p.pinned_ref, config_digest=facts.config_digest)  # fmt: skip
    manifest = Manifest(deployment=spec.name, lock_sha256=members[LOCK_MEMBER].sha256, image=image,
                        targets=list(targets), members=dict(sorted(members.items())))  # fmt: skip
    text = dump_manifest(manifest)
    if not same_bytes(out / MANIFEST, text.encode()):
        write_one(out / MANIFEST, text)
        report.written.append(MANIFEST)
    report.members, report.lock_sha256 = len(members), manifest.lock_sha256
    report.total_bytes = sum(m.size for m in members.values())
    if tar is not None:
        written = write_tar(out, manifest, tar, progress=io.progress)
        report.tar = str(tar) + ("" if written else " (up to date, not rewritten)")
    return report


def write_tar(out: Path, manifest: Manifest, dest: Path, *, progress: bool | None = None) -> bool:
    """The bundle as one tar: manifest first (an unpacker can refuse early), then the members in order.

    ``dest`` of ``-`` streams to stdout; a file is written beside its final name and renamed at the end,
    unless it already holds this manifest and every member at its size (then it is left alone: a re-run on an
    unchanged deployment touches nothing; unbundle hashes every member against the manifest anyway).
    Returns whether the tar was written.
    """
    names = [MANIFEST, *manifest.members]
    sizes = [(n, (out / n).stat().st_size) for n in names]
    total = sum(size for _n, size in sizes)
    if str(dest) == "-":
        _tar_to(sys.stdout.buffer, out, names, total, progress)
        return True
    dest = dest.absolute()
    if _tar_holds(dest, (out / MANIFEST).read_bytes(), sizes):
        return False
    with atomic(dest) as fh:
        _tar_to(fh, out, names, total, progress)
    return True


def _tar_holds(tar: Path, manifest: bytes, sizes: Sequence[tuple[str, int]]) -> bool:
    """True when ``tar`` is this bundle's tar: the same manifest bytes first, then the same members at the
    same sizes in the same order, and the file long enough to hold the last one (headers only are read)."""
    try:
        with tarfile.open(tar, "r:") as tf:
            first = tf.next()
            if first is None or first.name != MANIFEST:
                return False
            fh = tf.extractfile(first)
            if fh is None or fh.read() != manifest:
                return False
            members = list(tf)  # from the first member again (TarFile keeps what it has read)
            whole = tar.stat().st_size >= members[-1].offset_data + members[-1].size  # not cut short
            return whole and [(m.name, m.size) for m in members] == list(sizes)
    except (OSError, tarfile.TarError):
        return False


def _tar_to(fh: IO[bytes], out: Path, names: Sequence[str], total: int, progress: bool | None) -> None:
    with (
        bars(progress) as prog,
        tarfile.open(fileobj=fh, mode="w|", format=tarfile.PAX_FORMAT) as tf,
    ):
        task = prog.add_task("tar", total=total)
        for name in names:
            path = out / name
            info = tarfile.TarInfo(name)
            info.size = path.stat().st_size
            info.mode = 0o644
            with path.open("rb") as src:
                tf.addfile(info, src)
            prog.advance(task, info.size)
