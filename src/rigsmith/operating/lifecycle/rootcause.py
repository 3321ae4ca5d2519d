"""Root cause first: when ``up`` / ``wait`` / ``logs`` / ``down`` fail, doctor's first failing blocking row
for the target leads the message, and the command's own failure follows it.

A missing NVIDIA driver makes ``run.sh`` fail on "no CDI spec provides nvidia.com/gpu=all" and makes ``wait``
see a log that ends at once; both are true and both send the user the wrong way. doctor already knows the
cause ("GPUs: no driver"), in the order of its table, so the commands ask it rather than guess. doctor runs
only after a command failed: a host that passes by other means (a fake CDI vendor, ``--memlock host``) is
never refused on doctor's word alone.
"""

from __future__ import annotations

from collections.abc import Collection
from typing import TYPE_CHECKING

from rigsmith.errors import RigsmithError, shown
from rigsmith.operating.checkrow import Check
from rigsmith.operating.doctor import doctor
from rigsmith.operating.host import Host
from rigsmith.operating.lifecycle.verify import inspect_argv, parse_inspect
from rigsmith.project import Project

if TYPE_CHECKING:
    from rigsmith.operating.probes import CmdResult

#: doctor rows whose no-go stops a deployment from starting or serving, in doctor's table order.
BLOCKING = ("plan", "GPUs", "VRAM holders", "CDI devices", "memlock", "podman", "image", "model files")
#: The rows doctor fills from nvidia-smi, and the CDI vendor they speak for.
NVIDIA_ROWS, NVIDIA = ("GPUs", "VRAM holders"), "nvidia.com/"


def first_blocker(
    project: Project, name: str, target: str, host: Host, *, skip: Collection[str] = ()
) -> Check | None:
    """doctor's first no-go row among BLOCKING (table order, ``plan`` first), or None when none fails or
    doctor itself cannot run. ``skip``: rows the caller settled another way (``--memlock`` given)."""
    try:
        spec = project.load(name)
        _name, checks = doctor.diagnose(project, name, target=target, host=host)
    except RigsmithError:
        return None
    if not any(d.startswith(NVIDIA) for d in spec.resources.gpus.cdi_devices):
        skip = {*skip, *NVIDIA_ROWS}  # nvidia-smi answers for NVIDIA GPUs only: no verdict on the others
    failing = {c.name: c for c in checks if c.verdict == "no-go" and c.name not in skip}
    return next((failing[n] for n in BLOCKING if n in failing), None)


def doctor_command(name: str, target: str) -> str:
    """The doctor command for this deployment and target (every row, with its hint)."""
    return f"`invoke doctor --deployment {name} --target {target}`"


def lead(err: RigsmithError, blocker: Check | None, name: str, target: str) -> RigsmithError:
    """``err`` with doctor's failing row in front of it; ``err`` itself when nothing blocks."""
    if blocker is None:
        return err
    hint = (blocker.hint + "; " if blocker.hint else "") + f"{doctor_command(name, target)} shows every check"
    return RigsmithError(
        f"{name}: {blocker.name}: {blocker.detail}\n  what failed after it: {err.message}", hint=hint
    )


def service_failed(
    err: RigsmithError, journal: CmdResult, logs: list[str], blocker: Check | None, name: str
) -> RigsmithError:
    """A quadlet service that failed to start: systemctl's words, then the service's own log (the engine's
    error is there; systemctl only points at journalctl). doctor's failing row, when there is one, is
    named after them rather than in front: the engine ran, so its log speaks first."""
    lines = [ln for ln in journal.stdout.splitlines() if ln.strip()][-20:]
    log = "\n".join(f"  | {shown(ln)}" for ln in lines) or "  (the journal holds nothing for it)"
    hint = f"fix what the log names, then `invoke up --target quadlet --deployment {name}` again"
    if blocker is not None:
        hint += f"; doctor also fails {blocker.name}: {blocker.detail}" + (
            f" (fix: {blocker.hint})" if blocker.hint else ""
        )
    return RigsmithError(f"{err.message}\n  the service's log (`{' '.join(logs)}`):\n{log}", hint=hint)


def container_state(host: Host, name: str) -> str | None:
    """podman's state of the container (running, exited, created, …), None when there is none."""
    res = host.run(inspect_argv(name))
    info = parse_inspect(res.stdout) if res.code == 0 else None
    if info is None:
        return None
    return str((info.get("State") or {}).get("Status") or "unknown")


def not_running(name: str, state: str | None, doing: str) -> RigsmithError:
    """The one-sentence error for a command that needs the container and finds none (or a dead one)."""
    what = "there is no container of that name" if state is None else f"its container is {state}"
    return RigsmithError(
        f"{name} is not running ({what}), so there is nothing to {doing}",
        hint=f"`invoke up --deployment {name}` starts it",
    )


def down_summary(gpus_checked: bool, had_container: bool) -> str:
    """down's last line, claiming only what it checked: the container's processes (when there was one) and
    the GPUs (when nvidia-smi answered)."""
    if gpus_checked:
        return "no process of this deployment is left or holds a GPU"
    if had_container:
        return "no process of the container outlived the stop; the GPUs were not checked (see above)"
    return "nothing was running; the GPUs were not checked (see above)"


def require_running(project: Project, name: str, target: str, host: Host, doing: str) -> None:
    """For the podman target: raise a one-paragraph error, led by doctor's failing row, unless the
    container exists (quadlet's container appears only once its unit started, so it is not asked)."""
    if target != "podman":
        return
    if container_state(host, name) is not None:
        return
    err = not_running(name, None, doing)
    blocker = first_blocker(project, name, target, host)
    if blocker is None:
        raise err
    raise RigsmithError(
        err.message,
        hint=f"{err.hint}; doctor expects the start to fail on {blocker.name}: {blocker.detail}"
        + (f" (fix: {blocker.hint})" if blocker.hint else ""),
    )
