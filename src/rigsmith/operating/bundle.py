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

import hashlib
import sys
import tarfile
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import IO

from rigsmith.operating import ociarchive
from rigsmith.operating.bundlefiles import (
    DEFAULT_IO,
    BundleReport,
    Contents,
    Echo,
    Io,
    atomic,
    check_space,
    contents,
    drop_stale,
    gib,
    image_size,
    pin_key,
    place_all,
    same_bytes,
    same_filesystem,
    sha256_file,
    verify_source,
    write_bytes,
)
from rigsmith.operating.bundlemanifest import (
    ARTIFACT_PREFIX,
    BUNDLE_STATE,
    DEFAULT_TARGETS,
    IMAGE_MEMBER,
    LOCK_MEMBER,
    MANIFEST,
    MODEL_PREFIX,
    BundleError,
    ImageEntry,
    Manifest,
    Member,
    ModelFile,
    dump_manifest,
)
from rigsmith.progress import bars
from rigsmith.project import Project
from rigsmith.resolving import lock as lockmod
from rigsmith.resolving.modelfiles import (
    STATE_DIR,
    STATE_FILE,
    DirState,
    HashKind,
    Want,
    dump_state,
    expand_dir,
    read_state,
)
from rigsmith.resolving.verified import seen, verified, vouches
from rigsmith.writer import write_one

# -- bundle -----------------------------------------------------------------------------------------------


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


# Over 80 lines on purpose: one ordered pass over shared state (the bundle's state cache through vouched/
# remember, the report): space is checked before any write, the manifest is removed before a member
# changes and written last. Split into phases, each helper would take the same eight values.
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
        if fs is None or not vouches(fs, seen(st), kind, digest or fs.digest):
            return None
        return fs.digest

    def remember(member: str, path: Path, kind: HashKind, digest: str) -> None:
        new = verified(seen(path.stat()), kind, digest)
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
        if not vouches(fetched.files.get(w.disk_path), seen(st), w.kind, w.digest):
            verify_source(src, w, report)
        dst = out / (MODEL_PREFIX + w.repo_path)
        member = MODEL_PREFIX + w.repo_path
        if not (dst.exists() and (src.samefile(dst) or vouched(member, dst, w.kind, w.digest))):
            todo.append(w)
    copy_bytes = sum(w.size for w in todo if not same_filesystem(root / w.disk_path, out))
    image_dst = out / IMAGE_MEMBER
    image_fresh = c.pin is None or (
        vouched(IMAGE_MEMBER, image_dst, "sha256") is not None and bstate.commit == pin_key(c.pin)
    )
    image_need = 0 if image_fresh or c.pin is None else image_size(c.pin, run)
    check_space(
        {out: copy_bytes + image_need},
        disk_free,
        "the bundle (model files that cannot be hard-linked across filesystems, and the image archive)",
        "free space there, or bundle into a directory on the model's filesystem (hard links, no copy)",
    )
    (out / BUNDLE_STATE).mkdir(parents=True, exist_ok=True)
    stale_small = [m for m, data in small.items() if not same_bytes(out / m, data)]
    if todo or not image_fresh or stale_small:
        # The manifest is written last: while members change, no manifest vouches for a half-made bundle.
        (out / MANIFEST).unlink(missing_ok=True)
    if copy_bytes:
        echo(
            f"bundle: {out} is on another filesystem than {root}: copying {gib(copy_bytes)} of model files "
            "(a directory on the model's filesystem would take hard links instead)"
        )

    for member, data in small.items():
        path = out / member
        if member in stale_small:
            path.parent.mkdir(parents=True, exist_ok=True)
            write_bytes(path, data)
            report.written.append(member)
        else:
            report.unchanged += 1
        remember(member, path, "sha256", hashlib.sha256(data).hexdigest())
    if drop_stale(out, set(small) | {MODEL_PREFIX + w.repo_path for w in c.wanted} | {IMAGE_MEMBER}, bstate):
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
        if bstate.commit != pin_key(c.pin):
            bstate.commit = pin_key(c.pin)
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
        written = write_tar(out, manifest, tar, progress=progress)
        report.tar = str(tar) + ("" if written else " (up to date, not rewritten)")
    return report


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
    sha = vouched(IMAGE_MEMBER, dst, "sha256") if bstate.commit == pin_key(pin) else None
    exported = sha is None
    if sha is None:
        stage = out / BUNDLE_STATE / "partial" / "engine.oci.tar"
        stage.parent.mkdir(parents=True, exist_ok=True)
        echo(f"bundle: exporting {pin.pinned_ref} as an OCI archive")
        ociarchive.export(pin, stage, run=run, echo=echo)
        size = stage.stat().st_size
        with bars(progress) as prog:
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
