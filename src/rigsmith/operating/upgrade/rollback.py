"""``invoke rollback [--to N]``: put a recorded lock back, with its model files, artifacts and image, and
restart the deployment on it.

Check first, act after: the recorded lock's image must be in local storage and every model file it pins
must be in the model dir at its pinned size or in the kept snapshot (``lastgood``); anything missing is
named and nothing changes. Then: stop the running deployment, link the kept model files back, write the
recorded lock into rigsmith.lock (a new history entry, reason "rollback to N"), verify the model files
against it (fetch-model's verification: no download when they match), and ``up`` (which re-renders the
target's artifacts from spec + lock and verifies the container).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from rigsmith.errors import LockError, PreflightError
from rigsmith.operating.host import image_facts
from rigsmith.operating.lifecycle import lifecycle
from rigsmith.operating.upgrade import lastgood
from rigsmith.rendering import plan as planmod
from rigsmith.resolving.lock import lock as lockmod
from rigsmith.resolving.lock import lockdiff, lockhistory
from rigsmith.resolving.model import secondaryfetch
from rigsmith.spec import Deployment

Memlock = Literal["unlimited", "host"] | int | None


def default_target(lock_path: Path) -> int:
    """What a bare rollback returns to: the last-known-good the running upgrade kept, else the newest
    earlier entry that ran (``lockhistory.rollback_target``)."""
    e = lockhistory.rollback_target(lock_path)
    if e is None:
        raise PreflightError(
            "rigsmith.lock has no earlier recorded lock to roll back to",
            hint="`invoke lock --history` lists the recorded locks; `invoke rollback --to N` picks one",
        )
    return e.n


@dataclass(frozen=True)
class Target:
    """A recorded lock checked for a rollback: its number, the lock, the image it runs, the model slots."""

    n: int
    lock: lockmod.Lock
    image: str
    slots: list[lastgood.Slot]


def check(
    ops: lifecycle.Ops, spec: Deployment, n: int, memlock: Memlock = None, *, others: bool = True
) -> Target:
    """Everything recorded lock ``n`` needs on this host, or PreflightError naming what is missing (and,
    with ``others``, the newest other entry whose needs are all met)."""
    target = lockdiff.recorded(ops.project.lock_path, n)
    plan = planmod.make(spec, target, spec_path=f"deployments/{spec.name}.yaml", memlock=memlock)
    problems = []
    if plan.runtime == "container":
        img = image_facts(ops.host, plan.image, plan.image_pinned)
        if not img.present:
            problems.append(
                f"image {plan.image} is not in local storage" + (f" ({img.error})" if img.error else "")
            )
    slots = lastgood.slots(spec, target)
    problems += [f"model file {m} is neither in the model dir nor kept" for m in lastgood.missing(slots)]
    if problems:
        instead = _working(ops, spec, n, memlock) if others else None
        raise PreflightError(
            f"cannot roll {spec.name} back to lock {n}; nothing was changed:\n"
            + "\n".join(f"  - {p}" for p in problems[:20])
            + (f"\n  - and {len(problems) - 20} more" if len(problems) > 20 else ""),
            hint=(
                f"lock {instead} has everything it needs here: `invoke rollback --to {instead}`; or "
                if instead is not None
                else ""
            )
            + "load or rebuild the image (`podman load`, `invoke build`) and fetch the files "
            f"(`invoke lock --diff {n}` shows what lock {n} pins)",
        )
    return Target(n, target, plan.image, slots)


#: How many other entries a refused rollback looks at for one that would work (newest first).
OTHERS_TRIED = 8


def _working(ops: lifecycle.Ops, spec: Deployment, refused: int, memlock: Memlock) -> int | None:
    """The newest recorded lock other than ``refused`` and the current one whose image and model files are
    all here (what a refusal can name instead), or None."""
    path = ops.project.lock_path
    now = lockhistory.sha256(path.read_text(encoding="utf-8")) if path.exists() else None
    seen = {now}
    tried = 0
    for e in reversed(lockhistory.entries(path)):
        if e.n == refused or e.sha256 in seen or tried >= OTHERS_TRIED:
            continue
        seen.add(e.sha256)
        tried += 1
        try:
            check(ops, spec, e.n, memlock, others=False)
        except (PreflightError, LockError):
            continue
        return e.n
    return None


def restore(
    ops: lifecycle.Ops,
    spec: Deployment,
    target: Target,
    *,
    reason: str,
    memlock: Memlock = None,
) -> None:
    """Stop the deployment, put lock ``target.n`` back with its model files, start it again."""
    path = ops.project.lock_path
    lines = lockdiff.diff(lockmod.read(path), target.lock)
    ops.echo(
        f"rollback {spec.name} to lock {target.n}: " + ("; ".join(lines) if lines else "same pinned facts")
    )
    lifecycle.down(ops, deployment=spec.name)
    # The lock being left is kept too (a later rollback can return to it), then the dir is made to hold
    # exactly the target's files: files only the left lock pins go (still in its kept snapshot).
    current = lastgood.slots(spec, lockmod.read(path))
    lastgood.keep(current)
    restored = lastgood.restore(target.slots)
    dropped = lastgood.drop_unpinned(current, target.slots)
    with lockhistory.because(lockhistory.current_cause()[0], reason), lockmod.locked(path) as lock:
        for name in lockmod.Lock.model_fields:
            setattr(lock, name, getattr(target.lock, name))
    ops.echo(
        f"rollback: rigsmith.lock is lock {target.n} again; {restored} kept model file(s) linked back, "
        f"{len(dropped)} file(s) only the left lock pins set aside"
    )
    # fetch-model's own verification vouches for the linked-back files (a changed one is hashed again; a
    # file that does not match would be downloaded, which an offline host refuses by name).
    secondaryfetch.fetch_models(ops.project, spec, echo=ops.echo, confirm=None)
    lifecycle.up(ops, deployment=spec.name, memlock=memlock, yes=True)


def rollback(
    ops: lifecycle.Ops,
    *,
    deployment: str | None = None,
    to: int | None = None,
    memlock: Memlock = None,
) -> int:
    """``invoke rollback``: back to lock ``to`` (default: the last-known-good the running upgrade kept, else
    the newest earlier entry that ran)."""
    spec = ops.project.load(deployment)
    n = to if to is not None else default_target(ops.project.lock_path)
    target = check(ops, spec, n, memlock)
    restore(ops, spec, target, reason=f"rollback to lock {n}", memlock=memlock)
    return n
