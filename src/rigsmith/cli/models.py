"""invoke fetch-model (and the model half of `invoke pin`, via resolving.model.modelfetch.pin_model)."""

# rigsmith's areas load inside the tasks: importing them here costs every command ~1 s (cli/__init__.py).

from __future__ import annotations

from pathlib import Path

from invoke.context import Context
from invoke.exceptions import Exit
from invoke.tasks import task

from rigsmith.cli.flags import DEPLOYMENT, helps
from rigsmith.cli.wiring import confirm, echo, project, user_errors

#: rigsmith.resolving.model.modelfetch.WORKERS, spelled out so that importing the CLI does not load modelfetch
#: (tests/test_startup.py checks the two agree).
WORKERS = 8


@task(
    name="fetch-model",
    help={
        **helps(DEPLOYMENT),
        "dest": "download into DIR instead of the spec's model.local_dir",
        "verify": "hash every file again, even those verified on an earlier run",
        "repin": "resolve the spec's branch/tag again first and show what changed",
        "workers": f"files downloaded (and hashed) at once (default {WORKERS})",
        "adopt-dir": "fetch into a non-empty directory that does not hold this model yet "
        "(files not in the snapshot are never touched)",
        "overwrite-edited": "replace a patched config file that was edited by hand since the last fetch",
    },
)
@user_errors
def fetch_model(
    c: Context,
    deployment: str | None = None,
    dest: str | None = None,
    verify: bool = False,
    repin: bool = False,
    workers: str = str(WORKERS),
    adopt_dir: bool = False,
    overwrite_edited: bool = False,
) -> None:
    """Download the locked model revision, verify every file and apply the declared config patches.

    Then the same for each secondary Hub model (draft, tokenizer, LoRA adapter), each into its own directory.

    A local checkpoint (``model.repo: null``) is not downloaded or verified: the task reports what
    model.local_dir holds (or fails when it is missing) and applies the config patches, keeping the original.
    """
    from rigsmith.resolving.model import download, secondaryfetch
    from rigsmith.resolving.model.modelfiles import parse_workers

    n = parse_workers(workers)
    proj = project(c)
    where = Path(dest).expanduser() if dest else None
    spec = proj.load(deployment)
    try:
        report = secondaryfetch.fetch_models(
            proj,
            spec,
            dest=where,
            echo=echo,
            workers=n,
            confirm=confirm(),
            verify=verify,
            repin=repin,
            adopt_dir=adopt_dir,
            overwrite_edited=overwrite_edited,
        )
    except download.FetchInterrupted as err:
        raise Exit(f"interrupted: {err}", code=130) from None
    echo(report.summary())
