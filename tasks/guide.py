"""invoke next: where a deployment stands and the command for the next step. Wiring only."""

from __future__ import annotations

import os

from invoke.context import Context
from invoke.tasks import task

from tasks._common import DEFAULT_DEP, echo, project, user_errors


@task(
    name="next",
    help={
        "deployment": "deployments/NAME.yaml to look at" + DEFAULT_DEP,
        "target": "podman | quadlet | compose | lxc | kube: the artifacts the deploy stage looks for",
    },
)
@user_errors
def next_step(c: Context, deployment: str | None = None, target: str = "podman") -> None:
    """Show where the deployment stands (imported to qualified) and the command for the next step."""
    from rigsmith.errors import RigsmithError
    from rigsmith.operating.host import LocalHost
    from rigsmith.operating.lifecycle import nextcommand as nextstep
    from rigsmith.project import TARGETS

    if target not in TARGETS:
        raise RigsmithError(f"unknown target {target!r}", hint=f"use one of: {', '.join(TARGETS)}")
    p = project(c)
    name = p.resolve_name(deployment)
    found = nextstep.stages(p, name, target, LocalHost(dict(os.environ)))
    echo(f"{name}:")
    for line in nextstep.report(found):
        echo(line)
