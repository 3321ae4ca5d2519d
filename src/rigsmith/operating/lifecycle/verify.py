"""Post-start assertion: did the running container really get what the plan asked for?

Compose front-ends have been seen starting a container WITHOUT its CDI devices and saying nothing
(seeds/000 pitfall 1; podman-compose drops ``deploy.resources.reservations.devices`` with
``driver: cdi``), and podman-compose never passes ``stop_grace_period`` to podman. ``up`` (podman,
quadlet) and ``invoke check-container`` (any front-end) both run this one check: a command
(``inspect_argv``) plus pure parsers (``parse_inspect``, ``container_problems``).
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from typing import Any, Literal

from rigsmith.errors import CommandError, PreflightError
from rigsmith.operating import probes
from rigsmith.operating.host import Host, LocalHost, cdi_specs
from rigsmith.project import Project
from rigsmith.rendering import plan as planmod
from rigsmith.rendering.plan import RunPlan
from rigsmith.resolving.lock import lock as lockmod

SPEC_LABEL = "io.rigsmith.spec-sha256"
#: fully qualified CDI device → (device nodes, "K=V" env) its spec injects
CdiEdits = Mapping[str, tuple[tuple[str, ...], tuple[str, ...]]]


def inspect_argv(name: str) -> list[str]:
    return ["podman", "container", "inspect", name]


def parse_inspect(text: str) -> dict[str, Any] | None:
    """``podman container inspect`` → the container's record, None when absent."""
    try:
        data = json.loads(text or "[]")
    except json.JSONDecodeError:
        return None
    return dict(data[0]) if isinstance(data, list) and data else None


def cdi_from_specs(specs: Iterable[probes.CdiSpec]) -> dict[str, tuple[tuple[str, ...], tuple[str, ...]]]:
    """Every device the parsed CDI specs describe → its edits; later specs win (as in podman)."""
    out: dict[str, tuple[tuple[str, ...], tuple[str, ...]]] = {}
    for s in specs:
        for dev, edits in s.edits.items():
            out[f"{s.kind}={dev}"] = edits
    return out


def cdi_edits(host: Host) -> dict[str, tuple[tuple[str, ...], tuple[str, ...]]]:
    """The CDI edits of every spec file in podman's CDI directories on ``host``."""
    return cdi_from_specs(cdi_specs(host))


def container_problems(
    info: Mapping[str, Any], plan: RunPlan, cdi: Mapping[str, tuple[tuple[str, ...], tuple[str, ...]]]
) -> list[str]:
    """Every way the container differs from the plan: state, spec, CDI nodes and env, env, shm, stop.

    ``cdi`` maps each fully qualified CDI device to the (device nodes, env) its spec injects.
    """
    out = []
    state = info.get("State") or {}
    if not state.get("Running"):
        out.append(
            f"container {plan.name} is not running (status {state.get('Status', '?')}, "
            f"exit code {state.get('ExitCode', '?')})"
        )
    cfg = info.get("Config") or {}
    labels = cfg.get("Labels") or {}
    want_label = dict(plan.labels).get(SPEC_LABEL)
    if want_label and labels.get(SPEC_LABEL) != want_label:
        out.append(
            f"container was started from another spec (label {SPEC_LABEL}={labels.get(SPEC_LABEL)}, "
            f"the spec now renders {want_label})"
        )
    image = info.get("ImageName")
    if image and image != plan.image:
        out.append(f"container runs image {image}, the plan says {plan.image}")
    env = {}
    for item in cfg.get("Env") or []:
        k, _, v = str(item).partition("=")
        env[k] = v
    host = info.get("HostConfig") or {}
    arrived = {str(d.get("PathInContainer")) for d in host.get("Devices") or []}
    if plan.devices and not arrived:
        out.append(
            f"NO devices reached the container, though the plan asks for {', '.join(plan.devices)}: a "
            "front-end dropped them silently (compose `deploy.resources.reservations.devices` with "
            "`driver: cdi` is ignored; list them under `devices:`)"
        )
    else:
        for dev in plan.devices:
            if dev not in cdi:
                out.append(f"no CDI spec on this host describes {dev}, so its arrival cannot be confirmed")
                continue
            nodes, cdi_env = cdi[dev]
            lost = [n for n in nodes if n not in arrived]
            if lost:
                out.append(f"CDI device {dev}: {', '.join(lost)} not in the container")
            lost_env = [
                e.split("=", 1)[0] for e in cdi_env if env.get(e.split("=", 1)[0]) != e.partition("=")[2]
            ]
            if lost_env:
                out.append(f"CDI device {dev}: env {', '.join(lost_env)} not set as its spec says")
    wrong = [k for k, v in plan.env if env.get(k) != v]
    if wrong:
        out.append(f"env not as planned: {', '.join(wrong)}")
    unset = [k for k in plan.secret_env if k not in env]
    if unset:
        out.append(f"secret env not passed: {', '.join(unset)}")
    shm = host.get("ShmSize")
    if shm is not None and shm != plan.shm_bytes:
        out.append(f"/dev/shm is {shm} bytes, not {plan.shm_bytes} ({plan.shm_size})")
    stop = cfg.get("StopTimeout")
    if stop is not None and stop != plan.stop_timeout:
        out.append(
            f"stop timeout is {stop}s, not {plan.stop_timeout}s: vLLM would be killed mid-drain "
            "(podman-compose ignores stop_grace_period; start it with "
            f"--podman-run-args=--stop-timeout={plan.stop_timeout})"
        )
    return out


def check_container(plan: RunPlan, *, name: str | None = None, host: Host | None = None) -> None:
    """Inspect the running container on ``host``; raise PreflightError naming every difference from the
    plan."""
    host = host or LocalHost(timeout=600)
    argv = inspect_argv(name or plan.name)
    proc = host.run(argv)
    if proc.code == 127 and proc.stderr == f"{argv[0]}: command not found":
        raise PreflightError(
            f"cannot inspect container {name or plan.name}: podman is not installed (not on PATH)",
            hint="run check-container on the host that runs the container, or install podman",
        )
    if proc.code != 0:
        raise CommandError(argv, proc.code, proc.stderr, hint="is it started? podman ps -a")
    info = parse_inspect(proc.stdout) or {}
    problems = container_problems(info, plan, cdi_edits(host))
    if problems:
        raise PreflightError(
            f"container {name or plan.name} does not match deployment {plan.name}:\n"
            + "\n".join(f"  - {p}" for p in problems),
            hint="stop it, fix the cause named above, start it again",
        )


def check_deployment(
    project: Project,
    *,
    deployment: str | None = None,
    container: str | None = None,
    image: str | None = None,
    memlock: Literal["unlimited", "host"] | int | None = None,
) -> None:
    """The post-start assertion for a deployment's running container (any target that runs podman): plan from
    spec + lock as ``deploy`` does, then :func:`check_container`."""
    name = project.resolve_name(deployment)
    plan = planmod.make(
        project.load(name),
        lockmod.read(project.lock_path),
        spec_path=f"deployments/{name}.yaml",
        image=image,
        memlock=memlock,
    )
    check_container(plan, name=container)
