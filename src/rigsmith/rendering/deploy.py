"""``invoke deploy``: render one target's artifacts from spec + lock and hand them to the writer."""

from __future__ import annotations

import difflib
import shlex
from collections.abc import Callable
from pathlib import Path
from typing import Literal, TypedDict, Unpack

from rigsmith import writer
from rigsmith.errors import RigsmithError
from rigsmith.imageref import parse_ref
from rigsmith.project import TARGETS, Project
from rigsmith.rendering import plan as planmod
from rigsmith.rendering import validate
from rigsmith.rendering.nextsteps import next_steps
from rigsmith.rendering.targets import LxcOptions, RenderContext, find
from rigsmith.resolving.image import engineroute
from rigsmith.resolving.lock import lock as lockmod
from rigsmith.resolving.lock import lockhistory
from rigsmith.spec import Deployment


def _read(path: Path) -> str | None:
    try:
        return path.read_text(encoding="utf-8")
    except FileNotFoundError:
        return None
    except (OSError, UnicodeDecodeError) as err:
        raise RigsmithError(f"cannot read {path}: {err}", hint="check the path and its permissions") from None


class RenderOptions(TypedDict, total=False):
    """What ``invoke deploy`` may say about the rendering; every key optional (the spec decides the rest)."""

    deployment: str | None  # the spec's name (default: the project's only or default deployment)
    image: str | None  # an image reference overriding the spec's and the lock's
    out: Path | None  # where the target's directory goes (default: the checkout)
    memlock: Literal["unlimited", "host"] | int | None
    podman_version: str | None  # the target host's podman (default: spec.podman_version)
    lxc: LxcOptions | None  # Proxmox CT options (lxc target)
    home: str | None  # what the spec's ~/ means (default: the invoking user's home, rigsmith.userhome)


def artifacts(
    project: Project,
    target: str,
    *,
    read: Callable[[Path], str | None] = _read,
    warn: Callable[[str], None] = lambda _msg: None,
    **options: Unpack[RenderOptions],
) -> tuple[planmod.RunPlan, list[writer.Artifact]]:
    """Plan and render without writing (``read`` fetches a file a target merges into, e.g. a pct.conf)."""
    deployment, image, out = options.get("deployment"), options.get("image"), options.get("out")
    memlock, lxc = options.get("memlock"), options.get("lxc")
    if target not in TARGETS:
        raise RigsmithError(f"unknown target {target!r}", hint=f"use one of: {', '.join(TARGETS)}")
    found = find(target)
    if found is None:
        raise RigsmithError(f"target {target!r} is not implemented yet", hint="use --target podman")
    name = project.resolve_name(deployment)
    spec = project.load(name)
    if image == spec.engine.image:  # the spec says so already (deploy --image keeps it): no override
        image = None
    spec_rel = f"deployments/{name}.yaml"
    argv = ["invoke", "deploy", "--target", target, "--deployment", name]
    if image:
        argv += ["--image", image]
    image_hint, dir_hints = _route_hints(spec, None if image else engineroute.proposed(project, spec))
    ctx = RenderContext(
        spec=spec,
        out=(out or project.root).resolve(),
        command=shlex.join(argv),
        podman_version=options.get("podman_version") or spec.podman_version,
        lxc=lxc or LxcOptions(),
        read=read,
        warn=warn,
        image_hint=image_hint,
        dir_hints=dir_hints,
    )
    lock = lockmod.read(project.lock_path)
    validate.refuse(
        spec_rel, validate.problems(spec, lock, target, ctx, spec_path=spec_rel, image=image, memlock=memlock)
    )
    plan = planmod.make(
        spec,
        lock,
        spec_path=spec_rel,
        image=image,
        memlock=memlock,
        home=options.get("home"),
        lock_entry=lock_entry(project.lock_path, spec, lock, image),
    )
    if spec.cluster is not None:
        from rigsmith.rendering.targets import nodes  # a one-host deploy loads no other target (test_startup)

        rendered = nodes.render(target, found[0], spec, plan, ctx)
    else:
        rendered = found[0](plan, ctx)
    plan.check_env_paths()
    return plan, rendered


