"""``invoke unbundle``: verify a bundle against its manifest and lock, then place spec, lock, image, source
tree and models. A tar is unpacked member by member through the one confinement rule
(:mod:`rigsmith.confine`), and every member is sorted into a kind unbundle may place before anything is
written (never a member's name joined to the checkout). See :mod:`.bundle` for the format and the design.
"""

from __future__ import annotations

import hashlib
import shutil
import tarfile
import tempfile
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING

from pydantic import ValidationError

from rigsmith import confine, userhome, writer
from rigsmith import spec as specmod
from rigsmith.errors import AdapterError, ConsentError, RigsmithError
from rigsmith.operating.bundle import manifest as bf
from rigsmith.operating.bundle import ociarchive
from rigsmith.progress import bars
from rigsmith.project import Project
from rigsmith.rendering import deploy as deploymod
from rigsmith.resolving.image.sources import Sources, cache_root
from rigsmith.resolving.lock import lock as lockmod
from rigsmith.resolving.model import modelfetch
from rigsmith.resolving.model.modelfiles import HASH_CHUNK, STATE_DIR, Want, expand_dir, gib, hash_stream
from rigsmith.resolving.model.secondaryfetch import fetch_models
from rigsmith.spec import Deployment

if TYPE_CHECKING:
    from rigsmith.resolving.model.hub import Hub


@dataclass
class UnbundleReport:
    """What one ``unbundle`` run did."""

    deployment: str = ""
    local_dir: str = ""
    verified: int = 0
    hashed_bytes: int = 0
    moved: bf.Moved = field(default_factory=bf.Moved)
    already_placed: int = 0
    image: str = ""
    image_loaded: bool = False
    fetch_summary: str = ""
    lock_sha256: str = ""

    def summary(self) -> str:
        parts = [
            f"unbundled {self.deployment}: {self.verified} members verified "
            f"({gib(self.hashed_bytes)} hashed)",
            f"model in {self.local_dir}: {self.moved.describe()}, {self.already_placed} already in place",
        ]
        if self.image:
            parts.append(f"image {self.image} " + ("loaded" if self.image_loaded else "already present"))
        text = "; ".join(parts) + f"\nlock sha256 {self.lock_sha256} (the bundling machine printed it too)"
        return text + (f"\nfetch-model: {self.fetch_summary}" if self.fetch_summary else "")


def no_hub() -> Hub:
    """The Hub as unbundle sees it: there is none (fetch-model must find every file verified on disk)."""
    raise AdapterError(
        "unbundle is offline: a model file was not placed verified, so fetch-model would need the Hub",
        hint="run `invoke unbundle PATH` again (it resumes); if it persists the bundle lacks a file",
    )


def unpacked(project: Project, path: Path, io: bf.Io) -> Path:
    """A bundle directory as is; a tar is unpacked (resumably) into ``.rigsmith/unbundle/`` of the checkout
    (git-ignored) first, every name checked before anything is written: regular files only, no name that
    leaves the bundle, no name twice."""
    if path.is_dir():
        return path
    if not path.is_file():
        raise bf.BundleError(
            f"{path}: no such bundle (a directory made by `invoke bundle`, or its --tar file)"
        )
    dest, what = project.root / STATE_DIR / "unbundle" / path.name.removesuffix(".tar"), f"{path}: tar member"
    try:
        with tarfile.open(path, "r:") as tf:
            infos = tf.getmembers()
    except tarfile.TarError as err:
        raise bf.BundleError(f"{path}: not a bundle tar ({err})") from None
    files: dict[str, tarfile.TarInfo] = {}
    for info in infos:
        name = confine.check(info.name, what, bf.BundleError)
        if info.isdir():
            continue
        if not info.isreg():
            raise bf.BundleError(
                f"{path}: refusing member {info.name!r}: not a regular file (a link, device or FIFO); "
                "nothing was unpacked",
                hint="a bundle tar holds only files; make it again with `invoke bundle OUT --tar`",
            )
        if name in files:
            raise bf.BundleError(f"{path}: member {info.name!r} appears twice; nothing was unpacked")
        files[name] = info
    todo = {
        n: i for n, i in files.items() if not ((dest / n).is_file() and (dest / n).stat().st_size == i.size)
    }
    need = sum(i.size for i in todo.values())
    bf.check_space(
        {dest: need}, io.disk_free, f"unpacking {path.name}", "unpack it elsewhere and pass the directory"
    )
    io.echo(f"unbundle: unpacking {path} into {dest}")
    dest.mkdir(parents=True, exist_ok=True)
    with tarfile.open(path, "r:") as tf, bars(io.progress) as prog:
        task = prog.add_task(f"unpack {path.name}", total=need)
        for name, info in todo.items():
            target = confine.make_dirs(dest, name, what, bf.BundleError)
            src = tf.extractfile(info)
            assert src is not None  # a regular file
            try:
                with src, bf.atomic(target) as out:
                    shutil.copyfileobj(src, out, HASH_CHUNK)
            except OSError as err:
                raise bf.BundleError(
                    f"{path}: cannot unpack member {name!r} into {dest}: {err.strerror or err}",
                    hint="unpack the tar by hand on a filesystem that can hold its names; pass the directory",
                ) from None
            prog.advance(task, info.size)
    return dest


