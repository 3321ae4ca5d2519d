"""Pin and fetch a deployment's secondary Hub models (draft, tokenizer, LoRA) beside its main model: each
repo once, by the same :func:`modelfetch.pin_model` / :func:`modelfetch.fetch_model` as the main model, on
a copy of the spec whose ``model`` is that repo at its placement (``rigsmith.secondary``), its lock entry
in ``secondary[NAME][REPO]``.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

from rigsmith.project import Project
from rigsmith.resolving.lock import lock as lockmod
from rigsmith.resolving.model import modelfetch
from rigsmith.resolving.model.modelfiles import FetchReport
from rigsmith.secondary import placements, view
from rigsmith.spec import Deployment

if TYPE_CHECKING:
    from rigsmith.resolving.model.hub import Hub


def _drop_unused(project: Project, spec: Deployment, echo: modelfetch.Echo) -> None:
    """Remove lock entries of secondary repos the spec no longer names."""
    keep = {p.repo for p in placements(spec)}
    if not set(lockmod.read(project.lock_path).secondary.get(spec.name, {})) - keep:
        return
    with lockmod.locked(project.lock_path) as lock:
        table = lock.secondary.get(spec.name, {})
        for repo in sorted(set(table) - keep):
            del table[repo]
            echo(f"{spec.name}: dropped the lock's secondary model {repo} (the spec no longer names it)")
        if not table:
            lock.secondary.pop(spec.name, None)


def pin_models(
    project: Project,
    spec: Deployment,
    *,
    repin: bool = False,
    echo: modelfetch.Echo = print,
    hub: Hub | modelfetch.HubFactory | None = None,
) -> None:
    """Pin the main model, then every secondary repo (commit + each file's hashes) into the lock."""
    get_hub = modelfetch._lazy(hub)
    modelfetch.pin_model(project, spec, repin=repin, echo=echo, hub=get_hub)
    for p in placements(spec):
        slot = lockmod.Slot(spec.name, p.repo)
        modelfetch.pin_model(project, view(spec, p), repin=repin, echo=echo, hub=get_hub, slot=slot)
    _drop_unused(project, spec, echo)


def fetch_models(project: Project, spec: Deployment, *, dest: Path | None = None, **kw: Any) -> FetchReport:
    """Fetch (and verify) the main model (into ``dest`` when given), then every secondary repo into its own
    directory; the other keywords go to every :func:`modelfetch.fetch_model`."""
    kw["hub"] = modelfetch._lazy(kw.get("hub"))
    report = modelfetch.fetch_model(project, spec, dest=dest, **kw)
    for p in placements(spec):
        slot = lockmod.Slot(spec.name, p.repo)
        report.secondary.append(
            (p.repo, modelfetch.fetch_model(project, view(spec, p), slot=slot, where=p.field, **kw))
        )
    _drop_unused(project, spec, kw.get("echo", print))
    return report
