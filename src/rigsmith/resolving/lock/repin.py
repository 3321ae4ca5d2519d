"""``pin --repin`` with consent: resolve into a staged copy of the lock, show the diff, then write or not.

The staged lock (``.rigsmith/locks/staged.lock``) is a full copy every pin step reads and writes instead of
rigsmith.lock (a :class:`StagedProject` is the same checkout with another ``lock_path``). Nothing reaches
rigsmith.lock until the user (or ``--yes``) accepts; without a terminal and without ``--yes`` the command
fails and rigsmith.lock stays byte for byte as it was.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from rigsmith.errors import ConsentError, RigsmithError
from rigsmith.project import Project
from rigsmith.resolving.image import build as buildmod
from rigsmith.resolving.image import engineroute
from rigsmith.resolving.image import registry as registrymod
from rigsmith.resolving.image import sources as sourcesmod
from rigsmith.resolving.lock import lock as lockmod
from rigsmith.resolving.lock import lockdiff, lockhistory
from rigsmith.resolving.model.secondaryfetch import pin_models
from rigsmith.spec import Deployment
from rigsmith.writer import write_one

STAGED = lockhistory.HISTORY_DIR / "staged.lock"


@dataclass(frozen=True)
class StagedProject(Project):
    """The checkout, but its lock is the staged copy."""

    staged: Path = field(default=Path(STAGED))

    # Project's lock_path is a fixed place under root; this one is the staged copy.
    @property
    def lock_path(self) -> Path:  # type: ignore[override]
        return self.root / self.staged


def stage(project: Project) -> StagedProject:
    """A staged copy of the lock as it is now (an empty lock when there is none)."""
    staged = StagedProject(project.root, project.default, project.default_source)
    staged.lock_path.parent.mkdir(parents=True, exist_ok=True)
    write_one(staged.lock_path, lockmod.dumps(lockmod.read(project.lock_path)))
    return staged


def adopt(
    project: Project,
    staged: StagedProject,
    *,
    yes: bool,
    confirm: Callable[[str], bool] | None,
    echo: Callable[[str], None],
    reason: str | None = None,
) -> bool:
    """Show what the staged lock changes; write it into rigsmith.lock when accepted. True: written.

    Raises:
        ConsentError: there is a change, no terminal to ask and no ``--yes`` (nothing is written).
    """
    try:
        old = lockmod.read(project.lock_path)
        new = lockmod.read(staged.lock_path)
        lines = lockdiff.diff(old, new)
        if not lines:
            echo("repin: rigsmith.lock is unchanged (every pinned fact resolved to what it holds)")
            return False
        echo(f"repin: rigsmith.lock would change ({len(lines)} difference(s)):")
        for ln in lines:
            echo(f"  {ln}")
        if not yes:
            if confirm is None:
                raise ConsentError(
                    "repin: rigsmith.lock would change and there is no terminal to ask; nothing was written",
                    hint="review the changes above, then run again with --yes to accept them",
                )
            if not confirm("write these changes to rigsmith.lock?"):
                echo("repin: declined; rigsmith.lock is unchanged")
                return False
        with (
            lockhistory.because(lockhistory.current_cause()[0], reason),
            lockmod.locked(project.lock_path) as lock,
        ):
            for name in lockmod.Lock.model_fields:
                setattr(lock, name, getattr(new, name))
        echo(f"repin: wrote rigsmith.lock (history entry {lockhistory.current_number(project.lock_path)})")
        return True
    finally:
        staged.lock_path.unlink(missing_ok=True)
        Path(f"{staged.lock_path}.flock").unlink(missing_ok=True)


def _unfilled(name: str, spec: Deployment) -> RigsmithError:
    tok = spec.model_placeholder
    return RigsmithError(
        f"deployments/{name}.yaml: model.repo is the placeholder {tok} (the recipe leaves the model for you "
        "to give); there is nothing to pin until you fill it",
        hint=f"set `placeholders: {{'{tok}': OWNER/NAME}}` (the model's Hub repo id, or a checkpoint's "
        f"absolute directory) in "
        f"deployments/{name}.yaml, then run invoke pin --deployment {name}",
    )


def pin_all(project: Project, deployment: str | None, *, repin: bool, echo: Callable[[str], None]) -> None:
    """Every pin step, in order, on ``project``'s lock (a staged copy for --repin): image tags, source
    trees, then each deployment's model and secondary models."""
    # An image.yaml or a named deployment's model still to fill stops pin before any network; a proposed
    # build no spec runs yet waits.
    names = [project.resolve_name(deployment)] if deployment else project.deployment_names()
    unfilled = {n: s for n in names if (s := project.load(n)).model_placeholder}
    if deployment and unfilled:
        raise _unfilled(names[0], unfilled[names[0]])
    trees = sourcesmod.check_filled(project, deployment)
    for p in engineroute.unfilled(project, deployment):
        echo(
            f"     skip  {p.path}: fill {', '.join(p.to_fill)} first (the engine built from deployment "
            f"{p.name}'s recipe; `invoke pin --deployment {p.name}` then locks it)"
        )
    # Source trees first: they are the step that refuses most (a tree.commit the ref is not), and its
    # refusal says nothing was locked, which holds only while no other step has written the lock yet.
    src = sourcesmod.Sources(sourcesmod.cache_root())
    try:
        sourcesmod.pin_sources(project, src, trees, repin=repin, echo=echo)
    finally:
        src.close()
    reg = registrymod.Registry(registrymod.load_docker_config())
    try:
        buildmod.pin_images(project, reg, deployment=deployment, echo=echo)
    finally:
        reg.close()
    for name in names:
        if name in unfilled:
            echo(
                f"deployments/{name}.yaml: model not pinned: model.repo is the placeholder "
                f"{unfilled[name].model_placeholder}; fill it (placeholders) and pin again"
            )
            continue
        pin_models(project, project.load(name), repin=repin, echo=echo)
