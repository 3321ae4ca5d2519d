"""Flags of ``deploy`` / ``up`` that shape the artifacts, kept in the spec so every later command agrees.

``--memlock host`` rendered a run.sh without ``--ulimit memlock``; ``invoke next``, ``deploy --check``,
``status`` and the next ``up`` render from the spec alone, so they saw a different run.sh ("the files differ
from what the spec renders"), re-rendered the refused ``--ulimit`` and the next start failed again. The
value given is written into ``resources.memlock`` instead (the flag is the user's explicit choice, as
``fit --apply N`` is: the consent), merged three-way into the file as it is now.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Literal

from rigsmith import spec as specmod
from rigsmith import writer
from rigsmith.importing.importer import merge_user_change
from rigsmith.project import Project

Memlock = Literal["unlimited", "host"] | int


def keep_memlock(
    project: Project, deployment: str | None, memlock: Memlock | None, echo: Callable[[str], None]
) -> None:
    """Write ``memlock`` (``--memlock``) into the spec's ``resources.memlock`` unless it says so already."""
    if memlock is None:
        return
    name = project.resolve_name(deployment)
    path = project.spec_path(name)
    read = path.read_text(encoding="utf-8")
    spec = specmod.loads(read, str(path))
    if spec.resources.memlock == memlock:
        return
    resources = spec.resources.model_copy(update={"memlock": memlock})
    new = merge_user_change(path, read, spec.model_copy(update={"resources": resources}))
    writer.write([writer.Artifact(path, specmod.dump(new))], yes=True, echo=echo, root=project.root)
    echo(
        f"resources.memlock: {memlock} written into deployments/{name}.yaml (--memlock), so every later "
        "command renders the same"
    )
