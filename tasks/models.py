"""invoke fetch-model (and the model half of `invoke pin`, via rigsmith.modelfetch.pin_model)."""

from __future__ import annotations

from pathlib import Path

from invoke.context import Context
from invoke.tasks import task

from rigsmith.resolving import modelfetch
from tasks._common import DEFAULT_DEP, echo, project, user_errors


@task(
    name="fetch-model",
    help={
        "deployment": "deployments/NAME.yaml whose model to fetch" + DEFAULT_DEP,
        "dest": "download into DIR instead of the spec's model.local_dir",
        "verify": "hash every file again, even those verified on an earlier run",
        "repin": "resolve the spec's branch/tag again first and show what changed",
        "workers": f"files downloaded (and hashed) at once (default {modelfetch.WORKERS})",
    },
)
@user_errors
def fetch_model(
    c: Context,
    deployment: str | None = None,
    dest: str | None = None,
    verify: bool = False,
    repin: bool = False,
    workers: int = modelfetch.WORKERS,
) -> None:
    """Download the locked model revision, verify every file, apply declared config patches.

    A local checkpoint (``model.repo: null``) is not downloaded or verified: the task reports what
    model.local_dir holds (or fails when it is missing) and applies the config patches, keeping the original.
    """
    proj = project(c)
    spec = proj.load(deployment)
    report = modelfetch.fetch_model(
        proj,
        spec,
        dest=Path(dest).expanduser() if dest else None,
        verify=verify,
        repin=repin,
        echo=echo,
        workers=int(workers),
    )
    echo(report.summary())
