"""A deployment's proposed engine build, and the words that lead from a missing image to a running one.

Seed 003 runs vLLM from the recipe's checkout. That works two ways: the **built route** — the image
``import-recipe`` proposes from the notes (``images/<name>/image.yaml``: the recipe's ref and release
assets, the repository left to fill), its tree copied into the image by ``invoke build`` — and the
**checkout route** — an image the user already has, with the checkout bind-mounted where the tree goes
(the bundled deployment's ``~/src/merlin`` → ``/opt/merlin``). The spec refuses ``engine.image`` and
``engine.build`` together, and a build deployment does not render before the lock holds its build, so a
deployment that runs ``engine.image`` carries the definition named after it as its *proposed build*
(``images/<deployment>/image.yaml``, which no spec builds yet: the name the importer gives it).

Every hint about that deployment's missing image (run.sh, ``invoke build``, ``invoke next``, doctor) is
:func:`missing_image`: both routes with their exact commands, and which works without a network.
:func:`link` is the spec change ``invoke build --image NAME --deployment D`` makes once NAME is built.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import PurePosixPath

from rigsmith.errors import SpecError
from rigsmith.imageref import parse_ref
from rigsmith.project import Project
from rigsmith.resolving.image import imagedef
from rigsmith.spec import Deployment, Mount, from_data, to_data


@dataclass(frozen=True)
class Proposed:
    """The definition a deployment may switch to: ``images/<name>/image.yaml`` and what it still lacks."""

    name: str
    to_fill: tuple[str, ...]  # fields pin refuses while empty (tree.repo, tree.assets[i].url)
    provides: tuple[str, ...]  # absolute paths the image puts in (the tree's dest, copied files)
    ref: str | None  # the tree's ref (the recipe's branch or tag)
    repo: str | None  # the tree's repository, once the user filled it

    @property
    def path(self) -> str:
        return f"images/{self.name}/image.yaml"


def proposed(project: Project, spec: Deployment) -> Proposed | None:
    """The proposed build of ``spec``: ``images/<spec.name>/image.yaml`` when the spec builds nothing
    (``engine.build`` empty) and runs a container; None otherwise, or when that file does not load (then
    the hints name only the image; ``invoke build --image NAME`` says what is wrong with the file)."""
    if spec.engine.build or spec.engine.runtime != "container":
        return None
    if not (project.images / spec.name / "image.yaml").is_file():
        return None
    try:
        definition = imagedef.load(project.images, spec.name)
    except SpecError:
        return None
    tree = definition.tree
    provides = ([tree.dest_path] if tree else []) + [f.dest for f in definition.files]
    return Proposed(
        spec.name,
        tuple(f for f, _ in tree.unfilled()) if tree else (),
        tuple(provides),
        tree.ref if tree else None,
        tree.repo if tree else None,
    )


def images_of(project: Project, spec: Deployment) -> list[str]:
    """The images/<name> a deployment uses: its ``engine.build``, else its proposed build (what
    ``invoke pin --deployment D`` locks, so that ``invoke build --image NAME --deployment D`` can run)."""
    if spec.engine.build:
        return [spec.engine.build]
    found = proposed(project, spec)
    return [found.name] if found is not None and not found.to_fill else []


def unfilled(project: Project, deployment: str | None) -> list[Proposed]:
    """The proposed builds still to fill, of ``deployment`` or of every deployment (pin skips them)."""
    names = [project.resolve_name(deployment)] if deployment else project.deployment_names()
    found = (proposed(project, project.load(n)) for n in names)
    return [p for p in found if p is not None and p.to_fill]


def pinnable(project: Project) -> list[str]:
    """Every images/<name> a bare ``invoke pin`` locks: all but the proposed builds still to fill."""
    waiting = {p.name for p in unfilled(project, None)}
    return [n for n in imagedef.names(project.images) if n not in waiting]


def _under(path: str, roots: tuple[str, ...]) -> bool:
    p = PurePosixPath(path)
    return any(p == PurePosixPath(r) or PurePosixPath(r) in p.parents for r in roots)


def checkout_mounts(spec: Deployment, found: Proposed) -> list[Mount]:
    """The mounts the proposed image replaces: a bind mount at (or under) a path the image provides (the
    recipe's checkout at the tree's dest), which would hide the built tree."""
    return [m for m in spec.mounts if _under(m.container, found.provides)]


def pull_route(ref: str) -> str:
    """How an image that rigsmith does not build gets into local storage."""
    if parse_ref(ref).registry == "localhost":
        return f"`podman load -i FILE` ({ref} is a local name: no registry serves it)"
    return f"`podman pull {ref}`"


def missing_image(spec: Deployment, ref: str, found: Proposed | None) -> str:
    """What to do when ``ref``, the image ``spec`` runs, is not in local storage: the built route (the
    proposed definition: what to fill, pin, build — which also switches the spec), the checkout route (the
    image itself, loaded or pulled, with the checkout mounted), and which of them works offline."""
    if found is None:
        return f"{pull_route(ref)}, or set engine.build to an images/<name> definition and `invoke build` it"
    d = f"--deployment {spec.name}"
    fill = f"fill {', '.join(found.to_fill)} in {found.path}, then " if found.to_fill else ""
    mounts = checkout_mounts(spec, found)
    drops = f" and drops the {', '.join(m.host for m in mounts)} mount the image replaces" if mounts else ""
    checkout = f" with the recipe's checkout at {mounts[0].host}" if mounts else ""
    have = "the image and checkout are" if mounts else "the image is"
    return (
        f"build the engine from the recipe's source tree: {fill}`invoke pin {d}`, then "
        f"`invoke build --image {found.name} {d}` (it builds, then sets engine.build: {found.name} in "
        f"deployments/{spec.name}.yaml{drops}); or bring the image yourself: {pull_route(ref)}{checkout}. "
        f"Without a network only the second route works, once {have} on this host: a build clones the "
        "tree, downloads the assets and pulls the base (an earlier `invoke pin` here caches the tree and "
        "assets; the base must be in local storage)"
    )


def missing_checkout(spec: Deployment, mount: Mount, found: Proposed) -> str:
    """What to do when the checkout route's bind-mounted checkout is missing: a clone (an empty directory
    would start an engine with no tree), or the built route instead."""
    ref = f" --branch {found.ref}" if found.ref else ""
    return (
        f"clone the recipe's repository there (git clone{ref} {found.repo or 'REPO'} {mount.host}, then the "
        f"release assets {found.path} names), or build the tree into the image instead: fill {found.path}, "
        f"`invoke pin --deployment {spec.name}`, `invoke build --image {found.name} --deployment {spec.name}`"
    )


def link(spec: Deployment, name: str, provides: tuple[str, ...]) -> Deployment:
    """``spec`` running the build ``name``: ``engine.build`` set, ``engine.image`` cleared, and the mounts
    the image replaces (:func:`checkout_mounts`) dropped."""
    data = to_data(spec)
    data["engine"]["build"] = name
    data["engine"].pop("image", None)
    data["mounts"] = [m for m in data.get("mounts", []) if not _under(m["container"], provides)]
    return from_data(data, f"deployments/{spec.name}.yaml")
