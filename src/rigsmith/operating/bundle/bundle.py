"""``invoke bundle``: one verified bundle carries a deployment to an offline machine (``invoke unbundle``).

The layout is in docs/guide.md ("Air-gapped rigs"). A model file enters as a hard link where one filesystem
allows, else as a copy hashed on the way; it is trusted unhashed only while its model dir's verified-file
record vouches for it. The other members (copies, the image archive, source tree, assets) have the same
record in the bundle dir (``.rigsmith/state.json``, never a member), so a re-run on an unchanged deployment
hashes and writes nothing (re-hashing the image archive costs ~15 s per 10 GiB here). The manifest is
written last: none vouches for a half-made bundle.
"""

from __future__ import annotations

import hashlib
import json
import sys
import tarfile
from collections.abc import Callable, Mapping, Sequence
from contextlib import nullcontext
from dataclasses import asdict, dataclass, field
from functools import partial
from pathlib import Path

from rigsmith.operating.bundle import manifest as bf
from rigsmith.operating.bundle import ociarchive
from rigsmith.progress import bars
from rigsmith.project import Project
from rigsmith.rendering import deploy as deploymod
from rigsmith.resolving.image.sources import Sources, cache_root
from rigsmith.resolving.lock import lock as lockmod
from rigsmith.resolving.model.modelfiles import Want, gib, hash_file, hash_stream
from rigsmith.writer import write_one


@dataclass
class BundleReport:
    """What one ``bundle`` run did."""

    out: str = ""
    members: int = 0
    total_bytes: int = 0
    moved: bf.Moved = field(default_factory=bf.Moved)
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


def _small_members(project: Project, c: bf.Contents, targets: Sequence[str]) -> dict[str, bytes]:
    """Spec, lock, image definition and rendered artifacts: member name → bytes (all read or rendered now)."""
    name, build = c.spec.name, c.spec.engine.build
    out = {
        f"deployments/{name}.yaml": project.spec_path(name).read_bytes(),
        bf.LOCK_MEMBER: project.lock_path.read_bytes(),
    }
    for p in sorted((project.images / build).rglob("*")) if build else ():
        if p.is_file():
            out[f"images/{p.relative_to(project.images).as_posix()}"] = p.read_bytes()
    root = project.root.resolve()
    for target in targets:
        _plan, files = deploymod.artifacts(project, target, deployment=name, out=project.root)
        out |= {bf.ARTIFACT_PREFIX + a.path.relative_to(root).as_posix(): a.content.encode() for a in files}
    return out


def _plan_models(
    c: bf.Contents, out: Path, rec: bf.Record, report: BundleReport
) -> dict[Path, tuple[Path, Want, bf.Record]]:
    """Every model file (main and secondary), its source checked against the lock; those still to place:
    destination → (source, file, the source's model dir record)."""
    todo = {}
    for s in c.models:
        source = bf.Record(s.root)
        for w in s.wanted:
            src, dst = s.root / w.disk_path, out / s.member(w)
            if not src.is_file():
                raise bf.BundleError(
                    f"{src}: missing — {s.field} ({s.entry.repo}) is not fetched (or was moved)",
                    hint=f"run `invoke fetch-model --deployment {c.spec.name}` first",
                )
            if not source.vouches(w.disk_path, src, w.kind, w.digest):
                got = hash_file(src, w.kind, w.size)
                report.hashed_bytes += w.size
                if got != w.digest:
                    raise bf.BundleError(
                        f"{src}: {w.kind} {got} on disk, the lock says {w.digest}; it is not bundled",
                        hint="run `invoke fetch-model --verify` to restore the locked file, then `invoke "
                        "bundle OUT` again",
                    )
                source.put(w.disk_path, src, w.kind, w.digest)
            if not ((dst.exists() and dst.samefile(src)) or rec.vouches(s.member(w), dst, w.kind, w.digest)):
                todo[dst] = (src, w, source)
    return todo


def _made(c: bf.Contents, out: Path, rec: bf.Record, io: bf.Io) -> dict[str, Callable[[Path], object]]:
    """The members made by a command or taken from a cache (image archive, source tree, assets) that are
    missing or no longer as the record has them: member → what writes it (to a temporary file)."""
    todo: dict[str, Callable[[Path], object]] = {}
    pin, s, archive = c.pin, c.sources, out / bf.IMAGE_MEMBER
    if pin is not None and not (  # the record vouches for the bytes; the lock may pin another image now
        rec.digest(bf.IMAGE_MEMBER, archive) and ociarchive.matches(pin, ociarchive.archive_facts(archive))
    ):
        todo[bf.IMAGE_MEMBER] = partial(ociarchive.export, pin, run=io.run, echo=io.echo)
    if s is None:
        return todo
    cache, where = Sources(cache_root()), f"images/{s.image}/image.yaml tree"
    if rec.digest(s.tree_member, out / s.tree_member) is None:
        todo[s.tree_member] = partial(cache.bundle_tree, s.entry.repo, s.entry.commit, where=where)
    for member, (a, hexd) in s.assets.items():
        if rec.digest(member, out / member) != hexd:
            todo[member] = partial(_asset, cache, a, where)
    return todo


