"""``invoke deploy``: render one target's artifacts from spec + lock and hand them to the writer."""

from __future__ import annotations

import shlex
from collections.abc import Callable
from pathlib import Path
from typing import Literal

from rigsmith import lock as lockmod
from rigsmith import plan as planmod
from rigsmith import writer
from rigsmith.errors import RigsmithError
from rigsmith.project import TARGETS, Project
from rigsmith.targets import RenderContext, renderers


def artifacts(
    project: Project,
    target: str,
    *,
    deployment: str | None = None,
    image: str | None = None,
    out: Path | None = None,
    memlock: Literal["unlimited", "host"] | int | None = None,
    podman_version: str | None = None,
) -> tuple[planmod.RunPlan, list[writer.Artifact]]:
    """Plan and render without writing."""
    if target not in TARGETS:
        raise RigsmithError(f"unknown target {target!r}", hint=f"use one of: {', '.join(TARGETS)}")
    table = renderers()
    if target not in table:
        raise RigsmithError(f"target {target!r} is not implemented yet", hint="use --target podman")
    name = project.resolve_name(deployment)
    spec = project.load(name)
    spec_rel = f"deployments/{name}.yaml"
    plan = planmod.make(
        spec, lockmod.read(project.lock_path), spec_path=spec_rel, image=image, memlock=memlock
    )
    argv = ["invoke", "deploy", "--target", target, "--deployment", name]
    if image:
        argv += ["--image", image]
    ctx = RenderContext(
        spec=spec,
        out=(out or project.root).resolve(),
        command=shlex.join(argv),
        podman_version=podman_version or spec.podman_version,
    )
    return plan, table[target](plan, ctx)


def deploy(
    project: Project,
    target: str,
    *,
    deployment: str | None = None,
    image: str | None = None,
    out: Path | None = None,
    yes: bool = False,
    check: bool = False,
    confirm: Callable[[str], bool] | None = None,
    echo: Callable[[str], None] = print,
    memlock: Literal["unlimited", "host"] | int | None = None,
    podman_version: str | None = None,
) -> list[writer.Outcome]:
    """Render and write (or ``check``) one target."""
    plan, files = artifacts(
        project,
        target,
        deployment=deployment,
        image=image,
        out=out,
        memlock=memlock,
        podman_version=podman_version,
    )
    if not plan.image_pinned:
        echo(f"warning: image {plan.image} is not pinned by digest; `invoke pin` or `invoke build` locks it")
    return writer.write(
        files, yes=yes, check=check, confirm=confirm, echo=echo, root=(out or project.root).resolve()
    )
