"""invoke bundle, invoke unbundle: carry one deployment to a machine without internet, verified.

rigsmith.operating.bundle (rich, the targets) loads inside the tasks: invoke imports every task module for
every command.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

from invoke.context import Context
from invoke.tasks import task

from rigsmith.cli.flags import DEPLOYMENT, MEMLOCK, helps, target
from rigsmith.cli.wiring import confirm, echo, project, user_errors


def _stderr(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


@task(
    optional=["tar"],
    help={
        **helps(DEPLOYMENT),
        "out": "bundle directory (created; on the model's filesystem the model files are hard-linked)",
        "tar": "also write the bundle as one tar: --tar alone writes OUT.tar; --tar FILE; --tar - streams it "
        "to stdout",
        "targets": "comma-separated targets whose rendered artifacts go in (default: podman)",
    },
)
@user_errors
def bundle(
    c: Context,
    out: str,
    deployment: str | None = None,
    tar: str | bool | None = None,
    targets: str = "podman",
) -> None:
    """Bundle spec, lock, models (secondary too), image (digest kept), source tree and artifacts, offline."""
    from rigsmith.operating.bundle import bundle as bundlemod
    from rigsmith.operating.bundle.manifest import Io

    dest = Path(out).expanduser()
    say = _stderr if tar == "-" else echo  # stdout carries the tar stream
    tar_path = None
    if tar is True:
        tar_path = dest.with_name(dest.name + ".tar")
    elif isinstance(tar, str) and tar:
        tar_path = Path(tar) if tar == "-" else Path(tar).expanduser()
    names = [target("--targets", t.strip()) for t in targets.split(",") if t.strip()]
    report = bundlemod.bundle(project(c), deployment, dest, targets=names, tar=tar_path, io=Io(echo=say))
    say(report.summary())


@task(
    help={
        "path": "the bundle directory (or its tar file)",
        "into": "put the model in DIR instead of the spec's model.local_dir (the spec is updated to match)",
        "yes": "replace a different spec or artifact already in this checkout without asking",
        "prove_offline": "then start the deployment in a network namespace with no route out (as `up "
        "--offline`), wait for its gates from inside, name any host:port it tried to reach, and stop it",
        "memlock": "with --prove-offline: " + MEMLOCK.help,
    }
)
@user_errors
def unbundle(
    c: Context,
    path: str,
    into: str | None = None,
    yes: bool = False,
    prove_offline: bool = False,
    memlock: str | None = None,
) -> None:
    """Verify a bundle, then place spec, lock, image, source tree and models (no Hub, no registry)."""
    os.environ["HF_HUB_OFFLINE"] = "1"
    from rigsmith.operating.bundle import unbundle as unbundlemod
    from rigsmith.operating.bundle.manifest import Io

    report = unbundlemod.unbundle(
        project(c),
        Path(path).expanduser(),
        into=Path(into).expanduser() if into else None,
        yes=yes,
        confirm=confirm(),
        io=Io(echo=echo),
    )
    echo(report.summary())
    if prove_offline:
        from rigsmith.operating.bundle import offline
        from rigsmith.operating.lifecycle import lifecycle

        ops = lifecycle.Ops(project(c), env=dict(os.environ), echo=echo)
        proof = offline.up_offline(
            ops, deployment=report.deployment, memlock=MEMLOCK.value(memlock), yes=yes, confirm=confirm(),
            keep_running=False,
        )  # fmt: skip
        echo(proof.summary())
