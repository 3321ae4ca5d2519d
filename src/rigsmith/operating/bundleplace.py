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
    LOCK_MEMBER,
    MANIFEST,
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
    """Where unbundle unpacks a bundle tar in the checkout (``.rigsmith/`` is git-ignored)."""
    return project.root / STATE_DIR / "unbundle"


def have(p: Path, size: int) -> bool:
    try:
        return p.stat().st_size == size
    except FileNotFoundError:
        return False


@dataclass(frozen=True)
class Placing:
    """Where a bundle's project files go, each at a path rigsmith chose (a member's name is never joined to
    the checkout): the image definition of ``engine.build`` (path → bytes) and the rendered artifacts."""

    images: list[tuple[Path, bytes]]
    artifacts: list[writer.Artifact]


def placements(
    project: Project, bundle_dir: Path, manifest: Manifest, spec: Deployment, lock_bytes: bytes, c: Contents
) -> Placing:
    """Sort every member into a kind unbundle may place, or refuse the bundle before anything is written.

    The kinds: the spec and lock at their fixed names, the image archive, the lock's model, secondary model
    and asset files and source tree, the image definition of ``engine.build`` (under images/BUILD/), and
    the artifacts of the manifest's targets: only the paths that rendering those targets here from the
    bundle's spec (``spec``: with this machine's model dir) and lock produces. What is placed is that
    render, for this checkout's paths, never an artifact member's bytes.
    """
    from rigsmith.rendering import deploy as deploymod

    where = f"{bundle_dir / MANIFEST}"
    odd = [t for t in manifest.targets if t not in TARGETS]
    if odd:
        raise BundleError(f"{where}: targets {odd} are not rigsmith targets ({', '.join(TARGETS)})")
    fixed = {f"deployments/{spec.name}.yaml", LOCK_MEMBER} | c.carried()
    build = f"images/{spec.engine.build}/" if spec.engine.build else None
    images = {m.removeprefix(build): m for m in manifest.members if build and m.startswith(build)}
    arts = {m.removeprefix(ARTIFACT_PREFIX) for m in manifest.members if m.startswith(ARTIFACT_PREFIX)}
    stray = [m for m in manifest.members if m not in fixed and not (build and m.startswith(build))
             and not (m.startswith(ARTIFACT_PREFIX) and manifest.targets)]  # fmt: skip
    root = project.root.resolve()
    rendered: dict[str, writer.Artifact] = {}
    with tempfile.TemporaryDirectory(prefix="rigsmith-unbundle-") as tmp:
        scratch = Project(Path(tmp))
        scratch.deployments.mkdir()
        scratch.spec_path(spec.name).write_text(specmod.dump(spec), encoding="utf-8")
        scratch.lock_path.write_bytes(lock_bytes)
        for rel, member in images.items():
            dest = confine.make_dirs(scratch.root, f"{build}{rel}", f"{where}: image definition", BundleError)
            dest.write_bytes((bundle_dir / member).read_bytes())
        for target in manifest.targets:
            try:
                _plan, files = deploymod.artifacts(scratch, target, deployment=spec.name, out=root)
            except RigsmithError as err:
                raise BundleError(
                    f"{bundle_dir}: its {target} artifacts cannot be rendered here from its spec and lock "
                    f"({err.message})",
                    hint="bundle again on the connected machine with this rigsmith version",
                ) from None
            rendered.update({a.path.relative_to(root).as_posix(): a for a in files})
    stray += [ARTIFACT_PREFIX + rel for rel in sorted(arts - set(rendered))]
    if stray:
        raise BundleError(
            f"{where}: {len(stray)} member(s) are none of what a bundle of {spec.name!r} holds: "
            + ", ".join(repr(m) for m in stray[:5]) + "; nothing was placed",
            hint="a bundle holds the spec, the lock, the image archive, the lock's model files and source "
            f"tree, images/{spec.engine.build or 'BUILD'}/ and the artifacts of its targets; bundle again on "
            "the connected machine",
        )  # fmt: skip
    placed = [
        (confine.under(root, f"{build}{rel}", f"{where}: image definition", BundleError),
         (bundle_dir / member).read_bytes())
        for rel, member in sorted(images.items())
    ]  # fmt: skip
    return Placing(placed, [rendered[rel] for rel in sorted(rendered)])
