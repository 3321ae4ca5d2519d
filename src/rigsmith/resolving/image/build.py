"""``invoke pin`` (image part) and ``invoke build``: the steps that touch registries and engines.

Both end by writing facts into ``rigsmith.lock``; ``deploy`` later reads only the lock. Each step
converges, acts and re-checks: the built image's labels must carry the patch hashes rendered into the
Dockerfile, and a pushed digest must be what the registry now serves for the tag.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING

from rigsmith import spec as specmod
from rigsmith import writer
from rigsmith.errors import AdapterError, LockError, RigsmithError, SpecError
from rigsmith.imageref import parse_ref
from rigsmith.project import Project
from rigsmith.resolving.image import engineroute, imagedef
from rigsmith.resolving.image import image as imagemod
from rigsmith.resolving.image.engine import Engine
from rigsmith.resolving.image.sources import Sources, cache_root, tree_files
from rigsmith.resolving.lock import lock as lockmod

if TYPE_CHECKING:
    from rigsmith.resolving.image.registry import Resolver  # httpx: loaded only where a registry is asked

Echo = Callable[[str], None]

#: Local name of a build before (or without) a push: a name no registry serves.
LOCAL_REPO = "localhost/rigsmith"


# -- pin ----------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Pinned:
    """One floating reference and what it resolved to."""

    ref: str
    digest: str
    previous: str | None
    source: str  # where the reference was found

    @property
    def changed(self) -> bool:
        """True when the lock did not hold this digest."""
        return self.previous != self.digest


def is_local_only(ref: str) -> bool:
    """``localhost/NAME`` (no port) is Podman's name for an image built or imported on this host: there is
    no registry to ask for its digest."""
    return parse_ref(ref).registry == "localhost"


def floating_image_refs(project: Project, deployment: str | None = None) -> list[tuple[str, str]]:
    """(tag reference, where it was found) for every image tag ``pin`` must resolve. Reads specs only.

    With a deployment: its ``engine.image`` and the base of its ``engine.build`` (or of its filled proposed
    build). Without: every deployment's ``engine.image`` and every ``images/*/image.yaml`` base but those
    of proposed builds still to fill. References already pinned by
    digest (in the spec or in image.yaml) are left out; local-only names are included (see pin_images).
    """
    names = [project.resolve_name(deployment)] if deployment else project.deployment_names()
    builds = [] if deployment else engineroute.pinnable(project)
    out: dict[str, str] = {}
    for name in names:
        spec = project.load(name)
        if spec.engine.image and "@" not in spec.engine.image:
            out.setdefault(spec.engine.image, f"deployments/{name}.yaml engine.image")
        builds += [b for b in engineroute.images_of(project, spec) if b not in builds]
    for b in builds:
        base = imagedef.load(project.images, b).base
        if base.digest is None and base.tag_ref:
            out.setdefault(base.tag_ref, f"images/{b}/image.yaml base")
    return sorted(out.items())


def pin_images(
    project: Project, resolver: Resolver, *, deployment: str | None = None, echo: Echo = print
) -> list[Pinned]:
    """Resolve image tags to registry digests and record them in ``rigsmith.lock`` ``images``.

    Every reference is resolved before the lock is touched, so a failure changes nothing.
    """
    refs = []
    for ref, source in floating_image_refs(project, deployment):
        if is_local_only(ref):
            echo(
                f"     skip  {ref}  ({source}): a local-only name, no registry serves it; build it with "
                "`invoke build` (engine.build) or push it and name the registry"
            )
        else:
            refs.append((ref, source))
    if not refs:
        echo("pin: no image tags to resolve")
        return []
    resolved = {ref: resolver.resolve(ref) for ref, _ in refs}
    out: list[Pinned] = []
    with lockmod.locked(project.lock_path) as lock:
        for ref, source in refs:
            r = resolved[ref]
            old = lock.images.get(ref)
            lock.images[ref] = lockmod.LockedImage(digest=r.digest, media_type=r.media_type)
            out.append(Pinned(ref, r.digest, old.digest if old else None, source))
    for p in out:
        state = "unchanged" if not p.changed else ("updated" if p.previous else "pinned")
        echo(f"{state:>9}  {p.ref} -> {p.digest}  ({p.source})")
    return out


# -- build --------------------------------------------------------------------------------------------------


def image_name(project: Project, *, image: str | None, deployment: str | None) -> str:
    """The images/<name> to build: ``--image``, else the deployment's ``engine.build``."""
    if image:
        return image
    spec = project.load(deployment)
    if not spec.engine.build:
        found = engineroute.proposed(project, spec)
        if found is not None:
            raise RigsmithError(
                f"deployment {spec.name!r} runs the image {spec.engine.image} and builds none (engine.build "
                f"is empty); {found.path} is the engine its recipe describes",
                hint=engineroute.missing_image(spec, spec.engine.image or "", found),
            )
        raise RigsmithError(
            f"deployment {spec.name!r} does not build an image (engine.build is empty)",
            hint=f"pass --image NAME (one of: {', '.join(imagedef.names(project.images)) or 'none'}), or set "
            "engine.build in the spec",
        )
    return spec.engine.build


