"""invoke pin, invoke build: resolve floating references and build engine images into rigsmith.lock.

The engine and registry clients (docker-py, httpx: ~0.15 s of imports) load inside the tasks that use
them; invoke imports every task module for every command, `invoke fetch-model` included.
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING

from invoke.context import Context
from invoke.tasks import task

from rigsmith.cli.wiring import confirm, echo, project, user_errors
from rigsmith.errors import RigsmithError

if TYPE_CHECKING:
    from rigsmith.resolving.image.registry import Registry


def _registry() -> Registry:
    from rigsmith.resolving.image import registry as registrymod

    return registrymod.Registry(registrymod.load_docker_config())


@task(
    help={
        "deployment": "pin only what this deployment uses (default: every deployment and image)",
        "repin": "re-resolve model branches/tags and image source trees already in the lock; show the "
        "diff and ask before writing it",
        "yes": "with --repin: write the changes without asking (no terminal and no --yes: change nothing)",
    }
)
@user_errors
def pin(c: Context, deployment: str | None = None, repin: bool = False, yes: bool = False) -> None:
    """Pin image tags, source trees and model branches (secondary models too) in rigsmith.lock.

    Each floating reference is resolved to a digest or a commit; --repin shows the lock diff and asks."""
    from rigsmith.resolving.lock import repin as repinmod

    proj = project(c)
    if not repin:
        repinmod.pin_all(proj, deployment, repin=False, echo=echo)
        return
    staged = repinmod.stage(proj)
    repinmod.pin_all(staged, deployment, repin=True, echo=echo)
    repinmod.adopt(proj, staged, yes=yes, confirm=confirm(), echo=echo)


@task(
    help={
        "deployment": "build the image this deployment's engine.build names (default: the default "
        "deployment's — RIGSMITH_DEPLOYMENT, invoke.yaml's rigsmith.deployment — else every image a "
        "deployment builds)",
        "image": "images/NAME to build; with --deployment D, D then runs it (engine.build: NAME, the "
        "mounts the image replaces dropped)",
        "engine": "podman | docker (default: DOCKER_HOST, CONTAINER_HOST, then the podman/docker sockets)",
        "push": "registry to push to, e.g. 127.0.0.1:5000; the lock then holds REGISTRY/NAME@sha256:…",
    }
)
@user_errors
def build(
    c: Context,
    deployment: str | None = None,
    image: str | None = None,
    engine: str | None = None,
    push: str | None = None,
) -> None:
    """Render the Dockerfile, build it, record image ID (and pushed digest) in rigsmith.lock."""
    from rigsmith.resolving.image import build as buildmod
    from rigsmith.resolving.image import engine as enginemod

    if engine is not None and engine not in enginemod.ENGINES:
        raise RigsmithError(f"--engine {engine!r} is not supported", hint="use --engine podman or docker")
    proj = project(c)
    names = buildmod.images_to_build(proj, image=image, deployment=deployment)
    switching = buildmod.switch(proj, image=image, deployment=deployment)  # the spec as read before the build
    # Every definition renders (files, base pin) before any engine is touched, once.
    prepared = {name: buildmod.prepare(proj, name) for name in names}
    eng = enginemod.connect(engine, os.environ)
    reg = _registry() if push else None  # only a push asks a registry (and a client costs a TLS setup)
    try:
        for name in names:
            entry = buildmod.build_image(
                proj, eng, image=name, push=push, resolver=reg, echo=echo, prepared=prepared[name]
            )
        if switching is not None:
            switching.finish(entry, proj.root, echo)
    finally:
        if reg is not None:
            reg.close()
        eng.close()
