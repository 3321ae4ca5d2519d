"""``invoke unbundle``: verify a bundle against its manifest and lock, then place spec, lock, image, source
tree and models. See :mod:`.bundle` for the format and the design.
"""

from __future__ import annotations

import hashlib
import os
import shutil
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from pydantic import ValidationError

from rigsmith import confine, writer
from rigsmith import spec as specmod
from rigsmith.errors import AdapterError, ConsentError
from rigsmith.operating import bundleplace, ociarchive
from rigsmith.operating.bundlefiles import (
    DEFAULT_IO,
    Contents,
    Io,
    ModelSet,
    Moved,
    Record,
    check_space,
    contents,
    gib,
    hash_path,
    place,
    place_all,
    same_bytes,
    same_filesystem,
    write_bytes,
)
from rigsmith.operating.bundlemanifest import (
    IMAGE_MEMBER,
    LOCK_MEMBER,
    MANIFEST,
    MODEL_PREFIX,
    BundleError,
    Manifest,
    member_path,
    read_manifest,
)
from rigsmith.progress import bars
from rigsmith.project import Project
from rigsmith.resolving import lock as lockmod
from rigsmith.resolving.modelfiles import Want, expand_dir
from rigsmith.spec import Deployment

if TYPE_CHECKING:
    from rigsmith.resolving.hub import Hub


@dataclass
class UnbundleReport:
    """What one ``unbundle`` run did."""

    deployment: str = ""
    local_dir: str = ""
    verified: int = 0
    hashed_bytes: int = 0
    moved: Moved = field(default_factory=Moved)
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


def unbundle(
    project: Project,
    path: Path,
    *,
    into: Path | None = None,
    yes: bool = False,
    confirm: Callable[[str], bool] | None = None,
    io: Io = DEFAULT_IO,
) -> UnbundleReport:
    """Verify a bundle completely, then place spec, lock, image, source tree and models; never touches the
    network.

    Raises:
        BundleError: a member is missing or does not hash to the lock or manifest, or the manifest is not
            the lock's.
        PreflightError: too little space for the models or the image (checked before the first byte).
        ImageMismatch: the engine holds another image than the lock pins after the load.
        ConsentError: the project holds a different spec or artifact and ``yes`` was not given.
    """
    bundle_dir = bundleplace.unpacked(project, path.absolute(), io.echo, io.progress, io.disk_free)
    report = _unbundle_dir(project, bundle_dir, into, yes, confirm, io)
    if bundle_dir != path.absolute():
        shutil.rmtree(bundle_dir)  # the models hold hard links to what was unpacked (or copies)
    return report


@dataclass(frozen=True)
class _Opened:
    """A bundle whose manifest agrees with the lock it carries (nothing hashed yet but the lock)."""

    bundle_dir: Path
    manifest: Manifest
    spec: Deployment
    lock_bytes: bytes
    lock: lockmod.Lock
    c: Contents


