"""invoke import-recipe."""

from __future__ import annotations

from invoke import task

from rigsmith import importer
from tasks._common import confirm, echo, project, user_errors


@task(
    help={
        "source": "recipe to import: an http(s) URL or a file (recipe JSON, command text or compose file)",
        "name": "deployment name, i.e. deployments/NAME.yaml (default: from the recipe id, title or model)",
        "image": "container image to run when the recipe names none (seed 003 runs vLLM from a venv)",
        "yes": "change an existing deployments/NAME.yaml without asking",
        "dry_run": "print what would be written; write nothing",
        "allow_mount": "consent to the recipe's mount of this dangerous host path (/, a home, a socket, "
        "/etc, a dot-directory…); repeatable",
    },
    iterable=["allow_mount"],
)
@user_errors
def import_recipe(c, source, name=None, image=None, yes=False, dry_run=False, allow_mount=None):
    """Import a published vLLM recipe into deployments/NAME.yaml."""
    importer.import_recipe(
        project(),
        source,
        name=name,
        image=image,
        yes=yes,
        dry_run=dry_run,
        confirm=confirm(),
        echo=echo,
        allow_mount=tuple(allow_mount or ()),
    )