def images_to_build(project: Project, *, image: str | None, deployment: str | None) -> list[str]:
    """``--image``, else ``--deployment``'s (or the default deployment's) engine.build, else every
    images/<name> some deployment builds (a bare ``invoke build`` after a fresh checkout builds what the
    deployments need)."""
    if image or deployment or project.default:
        return [image_name(project, image=image, deployment=deployment)]
    names = sorted(
        {b for b in (project.load(n).engine.build for n in project.deployment_names()) if b is not None}
    )
    if not names:
        raise RigsmithError(
            f"no deployment in {project.deployments} builds an image (engine.build is empty in each)",
            hint=f"pass --image NAME (one of: {', '.join(imagedef.names(project.images)) or 'none'})",
        )
    return names


@dataclass(frozen=True)
class Switch:
    """``invoke build --image NAME --deployment D`` where D does not build NAME yet: once NAME is built,
    D's spec runs it (:func:`engineroute.link`), merged three-way into the file as it was read before the
    build (an edit made meanwhile is kept)."""

    path: Path
    read: str
    spec: specmod.Deployment
    name: str

    def finish(self, entry: lockmod.LockedBuild, root: Path, echo: Echo) -> None:
        # The importer (its recipe forms and httpx): 206 ms (-X importtime) a build that links nothing skips.
        from rigsmith.importing.importer import merge_user_change

        changed = engineroute.link(self.spec, self.name, tuple(entry.provides or ()))
        new = merge_user_change(self.path, self.read, changed)
        modeline = specmod.MODELINE if self.read.startswith(specmod.MODELINE) else ""
        artifacts = [writer.Artifact(self.path, modeline + specmod.dump(new))]
        for outcome in writer.plan(artifacts):
            if outcome.status == "update":
                echo(outcome.diff(root).rstrip())
        # --image NAME --deployment D is the user's explicit choice of this change: it is the consent.
        writer.write(artifacts, yes=True, echo=echo, root=root)
        d = f"--deployment {self.spec.name}"
        echo(f"{self.spec.name} now runs the build {self.name} (engine.build); next: `invoke next {d}`")


def switch(project: Project, *, image: str | None, deployment: str | None) -> Switch | None:
    """The spec change ``--image NAME --deployment D`` asks for, when D does not build NAME yet."""
    if not (image and deployment):
        return None
    spec = project.load(deployment)
    if spec.engine.build == image:
        return None
    path = project.spec_path(spec.name)
    return Switch(path, path.read_text(encoding="utf-8"), spec, image)


def build_command(name: str) -> str:
    """The command line in the Dockerfile banner (no engine or registry in it: same bytes for both)."""
    return f"invoke build --image {name}"


