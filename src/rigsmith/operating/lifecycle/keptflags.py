"""Flags of ``deploy`` / ``up`` that shape the artifacts, kept in the spec so every later command agrees.

``--memlock host`` rendered a run.sh without ``--ulimit memlock``; ``invoke next``, ``deploy --check``,
``status`` and the next ``up`` render from the spec alone, so they saw a different run.sh ("the files differ
from what the spec renders"), re-rendered the refused ``--ulimit`` and the next start failed again. Likewise
``--image REF`` on a spec with no image: the run.sh named REF, while doctor and ``next`` still said "no
image". The value given is written into the spec instead (``resources.memlock``, ``engine.image``): the flag
is the user's explicit choice, as ``fit --apply N`` is (the consent), merged three-way into the file as it
is now. A spec whose image is built (``engine.build``) keeps it: ``--image`` then stays a one-off override.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Literal

from rigsmith import spec as specmod
from rigsmith import writer
from rigsmith.errors import RigsmithError
from rigsmith.imageref import image_problem
from rigsmith.importing.importer import merge_user_change
from rigsmith.project import Project

Memlock = Literal["unlimited", "host"] | int


def keep_flags(
    project: Project,
    deployment: str | None,
    echo: Callable[[str], None],
    *,
    memlock: Memlock | None = None,
    image: str | None = None,
) -> None:
    """Write ``--memlock`` into ``resources.memlock`` and ``--image`` into ``engine.image`` (unless the
    image is built) where the spec does not say so already."""
    if memlock is None and image is None:
        return
    name = project.resolve_name(deployment)
    path = project.spec_path(name)
    read = path.read_text(encoding="utf-8")
    spec = specmod.loads(read, str(path))
    update: dict[str, object] = {}
    kept: list[str] = []
    if memlock is not None and spec.resources.memlock != memlock:
        update["resources"] = spec.resources.model_copy(update={"memlock": memlock})
        kept.append(f"resources.memlock: {memlock} (--memlock)")
    if image is not None and spec.engine.build is None and spec.engine.image != image:
        if why := image_problem(image):
            raise RigsmithError(f"--image: {why}", hint="give a reference such as registry/name:tag")
        update["engine"] = spec.engine.model_copy(update={"image": image})
        kept.append(f"engine.image: {image} (--image)")
    if not update:
        return
    text = specmod.dump(merge_user_change(path, read, spec.model_copy(update=update)))
    specmod.loads(text, str(path))  # model_copy does not validate: what is written must load
    writer.write([writer.Artifact(path, text)], yes=True, echo=echo, root=project.root)
    echo(f"{'; '.join(kept)} written into deployments/{name}.yaml, so every later command renders the same")
