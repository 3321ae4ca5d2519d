"""Where a bundle's members may land, decided before anything is written: the tar unpacked member by member
through the one confinement rule, and every member sorted into a kind ``unbundle`` may place (never a
member's name joined to the checkout). See :mod:`.unbundle` for the flow and :mod:`rigsmith.confine`.
"""

from __future__ import annotations

import shutil
import tarfile
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from rigsmith import confine, writer
from rigsmith import spec as specmod
from rigsmith.errors import RigsmithError
from rigsmith.operating.bundlefiles import Contents, DiskFree, Echo, atomic, check_space
from rigsmith.operating.bundlemanifest import (
    ARTIFACT_PREFIX,
    IMAGE_MEMBER,
    LOCK_MEMBER,
    MANIFEST,
    MODEL_PREFIX,
    BundleError,
    Manifest,
)
from rigsmith.progress import bars
from rigsmith.project import TARGETS, Project
from rigsmith.resolving.modelfiles import HASH_CHUNK, STATE_DIR
from rigsmith.spec import Deployment


def unpacked(project: Project, path: Path, echo: Echo, progress: bool | None, disk_free: DiskFree) -> Path:
    """A bundle directory as is; a tar is unpacked (safely) into the project first, resumably."""
    if path.is_dir():
        return path
    if not path.is_file():
        raise BundleError(f"{path}: no such bundle (a directory made by `invoke bundle`, or its --tar file)")
    dest = work_dir(project) / path.name.removesuffix(".tar")
    try:
        with tarfile.open(path, "r:") as tf:
            infos = tf.getmembers()
    except tarfile.TarError as err:
        raise BundleError(f"{path}: not a bundle tar ({err})") from None
    files = tar_files(path, infos)
    need = sum(i.size for n, i in files.items() if not have(dest / n, i.size))
    check_space(
        {dest: need}, disk_free, f"unpacking {path.name}", "unpack it elsewhere and pass the directory"
    )
    echo(f"unbundle: unpacking {path} into {dest}")
    dest.mkdir(parents=True, exist_ok=True)
    with tarfile.open(path, "r:") as tf, bars(progress) as prog:
        task = prog.add_task(f"unpack {path.name}", total=sum(i.size for i in files.values()))
        for name, info in files.items():
            target = confine.make_dirs(dest, name, f"{path}: tar member", BundleError)
            if not have(target, info.size):
                src = tf.extractfile(info)
                assert src is not None  # a regular file (checked by tar_files)
                try:
                    with src, atomic(target) as out:
                        shutil.copyfileobj(src, out, HASH_CHUNK)
                except OSError as err:
                    raise BundleError(
                        f"{path}: cannot unpack member {name!r} into {dest}: {err.strerror or err}",
                        hint="unpack the tar by hand on a filesystem that can hold its names, and pass the "
                        "directory",
                    ) from None
            prog.advance(task, info.size)
    return dest


def tar_files(path: Path, infos: Sequence[tarfile.TarInfo]) -> dict[str, tarfile.TarInfo]:
    """A bundle tar's regular files by name, every name checked before anything is written: no links,
    devices or FIFOs, no name that leaves the bundle, no name twice."""
    out: dict[str, tarfile.TarInfo] = {}
    for info in infos:
        name = confine.check(info.name, f"{path}: tar member", BundleError)
        if info.isdir():
            continue
        if not info.isreg():
            raise BundleError(
                f"{path}: refusing member {info.name!r}: not a regular file (a link, device or FIFO); "
                "nothing was unpacked",
                hint="a bundle tar holds only files; make it again with `invoke bundle OUT --tar`",
            )
        if name in out:
            raise BundleError(f"{path}: member {info.name!r} appears twice; nothing was unpacked")
        out[name] = info
    return out


def work_dir(project: Project) -> Path:
    """Unbundle's own book-keeping in the checkout (``.rigsmith/`` is git-ignored): unpacked tars and the
    cache of members verified so far."""
    return project.root / STATE_DIR / "unbundle"


def have(p: Path, size: int) -> bool:
    try:
        return p.stat().st_size == size
    except FileNotFoundError:
        return False


@dataclass(frozen=True)
class Placing:
    """Where a bundle's project members go: each by its kind, at a path rigsmith chose (a member's name is
    never joined to the checkout)."""

    spec_text: str
    #: The image definition of ``engine.build``: path under images/BUILD/ → bytes.
    images: list[tuple[Path, bytes]]
    #: The rendered artifacts, at the path and mode ``deploy`` gives them here, with the bundle's text.
    artifacts: list[writer.Artifact]
    targets: list[str]