def _open(bundle_dir: Path) -> _Opened:
    """Read the manifest, spec and lock; refuse a bundle that is incomplete or whose manifest is not its
    lock's (cheap: sizes and names, before hashing anything)."""
    manifest = read_manifest(bundle_dir)
    name = manifest.deployment
    if not specmod.NAME_RE.match(name):
        raise BundleError(
            f"{bundle_dir / MANIFEST}: deployment {name!r} is not a deployment name",
            hint="a bundle names its deployment by the spec's name (lowercase letters, digits, . _ -)",
        )
    files = {member: member_path(bundle_dir, member) for member in manifest.members}
    missing = [m for m, p in files.items() if not p.is_file()]
    if missing:
        raise BundleError(
            f"{bundle_dir} is incomplete: {len(missing)} member(s) missing: " + ", ".join(missing[:10]),
            hint="copy the whole bundle directory again (or re-run `invoke bundle OUT`; it resumes)",
        )
    short = [f"{m}: {files[m].stat().st_size} bytes, the manifest says {e.size}"
             for m, e in manifest.members.items() if files[m].stat().st_size != e.size]  # fmt: skip
    if short:
        raise BundleError(f"{bundle_dir}: member(s) of the wrong size: " + "; ".join(short),
                          hint="the copy is damaged or incomplete; copy the bundle again")  # fmt: skip
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
        lock = lockmod.Lock.model_validate_json(lock_bytes)
    except ValidationError as err:
        first = err.errors()[0]
        where = ".".join(str(p) for p in first["loc"])[:200]
        raise BundleError(
            f"{LOCK_MEMBER} in {bundle_dir}: not a rigsmith lock ({where + ': ' if where else ''}"
            f"{first['msg']}); nothing was placed",
            hint="bundle again on the connected machine, from a lock `invoke pin` wrote",
        ) from None
    try:
        spec = specmod.loads((bundle_dir / spec_member).read_bytes().decode("utf-8"), source=spec_member)
    except UnicodeDecodeError:
        raise BundleError(f"{spec_member} in {bundle_dir}: not UTF-8 text; bundle refused") from None
    if spec.name != name:
        raise BundleError(
            f"{spec_member} in {bundle_dir}: names deployment {spec.name!r}, the manifest {name!r}"
        )
    c = contents(spec, lock)
    problems = check_against_lock(manifest, c)
    if problems:
        raise BundleError(f"{bundle_dir / MANIFEST} does not match its lock: " + "; ".join(problems),
                          hint="bundle again on the connected machine")  # fmt: skip
    return _Opened(bundle_dir, manifest, spec, lock_bytes, lock, c)


def check_against_lock(manifest: Manifest, c: Contents) -> list[str]:
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
    if (pin is None) != (img is None) or (pin is not None and IMAGE_MEMBER not in manifest.members):
        problems.append(f"{IMAGE_MEMBER}: the lock pins {pin.pinned_ref if pin else 'no image'}, the "
                        f"manifest {img.pinned_ref if img else 'no image'}")  # fmt: skip
    elif pin is not None and img is not None and (img.digest, img.image_id, img.pinned_ref) != (
        pin.digest, pin.image_id, pin.pinned_ref
    ):  # fmt: skip
        problems.append(
            f"{img.member}: the manifest pins {img.pinned_ref} ({img.digest or img.image_id}), the "
            f"lock {pin.pinned_ref} ({pin.digest or pin.image_id})"
        )
    return problems


@dataclass(frozen=True)
class _Dest:
    """One model's directory on this machine, its verified-file record, and what it still lacks."""

    s: ModelSet
    root: Path
    record: Record
    todo: list[Want]


