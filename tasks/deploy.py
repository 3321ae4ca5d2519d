"""invoke deploy."""

from __future__ import annotations

from pathlib import Path

from invoke import task

from rigsmith import deploy as deploymod
from tasks._common import confirm, echo, project, user_errors


def _memlock(value: str | None) -> int | str | None:
    if value is None:
        return None
    if value in ("unlimited", "-1", "host"):
        return "host" if value == "host" else "unlimited"
    return int(value)


@task(
    help={
        "target": "podman | quadlet | compose | lxc | kube",
        "deployment": "deployments/NAME.yaml to render (optional when there is only one)",
        "image": "container image reference, overriding the spec and the lock",
        "out": "write under DIR/<target>/… instead of the checkout",
        "yes": "change existing files without asking",
        "check": "write nothing; fail if the files on disk differ from what would be rendered",
        "memlock": "override memlock: unlimited, bytes, or host (set none; hosts that cannot raise it)",
        "podman_version": "target host's podman version (quadlet keys depend on it)",
    }
)
@user_errors
def deploy(
    c,
    target,
    deployment=None,
    image=None,
    out=None,
    yes=False,
    check=False,
    memlock=None,
    podman_version=None,
):
    """Render run artifacts for one target from the spec and the lock."""
    deploymod.deploy(
        project(),
        target,
        deployment=deployment,
        image=image,
        out=Path(out) if out else None,
        yes=yes,
        check=check,
        confirm=confirm(),
        echo=echo,
        memlock=_memlock(memlock),  # type: ignore[arg-type]
        podman_version=podman_version,
    )


@task(help={"check": "write nothing; fail if the committed schema is stale"})
@user_errors
def schema(c, check=False):
    """Write schema/{deployment,image}.schema.json (JSON Schemas of the spec files, for editors)."""
    import json

    from rigsmith import image, spec, writer

    root = project().root
    schemas = {"deployment": spec.json_schema(), "image": image.schema()}
    writer.write(
        [
            writer.Artifact(root / f"schema/{n}.schema.json", json.dumps(s, indent=2, sort_keys=True) + "\n")
            for n, s in schemas.items()
        ],
        yes=True,
        check=check,
        echo=echo,
        root=root,
    )