def placements(
    project: Project, bundle_dir: Path, manifest: Manifest, spec: Deployment, lock_bytes: bytes, c: Contents
) -> Placing:
    """Sort every member into a kind unbundle may place, or refuse the bundle before anything is written.

    The kinds: the spec and lock at their fixed names, the image archive, the lock's model files, the image
    definition of the spec's ``engine.build`` (under images/BUILD/), and the artifacts that rendering the
    manifest's targets from the bundle's own spec and lock produces (path and mode from that render).
    """
    where = str(bundle_dir / MANIFEST)
    name = spec.name
    odd = [t for t in manifest.targets if t not in TARGETS]
    if odd:
        raise BundleError(f"{where}: targets {odd} are not rigsmith targets ({', '.join(TARGETS)})")
    fixed = {f"deployments/{name}.yaml", LOCK_MEMBER, *((IMAGE_MEMBER,) if c.pin is not None else ())}
    fixed |= {MODEL_PREFIX + w.repo_path for w in c.wanted}
    build = f"images/{spec.engine.build}/" if spec.engine.build else None
    images: dict[str, bytes] = {}
    arts: dict[str, str] = {}
    stray = []
    for member in manifest.members:
        if member in fixed:
            continue
        if build is not None and member.startswith(build):
            images[member.removeprefix(build)] = (bundle_dir / member).read_bytes()
        elif member.startswith(ARTIFACT_PREFIX) and manifest.targets:
            arts[member.removeprefix(ARTIFACT_PREFIX)] = member
        else:
            stray.append(member)
    rendered = render_targets(project, spec, lock_bytes, images, manifest.targets, bundle_dir)
    stray += [arts[rel] for rel in sorted(set(arts) - set(rendered))]
    if stray:
        raise BundleError(
            f"{where}: {len(stray)} member(s) are none of what a bundle of {name!r} holds: "
            + ", ".join(repr(m) for m in stray[:5])
            + "; nothing was placed",
            hint="a bundle holds the spec, the lock, the image archive, the lock's model files, "
            f"images/{spec.engine.build or 'BUILD'}/ and the artifacts of its targets; bundle again on the "
            "connected machine",
        )
    root = project.root.resolve()
    out = []
    for rel, member in sorted(arts.items()):
        confine.under(root, rel, f"{where}: artifact", BundleError)
        text = (bundle_dir / member).read_bytes().decode("utf-8", errors="strict")
        out.append(writer.Artifact(rendered[rel].path, text, rendered[rel].mode))
    placed = [
        (confine.under(root, f"{build}{rel}", f"{where}: image definition", BundleError), blob)
        for rel, blob in sorted(images.items())
    ]
    spec_text = (bundle_dir / f"deployments/{name}.yaml").read_text(encoding="utf-8")
    return Placing(spec_text, placed, out, list(manifest.targets))


def render_targets(
    project: Project,
    spec: Deployment,
    lock_bytes: bytes,
    images: dict[str, bytes],
    targets: Sequence[str],
    bundle_dir: Path,
) -> dict[str, writer.Artifact]:
    """The bundle's targets rendered from its own spec and lock in a scratch checkout, for this checkout's
    paths: relative path → artifact (what may be placed, and with which mode)."""
    from rigsmith.rendering import deploy as deploymod

    if not targets:
        return {}
    root = project.root.resolve()
    out: dict[str, writer.Artifact] = {}
    with tempfile.TemporaryDirectory(prefix="rigsmith-unbundle-") as tmp:
        scratch = Project(Path(tmp))
        scratch.deployments.mkdir()
        scratch.spec_path(spec.name).write_text(specmod.dump(spec), encoding="utf-8")
        scratch.lock_path.write_bytes(lock_bytes)
        for rel, blob in images.items():
            what = f"{bundle_dir / MANIFEST}: image definition"
            confine.make_dirs(
                scratch.root, f"images/{spec.engine.build}/{rel}", what, BundleError
            ).write_bytes(blob)
        for target in targets:
            try:
                _plan, arts = deploymod.artifacts(scratch, target, deployment=spec.name, out=root)
            except RigsmithError as err:
                raise BundleError(
                    f"{bundle_dir}: its {target} artifacts cannot be rendered here from its spec and lock "
                    f"({err.message})",
                    hint="bundle again on the connected machine with this rigsmith version",
                ) from None
            out.update({a.path.relative_to(root).as_posix(): a for a in arts})
    return out