def _open(bundle_dir: Path) -> tuple[bf.Manifest, Deployment, str, bytes, lockmod.Lock]:
    """The manifest, spec (and its text) and lock (and its bytes); refuse a bundle that is incomplete or
    whose manifest is not its lock's (cheap: sizes and names, before hashing anything)."""
    manifest = bf.read_manifest(bundle_dir)
    name = manifest.deployment  # checked as the spec's name below, its member's name by member_path
    files = {member: bf.member_path(bundle_dir, member) for member in manifest.members}
    missing = [m for m, p in files.items() if not p.is_file()]
    if missing:
        raise bf.BundleError(
            f"{bundle_dir} is incomplete: {len(missing)} member(s) missing: " + ", ".join(missing[:10]),
            hint="copy the whole bundle directory again (or re-run `invoke bundle OUT`; it resumes)",
        )
    short = [f"{m}: {files[m].stat().st_size} bytes, the manifest says {e.size}"
             for m, e in manifest.members.items() if files[m].stat().st_size != e.size]  # fmt: skip
    if short:
        raise bf.BundleError(f"{bundle_dir}: member(s) of the wrong size: " + "; ".join(short),
                          hint="the copy is damaged or incomplete; copy the bundle again")  # fmt: skip
    spec_member = f"deployments/{name}.yaml"
    if spec_member not in manifest.members or bf.LOCK_MEMBER not in manifest.members:
        raise bf.BundleError(f"{bundle_dir / bf.MANIFEST}: lists no {spec_member!r} or {bf.LOCK_MEMBER}")
    lock_bytes = (bundle_dir / bf.LOCK_MEMBER).read_bytes()
    lock_sha = hashlib.sha256(lock_bytes).hexdigest()
    if lock_sha != manifest.lock_sha256 or manifest.members[bf.LOCK_MEMBER].sha256 != manifest.lock_sha256:
        raise bf.BundleError(
            f"{bf.LOCK_MEMBER}: sha256 {lock_sha}, the manifest says {manifest.lock_sha256}; bundle refused",
            hint="the lock in the bundle was changed after bundling; bundle again on the connected machine",
        )
    try:
        lock = lockmod.Lock.model_validate_json(lock_bytes)
        text = (bundle_dir / spec_member).read_bytes().decode("utf-8")
    except ValidationError as err:
        raise bf.BundleError(
            f"{bf.LOCK_MEMBER} in {bundle_dir}: not a rigsmith lock ({lockmod.first_problem(err)}); "
            "nothing was placed",
            hint="bundle again on the connected machine, from a lock `invoke pin` wrote",
        ) from None
    except UnicodeDecodeError:
        raise bf.BundleError(f"{spec_member} in {bundle_dir}: not UTF-8 text; bundle refused") from None
    spec = specmod.loads(text, source=spec_member)
    if spec.name != name:
        raise bf.BundleError(
            f"{spec_member} in {bundle_dir}: names deployment {spec.name!r}, the manifest {name!r}"
        )
    problems = check_against_lock(manifest, bf.contents(spec, lock))
    if problems:
        raise bf.BundleError(f"{bundle_dir / bf.MANIFEST} does not match its lock: " + "; ".join(problems),
                          hint="bundle again on the connected machine")  # fmt: skip
    return manifest, spec, text, lock_bytes, lock


