"""``invoke unbundle``: verify a bundle against its manifest and lock, then place spec, lock, image and model.
See :mod:`.bundle` for the format and the design.
"""

from __future__ import annotations

import hashlib
import os
import shutil
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from rigsmith import confine, writer
from rigsmith import spec as specmod
from rigsmith.errors import AdapterError, ConsentError
from rigsmith.operating import bundleplace, ociarchive
from rigsmith.operating.bundlefiles import (
    DEFAULT_IO,
    Contents,
    DiskFree,
    Echo,
    Io,
    Moved,
    check_against_lock,
    check_space,
    contents,
    gib,
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
from rigsmith.resolving.modelfiles import (
    HASH_CHUNK,
    STATE_DIR,
    STATE_FILE,
    DirState,
    Hasher,
    Want,
    dump_state,
    expand_dir,
    read_state,
)
from rigsmith.resolving.verified import seen, verified, vouches
from rigsmith.spec import Deployment
from rigsmith.writer import write_one

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
            f"({self.verified_earlier} earlier, {gib(self.hashed_bytes)} hashed)",
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
            hint="run `invoke unbundle PATH` again (it resumes); if it persists the bundle lacks a file",
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
        bundle_dir = bundleplace.unpacked(project, path.absolute(), echo, progress, disk_free)
        report = _unbundle_dir(project, bundle_dir, into, yes, confirm, echo, progress, run, disk_free)
        if bundle_dir != path.absolute():
            # The model holds hard links to what was unpacked (or copies): the unpacked tree can go.
            shutil.rmtree(bundle_dir)
        return report


# Over 80 lines on purpose: verify-then-place in one ordered pass (disk space, every member against the
# manifest and the manifest against the lock, and only then the writes); _verify_members, _place_project
# and _place_model hold the steps, this function the order and the consent prompts.
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
    try:
        spec = specmod.loads(spec_bytes.decode("utf-8"), source=spec_member)
    except UnicodeDecodeError:
        raise BundleError(f"{spec_member} in {bundle_dir}: not UTF-8 text; bundle refused") from None
    if spec.name != name:
        raise BundleError(
            f"{spec_member} in {bundle_dir}: names deployment {spec.name!r}, the manifest {name!r}"
        )
    c = contents(spec, bundle_lock)
    problems = check_against_lock(manifest, c)
    if problems:
        raise BundleError(f"{bundle_dir / MANIFEST} does not match its lock: " + "; ".join(problems),
                          hint="bundle again on the connected machine")  # fmt: skip
    placing = bundleplace.placements(project, bundle_dir, manifest, spec, lock_bytes, c)

    root = into.absolute() if into is not None else expand_dir(spec.model.local_dir)
    report = UnbundleReport(deployment=name, local_dir=str(root), lock_sha256=lock_sha)
    fetched = read_state(root / STATE_DIR / STATE_FILE)

    for w in c.wanted:  # a link planted in the model dir must not carry a placed file elsewhere
        confine.under(root, w.disk_path, f"model dir {root}", BundleError)

    def in_place(w: Want) -> bool:
        try:
            st = (root / w.disk_path).stat()
        except FileNotFoundError:
            return False
        return vouches(fetched.files.get(w.disk_path), seen(st), w.kind, w.digest)

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
    cache = bundleplace.work_dir(project) / f"verified-{key}.json"
    _verify_members(bundle_dir, manifest, c, report, progress, cache)

    # The model dir is the bundle's spec's (or --into): like fetch-model, never fill someone else's directory.
    from rigsmith.resolving import modelfetch

    field = "--into" if into is not None else f"deployments/{name}.yaml model.local_dir"
    home = os.environ.get("HOME") or str(Path.home())
    try:
        modelfetch.guard_dir(root, field, home, c.entry, c.wanted, confirm, yes)
    except ConsentError as err:
        raise ConsentError(
            err.message + "; nothing was placed",
            hint="pass --into DIR (an empty directory of its own), or --yes to place the model there anyway "
            "(files not in the snapshot are never touched)",
        ) from None

    # Everything checks out: place the project files, the image, the model.
    _place_project(project, bundle_dir, placing, spec, bundle_lock, c, into, root, yes, confirm, echo)
    if c.pin is not None:
        report.image = c.pin.pinned_ref
        if not image_present:
            echo(f"unbundle: loading {c.pin.pinned_ref} into local storage")
            ociarchive.load(c.pin, bundle_dir / IMAGE_MEMBER, run=run)
            report.image_loaded = True
    _place_model(bundle_dir, c, root, todo, fetched, report, progress)
    report.already_placed = len(c.wanted) - len(todo)

    # Re-check through fetch-model itself: offline, from the cache.
    placed = project.load(name)
    fetch = modelfetch.fetch_model(
        project, placed, dest=None if into is None else root, hub=OfflineHub(), echo=echo, progress=False
    )
    if fetch.downloaded or fetch.cached != len(c.wanted):
        raise BundleError(
            f"{root}: after unbundling, fetch-model verified {fetch.cached} of {len(c.wanted)} files from "
            "its cache",
            hint="run `invoke unbundle PATH` again",
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
        if vouches(fs, seen(st), "sha256", e.sha256):
            report.verified_earlier += 1
        else:
            todo.append(member)
    with bars(progress) as prog:
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
            cache.files[member] = verified(seen(st), "sha256", got)
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
    placing: bundleplace.Placing,
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
    spec_text = placing.spec_text
    if relocated:
        data = specmod.to_data(spec)
        data["model"]["local_dir"] = str(root)
        spec_text = specmod.dump(specmod.from_data(data))
        echo(f"unbundle: model.local_dir of deployments/{name}.yaml set to {root} (--into)")
    files.append(
        writer.Artifact(confine.under(project.root, f"deployments/{name}.yaml", "the spec"), spec_text)
    )
    # Image-definition files that are not text go around the (text-only) writer, under the same consent.
    binary: list[tuple[Path, bytes]] = []
    for path, blob in placing.images:
        try:
            files.append(writer.Artifact(path, blob.decode("utf-8")))
        except UnicodeDecodeError:
            binary.append((path, blob))
    if not relocated:
        files += placing.artifacts
    differs = [str(p) for p, b in binary if p.exists() and not same_bytes(p, b)]
    if differs and not yes:
        raise ConsentError(
            f"would replace existing file(s) with the bundle's: {', '.join(differs)}; nothing was written",
            hint="re-run with --yes to accept them",
        )
    writer.write(files, yes=yes, confirm=confirm, echo=echo, root=project.root)
    for path, b in binary:
        if not same_bytes(path, b):
            write_bytes(path, b)
    with lockmod.locked(project.lock_path) as lk:
        lk.models[name] = c.entry
        if spec.engine.image and spec.engine.image in bundle_lock.images:
            lk.images[spec.engine.image] = bundle_lock.images[spec.engine.image]
        if spec.engine.build and spec.engine.build in bundle_lock.builds:
            lk.builds[spec.engine.build] = bundle_lock.builds[spec.engine.build]
    if relocated:
        for target in placing.targets:
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
        fetched.files[w.disk_path] = verified(seen((root / w.disk_path).stat()), w.kind, w.digest)
        write_one(state_path, dump_state(fetched))

    place_all(
        todo,
        lambda w: (
            bundle_dir / (MODEL_PREFIX + w.repo_path),
            confine.make_dirs(root, w.disk_path, f"model dir {root}", BundleError),
            root / STATE_DIR / "partial" / w.partial_name,
        ),
        report.moved,
        title=f"place {c.spec.name}",
        progress=progress,
        placed=record,
    )