def _asset(cache: Sources, a: lockmod.LockedAsset, where: str, tmp: Path) -> None:
    data = cache.cached(a.sha256)  # verified against its hash as it is read
    if data is None:
        raise bf.BundleError(
            f"{where}: the asset {a.url} ({a.sha256}) is not in the source cache {cache.cache}",
            hint="run `invoke build` on this machine first (it fills the cache), then bundle again",
        )
    tmp.write_bytes(data)


def _make(
    out: Path, member: str, make: Callable[[Path], object], rec: bf.Record, progress: bool | None
) -> None:
    """Write a member beside its name, hash it, move it in, record it."""
    dst = out / member
    tmp = bf.beside(dst, "rigsmith-tmp")
    tmp.parent.mkdir(parents=True, exist_ok=True)
    tmp.unlink(missing_ok=True)
    make(tmp)
    size = tmp.stat().st_size
    with bars(progress) as prog, tmp.open("rb") as fh:
        sha = hash_stream("sha256", size, prog.wrap_file(fh, size, description=f"hash {member}")).hexdigest()
    tmp.replace(dst)
    rec.put(member, dst, "sha256", sha)


# Over 80 lines on purpose: one ordered pass: plan (what is stale), space, the manifest removed before any
# member changes, the members, the manifest written last. Split, each phase would take the same values.
def bundle(
    project: Project,
    deployment: str | None,
    out: Path,
    *,
    targets: Sequence[str] = bf.DEFAULT_TARGETS,
    tar: Path | None = None,
    io: bf.Io = bf.DEFAULT_IO,
) -> BundleReport:
    """Write (or bring up to date) the bundle of one deployment in ``out``; optionally tar it. Raises
    LockError (something is not locked), BundleError (a model file is not the lock's), ImageMismatch (no
    export keeps the lock's digest) or PreflightError (too little space; checked before the first byte)."""
    spec = project.load(deployment)
    c = bf.contents(spec, lockmod.read(project.lock_path))
    out = out.absolute()
    report = BundleReport(out=str(out))
    small = _small_members(project, c, targets)
    rec = bf.Record(out)
    todo = _plan_models(c, out, rec, report)
    made = _made(c, out, rec, io)
    stale = sorted(set(rec.state.files) - set(small) - c.carried())
    stale_small = [m for m, data in small.items() if not bf.same_bytes(out / m, data)]

    copy_bytes = _check_space(c, out, todo, made, io)
    if todo or made or stale or stale_small:
        (out / bf.MANIFEST).unlink(missing_ok=True)
    if copy_bytes:
        io.echo(
            f"bundle: {out} is on another filesystem than the model: copying {gib(copy_bytes)} of model "
            "files (a directory on the model's filesystem would take hard links instead)"
        )
    for member in stale:
        (out / member).unlink(missing_ok=True)
        del rec.state.files[member]
        rec.save()
    members = _write_small(out, small, stale_small, rec, report)

    def placed(dst: Path, w: Want, linked: bool) -> None:
        if linked:  # the link changed the source's ctime: record it again (the same inode)
            todo[dst][2].put(w.disk_path, dst, w.kind, w.digest)
        rec.put(dst.relative_to(out).as_posix(), dst, w.kind, w.digest)

    jobs = [(src, dst, w) for dst, (src, w, _r) in todo.items()]
    bf.place_all(jobs, report.moved, f"bundle {spec.name}", io.progress, placed)
    for member, make in made.items():
        _make(out, member, make, rec, io.progress)
        report.written.append(member)
    members |= _carried_members(c, out, rec)
    manifest = _write_manifest(out, spec.name, c, targets, members, report)
    report.members, report.lock_sha256 = len(members), manifest.lock_sha256
    report.total_bytes = sum(m.size for m in members.values())
    if tar is not None:
        written = write_tar(out, manifest, tar, progress=io.progress)
        report.tar = str(tar) + ("" if written else " (up to date, not rewritten)")
    return report