def check_against_lock(manifest: bf.Manifest, c: bf.Contents) -> list[str]:
    """Where the manifest disagrees with the lock it carries (model files, assets, source tree, image)."""
    problems = []
    for member, (kind, digest, size) in c.locked().items():
        e = manifest.members.get(member)
        if e is None:
            problems.append(f"{member}: locked ({kind} {digest}) but not in the manifest")
        elif e.size != size or (kind == "sha256" and e.sha256 != digest):
            problems.append(f"{member}: the manifest says sha256 {e.sha256} ({e.size} bytes), the lock "
                            f"{kind} {digest} ({size} bytes)")  # fmt: skip
    if c.sources is not None and c.sources.tree_member not in manifest.members:
        problems.append(f"{c.sources.tree_member}: the lock pins the source tree, the manifest lacks it")
    pin, img = c.pin, manifest.image
    locked_image = (pin.digest, pin.image_id, pin.pinned_ref) if pin else None
    if (pin is None) != (img is None) or (pin is not None and bf.IMAGE_MEMBER not in manifest.members):
        problems.append(f"{bf.IMAGE_MEMBER}: the lock pins {pin.pinned_ref if pin else 'no image'}, the "
                        f"manifest {img.pinned_ref if img else 'no image'}")  # fmt: skip
    elif pin and img and (img.digest, img.image_id, img.pinned_ref) != locked_image:
        problems.append(
            f"{img.member}: the manifest pins {img.pinned_ref} ({img.digest or img.image_id}), the "
            f"lock {pin.pinned_ref} ({pin.digest or pin.image_id})"
        )
    return problems


def placements(
    project: Project, bundle_dir: Path, manifest: bf.Manifest, spec: Deployment, lock_bytes: bytes,
    c: bf.Contents,
) -> tuple[list[tuple[Path, bytes]], list[writer.Artifact]]:  # fmt: skip
    """Sort every member into a kind unbundle may place, or refuse the bundle before anything is written:
    the members of :meth:`Contents.carried`, spec and lock, images/BUILD/ (returned: path → bytes), and the
    artifacts that rendering the manifest's targets here from ``spec`` and the lock produces (returned: that
    render, for this checkout's paths, never an artifact member's bytes)."""
    where = f"{bundle_dir / bf.MANIFEST}"
    fixed = {f"deployments/{spec.name}.yaml", bf.LOCK_MEMBER} | c.carried()
    build = f"images/{spec.engine.build}/" if spec.engine.build else None
    images = sorted(m for m in manifest.members if build and m.startswith(build))
    arts = {m.removeprefix(bf.ARTIFACT_PREFIX) for m in manifest.members if m.startswith(bf.ARTIFACT_PREFIX)}
    stray = [m for m in manifest.members if m not in fixed and m not in images
             and not (m.startswith(bf.ARTIFACT_PREFIX) and manifest.targets)]  # fmt: skip
    root = project.root.resolve()
    rendered: dict[str, writer.Artifact] = {}
    with tempfile.TemporaryDirectory(prefix="rigsmith-unbundle-") as tmp:
        scratch = Project(Path(tmp))
        scratch.deployments.mkdir()
        scratch.spec_path(spec.name).write_text(specmod.dump(spec), encoding="utf-8")
        scratch.lock_path.write_bytes(lock_bytes)
        for member in images:
            dest = confine.make_dirs(scratch.root, member, f"{where}: image definition", bf.BundleError)
            dest.write_bytes((bundle_dir / member).read_bytes())
        for target in manifest.targets:
            try:
                _plan, files = deploymod.artifacts(scratch, target, deployment=spec.name, out=root)
            except RigsmithError as err:
                raise bf.BundleError(
                    f"{bundle_dir}: its {target!r} artifacts cannot be rendered here from its spec and lock "
                    f"({err.message})",
                    hint="bundle again on the connected machine with this rigsmith version",
                ) from None
            rendered.update({a.path.relative_to(root).as_posix(): a for a in files})
    stray += [bf.ARTIFACT_PREFIX + rel for rel in sorted(arts - set(rendered))]
    if stray:
        raise bf.BundleError(
            f"{where}: {len(stray)} member(s) are none of what a bundle of {spec.name!r} holds: "
            + ", ".join(repr(m) for m in stray[:5]) + "; nothing was placed",
            hint="a bundle holds the spec, the lock, the image archive, the lock's model files and source "
            f"tree, images/{spec.engine.build or 'BUILD'}/ and the artifacts of its targets; bundle again on "
            "the connected machine",
        )  # fmt: skip
    placed = [(confine.under(root, m, f"{where}: image definition", bf.BundleError),
               (bundle_dir / m).read_bytes()) for m in images]  # fmt: skip
    return placed, [rendered[rel] for rel in sorted(rendered)]