# Over 80 lines on purpose: verify-then-place in one ordered pass (disk space, every member to place hashed,
# and only then the writes); _open, _verify, _place_project and _place_sources hold the steps, this function
# the order and the consent prompts.
def _unbundle_dir(
    project: Project,
    bundle_dir: Path,
    into: Path | None,
    yes: bool,
    confirm: Callable[[str], bool] | None,
    io: Io,
) -> UnbundleReport:
    from rigsmith.resolving import modelfetch
    from rigsmith.resolving.sources import Sources, cache_root

    o = _open(bundle_dir)
    here, name = o.spec, o.spec.name
    if into is not None and into.absolute() != expand_dir(here.model.local_dir):
        data = specmod.to_data(here)
        data["model"]["local_dir"] = str(into.absolute())
        here = specmod.from_data(data)
        io.echo(f"unbundle: model.local_dir of deployments/{name}.yaml set to {into.absolute()} (--into)")
    c = contents(here, o.lock)  # the same members; the model dirs of this machine
    placing = bundleplace.placements(project, bundle_dir, o.manifest, here, o.lock_bytes, c)
    dests = []
    for s in c.models:
        root = expand_dir(s.spec.model.local_dir)
        for w in s.wanted:  # a link planted in the model dir must not carry a placed file elsewhere
            confine.under(root, w.disk_path, f"model dir {root}", BundleError)
        record = Record(root)
        todo = [w for w in s.wanted if not record.vouches(w.disk_path, root / w.disk_path, w.kind, w.digest)]
        dests.append(_Dest(s, root, record, todo))
    report = UnbundleReport(deployment=name, local_dir=str(dests[0].root), lock_sha256=o.manifest.lock_sha256)
    cache = Sources(cache_root())
    src = c.sources
    need_tree = src is not None and not cache.has_commit(src.entry.repo, src.entry.commit)
    assets = [a for a in src.entry.assets.values() if cache.cached(a.sha256) is None] if src else []

    image_present = c.pin is None or ociarchive.present(c.pin, io.run)
    needs: dict[Path, int] = {}
    for d in dests:
        for w in d.todo:
            if not same_filesystem(bundle_dir / d.s.member(w), d.root):
                needs[d.root] = needs.get(d.root, 0) + w.size
    if not image_present:
        store = ociarchive.storage_root(io.run)
        if store is not None:
            needs[store] = needs.get(store, 0) + o.manifest.members[IMAGE_MEMBER].size
    check_space(
        needs,
        io.disk_free,
        "unbundling (model files copied across filesystems, and the image in podman's storage)",
        "free space there, or pass --into DIR on a bigger disk (on the bundle's filesystem the model is "
        "hard-linked, not copied)",
    )

    skip = {d.s.member(w) for d in dests for w in d.s.wanted if w not in d.todo}
    skip |= {src.asset_member(a) for a in src.entry.assets.values() if a not in assets} if src else set()
    skip |= {src.tree_member} if src and not need_tree else set()
    _verify(
        bundle_dir, o.manifest, c, report, io.progress, skip | ({IMAGE_MEMBER} if image_present else set())
    )

    if (
        src is not None
        and need_tree
        and not cache.add_tree(src.entry.repo, src.entry.commit, bundle_dir / src.tree_member)
    ):
        # git checked every object's hash; the locked commit must be among them (objects alone: inert)
        raise BundleError(
            f"{src.tree_member}: does not hold the locked commit {src.entry.commit} of {src.entry.repo}; "
            "nothing was placed",
            hint="the bundle was changed or damaged in transit; copy it again from the connected machine",
        )

    # The model dirs are the bundle's spec's (or --into): like fetch-model, never fill someone else's.
    home = os.environ.get("HOME") or str(Path.home())
    for d in dests:
        where = "--into" if into and d.s.prefix == MODEL_PREFIX else f"deployments/{name}.yaml {d.s.field}"
        try:
            modelfetch.guard_dir(d.root, where, home, d.s.entry, d.s.wanted, confirm, yes)
        except ConsentError as err:
            raise ConsentError(
                err.message + "; nothing was placed",
                hint="pass --into DIR (an empty directory of its own), or --yes to place the model there "
                "anyway (files not in the snapshot are never touched)",
            ) from None

    # Everything checks out: place the project files, the image, the source tree and assets, the models.
    _place_project(project, placing, o, here, yes, confirm, io)
    if c.pin is not None:
        report.image = c.pin.pinned_ref
        if not image_present:
            io.echo(f"unbundle: loading {c.pin.pinned_ref} into local storage")
            ociarchive.load(c.pin, bundle_dir / IMAGE_MEMBER, run=io.run)
            report.image_loaded = True
    if src is not None:
        for a in assets:
            hexd = a.sha256.removeprefix("sha256:")
            place(bundle_dir / src.asset_member(a), cache.asset_path(a.sha256), "sha256", hexd, a.size)
    for d in dests:
        _place_model(bundle_dir, d, report, io)

    # Re-check through fetch-model itself: offline, every file vouched for by its record.
    from rigsmith.resolving.secondaryfetch import fetch_models

    fetch = fetch_models(project, project.load(name), hub=no_hub, echo=io.echo, progress=False)
    for r in (fetch, *(sub for _repo, sub in fetch.secondary)):
        if r.downloaded or r.cached != r.files:
            raise BundleError(
                f"{r.local_dir}: after unbundling, fetch-model verified {r.cached} of {r.files} files from "
                "its record",
                hint="run `invoke unbundle PATH` again",
            )
    report.fetch_summary = fetch.summary()
    return report