def _route_hints(spec: Deployment, found: engineroute.Proposed | None) -> tuple[str | None, dict[str, str]]:
    """run.sh's hints for a deployment with a proposed build: the routes to its image, and a clone (not a
    mkdir) for the checkout the image would replace (by container path). None and {}: the generic ones."""
    if found is None:
        return None, {}
    hints = {
        m.container: engineroute.missing_checkout(spec, m, found)
        for m in engineroute.checkout_mounts(spec, found)
    }
    return engineroute.missing_image(spec, spec.engine.image or "", found), hints


def _show_merge(source: Path, merged: writer.Artifact, echo: Callable[[str], None]) -> None:
    """The diff from the user's pct.conf to the merged copy (the input itself is never written)."""
    before = (_read(source) or "").splitlines(keepends=True)
    diff = "".join(
        difflib.unified_diff(before, merged.content.splitlines(keepends=True), str(source), str(merged.path))
    )
    echo(f"merged {source} (unchanged) into {merged.path}:\n{diff or '  (no change)'}")


def image_line(image: str, pinned: bool) -> str:
    """Which image the artifacts run, and how firmly the lock pins it."""
    if pinned and image.startswith("sha256:"):
        return (
            f"image: {image} (the local build's image ID from rigsmith.lock; no registry digest, so only "
            "this host's storage has it: `invoke build --push REGISTRY` for other hosts)"
        )
    if pinned:
        return f"image: {image} (registry digest from rigsmith.lock)"
    if parse_ref(image).registry == "localhost":
        # `invoke pin` skips a name no registry serves, and `invoke build` builds only engine.build.
        return (
            f"warning: image {image} is a local name no registry serves: nothing pins it by digest (run.sh "
            "checks only that it is in local storage); an engine.build image is pinned by its build"
        )
    return f"warning: image {image} is not pinned by digest; `invoke pin` or `invoke build` locks it"


def deploy(
    project: Project,
    target: str,
    *,
    yes: bool = False,
    check: bool = False,
    confirm: Callable[[str], bool] | None = None,
    echo: Callable[[str], None] = print,
    **options: Unpack[RenderOptions],
) -> list[writer.Outcome]:
    """Render and write (or ``check``) one target."""
    plan, files = artifacts(project, target, warn=echo, **options)
    deployment, out, lxc = options.get("deployment"), options.get("out"), options.get("lxc")
    if lxc is not None and lxc.config is not None and not check:
        _show_merge(lxc.config, files[0], echo)
    if plan.runtime == "container":
        echo(image_line(plan.image, plan.image_pinned))
    outcomes = writer.write(
        files, yes=yes, check=check, confirm=confirm, echo=echo, root=(out or project.root).resolve()
    )
    if not check:
        spec = project.load(project.resolve_name(deployment))
        if spec.cluster is not None:
            from rigsmith.rendering.targets import nodes  # as in artifacts

            steps = nodes.next_steps(target, spec, plan, out)
        else:
            steps = next_steps(target, plan, out)
        for line in steps:
            echo(line)
    return outcomes


#: How many recent history entries :func:`lock_entry` reads at most.
HISTORY_LOOKBACK = 200


def lock_entry(lock_path: Path, spec: Deployment, lock: lockmod.Lock, image: str | None) -> int | None:
    """The history entry the deployment's pins came in with: of the newest entries whose pins for ``spec``
    are what ``lock`` pins, the oldest (so another deployment's later repin does not move it). None when
    the history does not hold them, or cannot be read (the label is then left out; ``lock --history``
    names what is wrong)."""
    try:
        want = planmod.lock_digest(spec, lock, planmod.resolve_image(spec, lock, image)[0])
        found = None
        for e in reversed(lockhistory.entries(lock_path)[-HISTORY_LOOKBACK:]):
            old = lockmod.parse(e.text(lock_path), f"lock history entry {e.n}", hint="")
            try:
                same = planmod.lock_digest(spec, old, planmod.resolve_image(spec, old, image)[0]) == want
            except RigsmithError:
                same = False
            if same:
                found = e.n
            elif found is not None:
                break
        return found
    except RigsmithError:
        return None