# Over 80 lines on purpose: verify-then-place in one ordered pass (disk space, every member to place hashed,
# and only then the writes); unpacked, _open, placements, _verify and _place_project hold the steps, this
# function the order and the consent prompts.
def unbundle(
    project: Project,
    path: Path,
    *,
    into: Path | None = None,
    yes: bool = False,
    confirm: Callable[[str], bool] | None = None,
    io: bf.Io = bf.DEFAULT_IO,
) -> UnbundleReport:
    """Verify a bundle completely, then place spec, lock, image, source tree and models (no network).
    Raises BundleError (a member missing, tampered with or not the lock's), PreflightError (too little
    space), ImageMismatch (another image loaded) or ConsentError (a different spec or artifact here)."""
    bundle_dir = unpacked(project, path.absolute(), io)
    manifest, here, spec_text, lock_bytes, lock = _open(bundle_dir)
    name = here.name
    if into is not None and into.absolute() != expand_dir(here.model.local_dir):
        here, spec_text = _moved_to(here, into.absolute(), io)
    c = bf.contents(here, lock)  # the same members; the model dirs of this machine
    images, artifacts = placements(project, bundle_dir, manifest, here, lock_bytes, c)
    dests = _models_to_place(c)
    report = UnbundleReport(name, str(c.models[0].root), lock_sha256=manifest.lock_sha256)
    cache, src = Sources(cache_root()), c.sources
    need_tree = src is not None and not cache.has_commit(src.entry.repo, src.entry.commit)
    assets = {m: (a, h) for m, (a, h) in src.assets.items() if cache.cached(a.sha256) is None} if src else {}
    image_present = c.pin is None or ociarchive.present(c.pin, io.run)
    _check_space(bundle_dir, manifest, dests, image_present, io)
    skip = {s.member(w) for s, _rec, todo in dests for w in s.wanted if w not in todo}
    skip |= (set(src.assets) - set(assets) | (set() if need_tree else {src.tree_member})) if src else set()
    skip |= {bf.IMAGE_MEMBER} if image_present else set()
    _verify(bundle_dir, manifest, c, report, io.progress, skip)

    # git checks every object's hash; the locked commit must be among them (objects alone are inert)
    if (
        src
        and need_tree
        and not cache.add_tree(src.entry.repo, src.entry.commit, bundle_dir / src.tree_member)
    ):
        raise bf.BundleError(
            f"{src.tree_member}: does not hold the locked commit {src.entry.commit} of {src.entry.repo}; "
            "nothing was placed",
            hint="the bundle was changed or damaged in transit; copy it again from the connected machine",
        )
    _guard_model_dirs(dests, name, into, yes, confirm)

    # Everything checks out: place the project files, the image, the source tree and assets, the models.
    _place_project(project, here, spec_text, images, artifacts, lock, c, yes, confirm, io)
    if c.pin is not None:
        report.image = c.pin.pinned_ref
        if not image_present:
            io.echo(f"unbundle: loading {c.pin.pinned_ref} into local storage")
            ociarchive.load(c.pin, bundle_dir / bf.IMAGE_MEMBER, run=io.run)
            report.image_loaded = True
    for m, (a, hexd) in assets.items():
        bf.place(bundle_dir / m, cache.asset_path(a.sha256), "sha256", hexd, a.size, lambda _n: None)
    _place_models(bundle_dir, dests, report, io)
    report.fetch_summary = _recheck(project, name, io)
    if bundle_dir != path.absolute():
        shutil.rmtree(bundle_dir)  # the models hold hard links to what was unpacked (or copies)
    return report