def prepare(
    project: Project, name: str, sources: Sources | None = None
) -> tuple[imagedef.ImageDef, imagemod.Context]:
    """Load, gather and render the build context of ``images/<name>``; no engine. A definition with a
    source tree reads the locked commit and assets from ``sources``' cache (the network only for what
    it lacks)."""
    definition = imagedef.load(project.images, name)
    lock = lockmod.read(project.lock_path)
    try:
        inputs = imagemod.gather(project.images, name, definition)
    except SpecError as err:
        # Say everything that blocks the build at once: missing files and a missing pin.
        try:
            imagemod.base_digest(definition, lock, name)
        except LockError as pin:
            raise SpecError(err.source, [*err.problems, ("base", f"{pin.message}; {pin.hint}")],
                            what="image definition") from None  # fmt: skip
        raise
    if definition.tree is not None:
        imagemod.base_digest(definition, lock, name)  # a missing pin fails before any download
        imagemod.locked_source(definition, lock, name)
        own = sources is None
        src = Sources(cache_root()) if sources is None else sources
        try:
            inputs = replace(inputs, tree=tree_files(project, src, name, definition))
        finally:
            if own:
                src.close()
    return definition, imagemod.render_context(inputs, lock, command=build_command(name))


def context_dir(project: Project, name: str) -> Path:
    """Where the rendered context is kept for inspection (and for a plain `podman build`)."""
    return project.root / "build" / "images" / name


def materialize(ctx: imagemod.Context, dest: Path, epoch: int) -> None:
    """Replace ``dest`` with exactly the context's files (modes and mtimes fixed), atomically."""
    dest.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{dest.name}.", dir=dest.parent))
    try:
        for rel, f in ctx.files.items():
            p = tmp / rel
            p.parent.mkdir(parents=True, exist_ok=True)
            if f.link is not None:
                p.symlink_to(f.link)  # unpack_tar let only links that stay inside the tree through
                continue
            p.write_bytes(f.data)
            p.chmod(f.mode)
        for p in sorted(tmp.rglob("*"), reverse=True):
            os.utime(p, (epoch, epoch), follow_symlinks=False)
        old = dest.with_name(f".{dest.name}.old")
        if dest.exists():
            shutil.rmtree(old, ignore_errors=True)
            dest.rename(old)
        tmp.rename(dest)
        shutil.rmtree(old, ignore_errors=True)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


def _check_labels(name: str, ctx: imagemod.Context, labels: dict[str, str]) -> None:
    wrong = {k: (v, labels.get(k)) for k, v in ctx.labels.items() if labels.get(k) != v}
    if wrong:
        detail = "; ".join(f"{k}: want {w!r}, image has {h!r}" for k, (w, h) in sorted(wrong.items()))
        raise AdapterError(f"image {name} was built but its labels are not the rendered ones: {detail}")