def _check_space(
    c: bf.Contents,
    out: Path,
    todo: Mapping[Path, tuple[Path, Want, bf.Record]],
    made: Mapping[str, object],
    io: bf.Io,
) -> int:
    """Refuse before the first byte when the copied model files and the image archive would not fit; the
    bytes of model files that must be copied (not hard-linked)."""
    copy_bytes = sum(w.size for src, w, _r in todo.values() if not bf.same_filesystem(src, out))
    image_need = ociarchive.image_size(c.pin, io.run) if c.pin is not None and bf.IMAGE_MEMBER in made else 0
    bf.check_space(
        {out: copy_bytes + image_need},
        io.disk_free,
        "the bundle (model files that cannot be hard-linked across filesystems, and the image archive)",
        "free space there, or bundle into a directory on the model's filesystem (hard links, no copy)",
    )
    return copy_bytes


def _write_small(
    out: Path, small: dict[str, bytes], stale: Sequence[str], rec: bf.Record, report: BundleReport
) -> dict[str, bf.Member]:
    """Write the small members that changed (spec, lock, image definition, artifacts); every one's entry."""
    members = {}
    for member, data in small.items():
        if member in stale:
            bf.write_bytes(out / member, data)
            report.written.append(member)
        members[member] = bf.Member(size=len(data), sha256=hashlib.sha256(data).hexdigest())
        rec.put(member, out / member, "sha256", members[member].sha256)
    return members


def _carried_members(c: bf.Contents, out: Path, rec: bf.Record) -> dict[str, bf.Member]:
    """The manifest entries of the carried members (models, source tree, assets, image): a locked sha256
    as the lock has it, any other digest hashed again as sha256."""
    locked, members = c.locked(), {}
    for member in c.carried():
        kind, digest, size = locked.get(member, ("sha256", rec.state.files[member].digest, -1))
        sha = digest if kind == "sha256" else hash_file(out / member, "sha256", size)
        members[member] = bf.Member(size=(out / member).stat().st_size, sha256=sha)
    return members


def _write_manifest(
    out: Path, name: str, c: bf.Contents, targets: Sequence[str], members: dict[str, bf.Member],
    report: BundleReport,
) -> bf.Manifest:  # fmt: skip
    """The manifest of every member (and the image's pinned facts), written last and only when it changed."""
    image = None
    if (p := c.pin) is not None:
        facts = ociarchive.archive_facts(out / bf.IMAGE_MEMBER, bf.IMAGE_MEMBER)
        pinned = {k: v for k, v in asdict(p).items() if k != "sources"}
        image = bf.ImageEntry(member=bf.IMAGE_MEMBER, config_digest=facts.config_digest, **pinned)
    manifest = bf.Manifest(deployment=name, lock_sha256=members[bf.LOCK_MEMBER].sha256, image=image,
                           targets=list(targets), members=dict(sorted(members.items())))  # fmt: skip
    text = json.dumps(manifest.model_dump(mode="json"), indent=1, sort_keys=True) + "\n"
    if not bf.same_bytes(out / bf.MANIFEST, text.encode()):
        write_one(out / bf.MANIFEST, text)
        report.written.append(bf.MANIFEST)
    return manifest


def write_tar(out: Path, manifest: bf.Manifest, dest: Path, *, progress: bool | None = None) -> bool:
    """The bundle as one tar, manifest first (an unpacker can refuse early), to stdout for ``-``; a file
    that already holds this manifest and every member at its size is left alone (unbundle hashes every
    member anyway). Returns whether the tar was written."""
    sizes = [(n, (out / n).stat().st_size) for n in (bf.MANIFEST, *manifest.members)]
    stream = str(dest) == "-"
    if not stream and _tar_holds(dest, (out / bf.MANIFEST).read_bytes(), sizes):
        return False
    with (
        nullcontext(sys.stdout.buffer) if stream else bf.atomic(dest) as fh,
        bars(progress) as prog,
        tarfile.open(fileobj=fh, mode="w|", format=tarfile.PAX_FORMAT) as tf,
    ):
        task = prog.add_task("tar", total=sum(size for _n, size in sizes))
        for name, size in sizes:
            info = tarfile.TarInfo(name)
            info.size, info.mode = size, 0o644
            with (out / name).open("rb") as src:
                tf.addfile(info, prog.wrap_file(src, task_id=task))
    return True


def _tar_holds(tar: Path, manifest: bytes, sizes: Sequence[tuple[str, int]]) -> bool:
    """True when ``tar`` is this bundle's tar: the same manifest bytes first, then the same members at the
    same sizes in the same order, and the file long enough to hold the last one (headers only are read)."""
    try:
        with tarfile.open(tar, "r:") as tf:
            first = tf.next()
            fh = tf.extractfile(first) if first is not None and first.name == bf.MANIFEST else None
            if fh is None or fh.read() != manifest:
                return False
            members = list(tf)  # from the first member again (TarFile keeps what it has read)
            whole = tar.stat().st_size >= members[-1].offset_data + members[-1].size  # not cut short
            return whole and [(m.name, m.size) for m in members] == list(sizes)
    except (OSError, tarfile.TarError):
        return False
