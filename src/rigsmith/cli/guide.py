"""invoke next: where a deployment stands and the command for the next step. Wiring only."""

# rigsmith's areas load inside the tasks: importing them here costs every command ~1 s (cli/__init__.py).

from __future__ import annotations

import os

from invoke.context import Context
from invoke.tasks import task

from rigsmith.cli.flags import DEPLOYMENT, TARGET, helps
from rigsmith.cli.wiring import echo, project, user_errors


@task(
    name="next",
    help=helps(DEPLOYMENT, TARGET),
)
@user_errors
def next_step(c: Context, deployment: str | None = None, target: str = "podman") -> None:
    """Show where the deployment stands (imported to qualified) and the command for the next step."""
    from rigsmith.operating.host import LocalHost
    from rigsmith.operating.lifecycle import nextcommand as nextstep

    target = TARGET.of(target)
    p = project(c)
    name = p.resolve_name(deployment)
    found = nextstep.stages(p, name, target, LocalHost(dict(os.environ)))
    echo(f"{name}:")
    for line in nextstep.report(found):
        echo(line)