#: One model dir to fill: its slot, its verified-file record, and the files it still lacks.
_Dest = tuple[bf.ModelSet, bf.Record, list[Want]]


def _moved_to(here: Deployment, into: Path, io: bf.Io) -> tuple[Deployment, str]:
    """``--into DIR``: the bundle's spec with ``model.local_dir`` set to DIR, and its new text."""
    data = specmod.to_data(here)
    data["model"]["local_dir"] = str(into)
    moved = specmod.from_data(data)
    io.echo(f"unbundle: model.local_dir of deployments/{here.name}.yaml set to {into} (--into)")
    return moved, specmod.dump(moved)


def _models_to_place(c: bf.Contents) -> list[_Dest]:
    """Each model dir with the files its record does not already vouch for."""
    dests = []
    for s in c.models:
        for w in s.wanted:  # a link planted in the model dir must not carry a placed file elsewhere
            confine.under(s.root, w.disk_path, f"model dir {s.root}", bf.BundleError)
        rec = bf.Record(s.root)
        todo = [w for w in s.wanted if not rec.vouches(w.disk_path, s.root / w.disk_path, w.kind, w.digest)]
        dests.append((s, rec, todo))
    return dests


def _check_space(
    bundle_dir: Path, manifest: bf.Manifest, dests: Sequence[_Dest], image_present: bool, io: bf.Io
) -> None:
    """Refuse before anything is written when the model files copied across filesystems, or the image
    loaded into podman's storage, would not fit."""
    needs: dict[Path, int] = {}
    for s, _rec, todo in dests:  # model files copied across filesystems
        copied = sum(w.size for w in todo if not bf.same_filesystem(bundle_dir / s.member(w), s.root))
        needs[s.root] = needs.get(s.root, 0) + copied
    if not image_present and (store := ociarchive.storage_root(io.run)) is not None:
        needs[store] = needs.get(store, 0) + manifest.members[bf.IMAGE_MEMBER].size
    bf.check_space(
        needs,
        io.disk_free,
        "unbundling (model files copied across filesystems, and the image in podman's storage)",
        "free space there, or pass --into DIR on a bigger disk (on the bundle's filesystem the model is "
        "hard-linked, not copied)",
    )


def _guard_model_dirs(
    dests: Sequence[_Dest], name: str, into: Path | None, yes: bool, confirm: Callable[[str], bool] | None
) -> None:
    """The model dirs are the bundle's spec's (or --into): like fetch-model, never fill someone else's."""
    for s, _rec, _todo in dests:
        where = "--into" if into and s.prefix == bf.MODEL_PREFIX else f"deployments/{name}.yaml {s.field}"
        try:
            modelfetch.guard_dir(s.root, where, userhome.invoking_home(), s.entry, s.wanted, confirm, yes)
        except ConsentError as err:
            raise ConsentError(
                err.message + "; nothing was placed",
                hint="pass --into DIR (an empty directory of its own), or --yes to place the model there "
                "anyway (files not in the snapshot are never touched)",
            ) from None


def _place_models(bundle_dir: Path, dests: Sequence[_Dest], report: UnbundleReport, io: bf.Io) -> None:
    """Link or copy each verified member into its model dir; record each file as it lands."""
    for s, rec, todo in dests:
        report.already_placed += len(s.wanted) - len(todo)
        s.root.mkdir(parents=True, exist_ok=True)
        where = f"model dir {s.root}"
        jobs = [(bundle_dir / s.member(w), confine.make_dirs(s.root, w.disk_path, where, bf.BundleError), w)
                for w in todo]  # fmt: skip
        bf.place_all(
            jobs, report.moved, f"place {s.entry.repo}", io.progress, partial(_placed, s, rec, io.echo)
        )


def _recheck(project: Project, name: str, io: bf.Io) -> str:
    """Re-check through fetch-model itself: offline, every file vouched for by its record; its summary."""
    fetch = fetch_models(project, project.load(name), hub=no_hub, echo=io.echo, progress=False)
    for r in (fetch, *(sub for _repo, sub in fetch.secondary)):
        if r.downloaded or r.cached != r.files:
            raise bf.BundleError(
                f"{r.local_dir}: after unbundling, fetch-model verified {r.cached} of {r.files} files from "
                "its record",
                hint="run `invoke unbundle PATH` again",
            )
    return fetch.summary()


