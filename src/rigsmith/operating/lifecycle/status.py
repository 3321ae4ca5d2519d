"""``invoke status``: the container (and unit) state, whether it runs the current spec, the lock it carries
(``io.rigsmith.lock-sha256`` and the history entry) and /health."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from rigsmith.errors import RigsmithError
from rigsmith.operating.lifecycle.lifecycle import Ops, controller, inspect, parse_systemctl_show, rendered
from rigsmith.operating.lifecycle.verify import SPEC_LABEL
from rigsmith.rendering import plan as planmod


@dataclass(frozen=True)
class Status:
    """What status reports."""

    name: str
    state: str  # running | exited | created | absent | …
    started: str | None
    image: str | None
    spec_current: bool | None
    service: dict[str, str] | None
    healthy: bool | None
    #: the lock the container carries (``io.rigsmith.lock-sha256`` and the history entry), and whether it
    #: is what rigsmith.lock pins now (None: the container carries no lock label, or there is no plan)
    lock_sha256: str | None = None
    lock_entry: str | None = None
    lock_current: bool | None = None


def status(ops: Ops, *, deployment: str | None = None, health: Callable[[str], bool] | None = None) -> Status:
    """Container (and unit) state, whether it runs the current spec, and /health."""
    spec = ops.project.load(deployment)
    name = spec.name
    ctl = controller(ops.project, ops.target, name, ops.out)
    info = inspect(ops.run, name)
    service = None
    sargv = ctl.state()
    if sargv:
        proc = ops.run(sargv)
        service = parse_systemctl_show(proc.stdout) if proc.code == 0 else {"error": proc.stderr.strip()}
    current: bool | None = None
    labels = ((info or {}).get("Config") or {}).get("Labels") or {}
    carried = labels.get(planmod.LOCK_LABEL)
    lock_current: bool | None = None
    if info:
        try:
            plan, _files = rendered(ops, deployment, None, None)
            current = labels.get(SPEC_LABEL) == dict(plan.labels)[SPEC_LABEL]
            lock_current = None if carried is None else carried == dict(plan.labels)[planmod.LOCK_LABEL]
        except RigsmithError:
            current = None
    st = (info or {}).get("State") or {}
    healthy = None
    if st.get("Running") and health is not None:
        healthy = health(planmod.local_url(spec.network.host, spec.network.port) + spec.readiness.health_path)
    return Status(
        name,
        str(st.get("Status", "absent")) if info else "absent",
        st.get("StartedAt"),
        (info or {}).get("ImageName"),
        current,
        service,
        healthy,
        str(carried) if carried is not None else None,
        str(labels[planmod.LOCK_ENTRY_LABEL]) if planmod.LOCK_ENTRY_LABEL in labels else None,
        lock_current,
    )