def _verify(
    bundle_dir: Path, manifest: Manifest, c: Contents, report: UnbundleReport, progress: bool | None,
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
            got = hash_path(bundle_dir / member, kind, e.size, lambda n: prog.advance(task, n))
            report.hashed_bytes += e.size
            if got != want:
                whose = "the lock" if member in locked else "the manifest"
                bad.append(f"{member}: {kind} {got}, {whose} says {want}")
            else:
                report.verified += 1
    if bad:
        raise BundleError(
            f"refusing the bundle {bundle_dir}: {len(bad)} member(s) do not match: " + "; ".join(bad)
            + "; nothing was placed",
            hint="the bundle was changed or damaged in transit; copy it again from the connected machine",
        )  # fmt: skip
    if c.pin is not None and IMAGE_MEMBER not in skip:
        facts = ociarchive.archive_facts(bundle_dir / IMAGE_MEMBER, IMAGE_MEMBER)
        if not ociarchive.matches(c.pin, facts):
            raise BundleError(
                f"{IMAGE_MEMBER}: holds manifest {facts.manifest_digest} (image ID {facts.config_digest}), "
                f"the lock pins {c.pin.digest or c.pin.image_id}",
                hint="bundle again on the connected machine",
            )


def _place_project(
    project: Project,
    placing: bundleplace.Placing,
    o: _Opened,
    here: Deployment,
    yes: bool,
    confirm: Callable[[str], bool] | None,
    io: Io,
) -> None:
    """Spec, image definition and artifacts through the writer (consent rules); the lock entries merged."""
    name = here.name
    text = (o.bundle_dir / f"deployments/{name}.yaml").read_text(encoding="utf-8")
    spec_text = text if here is o.spec else specmod.dump(here)
    files = [writer.Artifact(confine.under(project.root, f"deployments/{name}.yaml", "the spec"), spec_text)]
    # Image-definition files that are not text go around the (text-only) writer, under the same consent.
    binary: list[tuple[Path, bytes]] = []
    for path, blob in placing.images:
        try:
            files.append(writer.Artifact(path, blob.decode("utf-8")))
        except UnicodeDecodeError:
            binary.append((path, blob))
    differs = [str(p) for p, b in binary if p.exists() and not same_bytes(p, b)]
    if differs and not yes:
        raise ConsentError(
            f"would replace existing file(s) with the bundle's: {', '.join(differs)}; nothing was written",
            hint="re-run with --yes to accept them",
        )
    writer.write([*files, *placing.artifacts], yes=yes, confirm=confirm, echo=io.echo, root=project.root)
    for path, b in binary:
        if not same_bytes(path, b):
            write_bytes(path, b)
    bl, c = o.lock, o.c
    with lockmod.locked(project.lock_path) as lk:
        lk.models[name] = c.models[0].entry
        if name in bl.secondary:
            lk.secondary[name] = bl.secondary[name]
        if here.engine.image and here.engine.image in bl.images:
            lk.images[here.engine.image] = bl.images[here.engine.image]
        if here.engine.build and here.engine.build in bl.builds:
            lk.builds[here.engine.build] = bl.builds[here.engine.build]
        if c.sources is not None:
            lk.sources[c.sources.image] = c.sources.entry


def _place_model(bundle_dir: Path, d: _Dest, report: UnbundleReport, io: Io) -> None:
    """Link or copy each verified member to where fetch-model keeps it; record it as it lands."""
    report.already_placed += len(d.s.wanted) - len(d.todo)
    d.root.mkdir(parents=True, exist_ok=True)

    def placed(dst: Path, w: Want, linked: bool) -> None:
        d.record.put(w.disk_path, dst, w.kind, w.digest)
        if not linked:
            io.echo(f"unbundle: copied {d.s.member(w)} ({gib(w.size)})")

    where = f"model dir {d.root}"
    jobs = [(bundle_dir / d.s.member(w), confine.make_dirs(d.root, w.disk_path, where, BundleError), w)
            for w in d.todo]  # fmt: skip
    place_all(jobs, report.moved, title=f"place {d.s.entry.repo}", progress=io.progress, placed=placed)