def _verify(
    bundle_dir: Path, manifest: bf.Manifest, c: bf.Contents, report: UnbundleReport, progress: bool | None,
    skip: set[str],
) -> None:  # fmt: skip
    """Hash every member that will be placed (a locked one against the lock, the rest against the
    manifest); refuse any mismatch, naming every one, before anything is written."""
    locked = c.locked()
    todo = [m for m in manifest.members if m not in skip]
    bad: list[str] = []
    with bars(progress) as prog:
        task = prog.add_task("verify bundle", total=sum(manifest.members[m].size for m in todo))
        for member in todo:
            e = manifest.members[member]
            kind, want, _size = locked.get(member, ("sha256", e.sha256, e.size))
            with (bundle_dir / member).open("rb") as fh:
                got = hash_stream(kind, e.size, prog.wrap_file(fh, task_id=task)).hexdigest()
            report.hashed_bytes += e.size
            if got != want:
                whose = "the lock" if member in locked else "the manifest"
                bad.append(f"{member}: {kind} {got}, {whose} says {want}")
            else:
                report.verified += 1
    if bad:
        raise bf.BundleError(
            f"refusing the bundle {bundle_dir}: {len(bad)} member(s) do not match: " + "; ".join(bad)
            + "; nothing was placed",
            hint="the bundle was changed or damaged in transit; copy it again from the connected machine",
        )  # fmt: skip
    if c.pin is not None and bf.IMAGE_MEMBER not in skip:
        facts = ociarchive.archive_facts(bundle_dir / bf.IMAGE_MEMBER, bf.IMAGE_MEMBER)
        if not ociarchive.matches(c.pin, facts):
            raise bf.BundleError(
                f"{bf.IMAGE_MEMBER}: holds manifest {facts.manifest_digest} (image ID "
                f"{facts.config_digest}), the lock pins {c.pin.digest or c.pin.image_id}",
                hint="bundle again on the connected machine",
            )


def _place_project(
    project: Project, here: Deployment, spec_text: str, images: list[tuple[Path, bytes]],
    artifacts: list[writer.Artifact], lock: lockmod.Lock, c: bf.Contents, yes: bool,
    confirm: Callable[[str], bool] | None, io: bf.Io,
) -> None:  # fmt: skip
    """Spec, image definition and artifacts through the writer (consent rules); the lock entries merged."""
    name = here.name
    files = [writer.Artifact(confine.under(project.root, f"deployments/{name}.yaml", "the spec"), spec_text)]
    # Image-definition files that are not text go around the (text-only) writer, under the same consent.
    binary: list[tuple[Path, bytes]] = []
    for path, blob in images:
        try:
            files.append(writer.Artifact(path, blob.decode("utf-8")))
        except UnicodeDecodeError:
            binary.append((path, blob))
    differs = [str(p) for p, b in binary if p.exists() and p.read_bytes() != b]
    if differs and not yes:
        raise ConsentError(
            f"would replace existing file(s) with the bundle's: {', '.join(differs)}; nothing was written",
            hint="re-run with --yes to accept them",
        )
    writer.write([*files, *artifacts], yes=yes, confirm=confirm, echo=io.echo, root=project.root)
    for path, b in binary:
        bf.write_bytes(path, b)
    build = here.engine.build
    with lockmod.locked(project.lock_path) as lk:
        lk.models[name] = c.models[0].entry
        for table, key in (("secondary", name), ("images", here.engine.image), ("builds", build),
                           ("sources", build)):  # fmt: skip
            if key in getattr(lock, table):
                getattr(lk, table)[key] = getattr(lock, table)[key]


def _placed(
    s: bf.ModelSet, rec: bf.Record, echo: Callable[[str], None], dst: Path, w: Want, linked: bool
) -> None:
    rec.put(w.disk_path, dst, w.kind, w.digest)
    if not linked:
        echo(f"unbundle: copied {s.member(w)} ({gib(w.size)})")