def build_image(
    project: Project,
    engine: Engine,
    *,
    image: str | None = None,
    deployment: str | None = None,
    push: str | None = None,
    resolver: Resolver | None = None,
    echo: Echo = print,
    sources: Sources | None = None,
    prepared: tuple[imagedef.ImageDef, imagemod.Context] | None = None,
) -> lockmod.LockedBuild:
    """Render, build (log streamed), optionally push, re-check, and record the build in the lock.

    Args:
        project: the checkout.
        engine: a connected engine (Docker or Podman's API service).
        image: images/<name> to build; default: the deployment's engine.build.
        deployment: deployment whose engine.build names the image.
        push: registry (host[:port][/path]) to push to; the image becomes REGISTRY/<name>:<inputs>.
        resolver: registry client to re-check the pushed digest (required with push).
        echo: where progress and the build log go.
        prepared: what :func:`prepare` returned for this image in this command (not rendered twice).
    """
    name = image_name(project, image=image, deployment=deployment)
    if push and resolver is None:
        raise RigsmithError("--push needs a registry client")
    definition, ctx = prepared or prepare(project, name, sources)
    epoch = definition.source_date_epoch
    dest = context_dir(project, name)
    materialize(ctx, dest, epoch)
    tag = ctx.inputs_sha256.removeprefix("sha256:")[:16]
    local = f"{LOCAL_REPO}/{name}:{tag}"
    ref, digest = f"{LOCAL_REPO}/{name}", None
    if push:
        ref = f"{push.rstrip('/')}/{name}"
        parse_ref(f"{ref}:{tag}")  # a bad --push fails before the build, not after
    if not push:
        same = _unchanged(project, engine, name, ctx, local)
        if same is not None:
            echo(
                f"build: images/{name} unchanged (inputs {ctx.inputs_sha256[:19]} as locked) and {local} = "
                f"{same.image_id} present in {engine.kind}; not rebuilt"
            )
            echo(f"lock: builds.{name} = {same.pinned_ref} (unchanged)")
            return same
    echo(f"build: images/{name} FROM {ctx.base} with {engine.kind} ({engine.url}); context {dest}")
    result = engine.build(imagemod.context_tar(ctx.files, epoch), tag=local, epoch=epoch, log=echo)
    labels = engine.inspect(local).get("Config", {}).get("Labels") or {}
    _check_labels(name, ctx, dict(labels))
    echo(f"build: {local} = {result.image_id} ({result.cached}/{result.steps} steps from cache)")

    if push:
        assert resolver is not None
        digest = _push(engine, resolver, result.image_id, f"{ref}:{tag}", echo)
        echo(f"push: {ref}:{tag} -> {ref}@{digest}")

    entry = lockmod.LockedBuild(
        ref=ref,
        image_id=result.image_id,
        digest=digest,
        base=ctx.base,
        patches=dict(ctx.patch_hashes),
        inputs_sha256=ctx.inputs_sha256,
        provides=imagemod.provided_paths(definition) or None,
    )
    kept = ""
    with lockmod.locked(project.lock_path) as lock:
        old = lock.builds.get(name)
        if digest is None and old is not None and old.digest and old.image_id == result.image_id:
            # The same image as the one pushed earlier: its registry digest still names it, and deploy
            # keeps running it by digest (a local rebuild must not turn the pin into a bare image ID).
            entry = entry.model_copy(update={"ref": old.ref, "digest": old.digest})
            kept = f" (the pushed digest of this same image {result.image_id[:19]}, kept)"
        lock.builds[name] = entry
    echo(f"lock: builds.{name} = {entry.pinned_ref}{kept}")
    return entry


def _push(engine: Engine, resolver: Resolver, image_id: str, remote: str, echo: Echo) -> str:
    """Tag and push ``image_id`` as ``remote``; the digest the registry serves for it (checked against the
    one the engine reported)."""
    engine.tag(image_id, remote)
    reported = engine.push(remote, log=echo)
    served = resolver.resolve(remote).digest
    if reported is not None and reported != served:
        raise AdapterError(
            f"push of {remote} reported {reported} but the registry serves {served}",
            hint="another push to the same tag raced this one; re-run `invoke build --push REGISTRY`",
        )
    return served


def _unchanged(
    project: Project, engine: Engine, name: str, ctx: imagemod.Context, local: str
) -> lockmod.LockedBuild | None:
    """The lock's build of ``name`` when a build now could only reproduce it, else None.

    That is: the lock records these very inputs (the inputs hash covers the base digest, the patches and
    every file of the context) and the engine still has ``local`` as that image, with the rendered labels.
    Anything else (another hash, the image gone or re-tagged, a lock without the hash) builds.
    """
    old = lockmod.read(project.lock_path).builds.get(name)
    if (
        old is None
        or old.inputs_sha256 != ctx.inputs_sha256
        or old.base != ctx.base
        or old.patches != dict(ctx.patch_hashes)
    ):
        return None
    if old.digest is None and old.ref != f"{LOCAL_REPO}/{name}":
        return None
    try:
        data = engine.inspect(local)
    except AdapterError:
        return None
    image_id = str(data.get("Id", ""))
    if not image_id.startswith("sha256:"):
        image_id = f"sha256:{image_id}"
    labels = data.get("Config", {}).get("Labels") or {}
    if image_id != old.image_id or any(labels.get(k) != v for k, v in ctx.labels.items()):
        return None
    return old
