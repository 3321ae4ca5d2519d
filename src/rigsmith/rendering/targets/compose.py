"""The compose target: ``compose/NAME/compose.yaml`` for podman-compose (1.0.6 … 1.6.0) and docker compose.

GPUs go in the service's ``devices:`` list, which every front-end passes through as ``--device``; never in
``deploy.resources.reservations.devices`` with ``driver: cdi``, which podman-compose 1.0.6 and 1.6.0 both drop
without a word (shared/ENVIRONMENT.md; seeds/000 pitfall 1). podman-compose also never passes
``stop_grace_period`` to ``podman create/run`` (only to its own ``down``), so the up command rigsmith prints
adds ``--stop-timeout`` through ``--podman-run-args``, and the post-start check (operating.lifecycle.verify)
fails loudly when either the devices or the stop timeout did not arrive.
"""

from __future__ import annotations

import json
import re
import shlex
from pathlib import PurePosixPath
from typing import Any

from rigsmith import render as tpl
from rigsmith.render import banner, breaks_line, shquote, yaml_text
from rigsmith.rendering.plan import PlanMount, RunPlan
from rigsmith.rendering.targets.context import RenderContext
from rigsmith.rendering.targets.filecheck import file_checks
from rigsmith.rendering.targets.refusals import Check, expressed, refuse, runs_container, volume_problems
from rigsmith.rendering.targets.timing import (
    HEALTH_INTERVAL,
    HEALTH_RETRIES,
    HEALTH_TIMEOUT,
    health_argv,
    timings,
)
from rigsmith.writer import Artifact


def _no_interpolation(value: Any) -> Any:
    """Compose interpolates ``$VAR`` in every string of the file; ``$$`` is a literal ``$``."""
    if isinstance(value, str):
        return value.replace("$", "$$")
    if isinstance(value, list):
        return [_no_interpolation(v) for v in value]
    if isinstance(value, dict):
        return {k: _no_interpolation(v) for k, v in value.items()}
    return value


def _memlock(plan: RunPlan) -> dict[str, Any] | None:
    if plan.memlock == "host":
        return None
    v = -1 if plan.memlock == "unlimited" else plan.memlock
    return {"memlock": {"soft": v, "hard": v}}


def service(plan: RunPlan) -> dict[str, Any]:
    """The one service, as plain data (before ``$`` escaping)."""
    t = timings(plan)
    svc: dict[str, Any] = {
        "image": plan.image,
        "container_name": plan.name,
        "pull_policy": "never",
        "entrypoint": [plan.entrypoint],
        "command": list(plan.command),
        "init": True,
        "network_mode": plan.network_mode,
        "devices": list(plan.devices),
        "shm_size": plan.shm_size,
    }
    ulimits = _memlock(plan)
    if ulimits:
        svc["ulimits"] = ulimits
    svc["stop_grace_period"] = f"{t.container_stop}s"
    svc["labels"] = [f"{k}={v}" for k, v in plan.labels]
    # List form: a bare NAME takes the value from the shell that runs compose (secrets stay out of the file).
    svc["environment"] = [f"{k}={v}" for k, v in plan.env] + list(plan.secret_env)
    svc["volumes"] = [_volume(m) for m in plan.mounts]
    svc["healthcheck"] = {
        "test": ["CMD", *health_argv(plan)],
        "interval": f"{HEALTH_INTERVAL}s",
        "timeout": f"{HEALTH_TIMEOUT}s",
        "retries": HEALTH_RETRIES,
        "start_period": f"{t.start_period}s",
    }
    return svc


def _volume(m: PlanMount) -> str | dict[str, Any]:
    """A directory as ``host:container[:ro]``; a file in the long syntax with ``create_host_path: false``:
    podman-compose makes a directory for any missing bind source otherwise (seed 000's pitfall 2; 1.6.0
    honours the flag and refuses, 1.0.6 ignores it: files.sh, run by the start line, creates it first)."""
    if m.kind == "dir":
        return f"{m.host}:{m.container}{':ro' if m.readonly else ''}"
    bind = {"type": "bind", "source": m.host, "target": m.container, "read_only": m.readonly}
    return {**bind, "bind": {"create_host_path": False}}


def document(plan: RunPlan) -> dict[str, Any]:
    """The whole compose file as data, ``$`` escaped; a secret read from another host variable
    (``NAME=$OTHER``) is the one interpolation: ``NAME=${OTHER}`` (compose reads the shell's OTHER when it
    runs, so the value is never in the file)."""
    svc = _no_interpolation(service(plan))
    mapped = dict(plan.secret_from)
    svc["environment"] = [f"{e}=${{{mapped[e]}}}" if e in mapped else e for e in svc["environment"]]
    return {"name": project_name(plan.name), "services": {plan.name: svc}}


def project_name(name: str) -> str:
    """``name`` as a compose project name (compose-spec: ``^[a-z0-9][a-z0-9_-]*$``; a deployment name may
    also hold ``.``, as in ``qwen2.5-7b``)."""
    return re.sub(r"[^a-z0-9_-]", "-", name.lower()).lstrip("_-") or "rigsmith"


def up_argv(plan: RunPlan, compose_file: str) -> list[str]:
    """How to start it so the stop timeout reaches podman (podman-compose ignores stop_grace_period)."""
    return [
        "podman-compose",
        "-f",
        compose_file,
        f"--podman-run-args=--stop-timeout={timings(plan).container_stop}",
        "up",
        "-d",
    ]


def start_command(plan: RunPlan, compose_file: str) -> str:
    """The start line: ``up_argv``, after ``files.sh`` beside the compose file when a file is mounted
    (compose has no pre-start step of its own, and podman-compose makes a directory for a missing file)."""
    up = shlex.join(up_argv(plan, compose_file))
    if not file_checks(plan):
        return up
    return f"sh {shlex.quote(str(PurePosixPath(compose_file).parent / FILES))} && {up}"


#: The pre-start script beside compose.yaml when the plan mounts a file.
FILES = "files.sh"

#: What the compose target cannot express.
CHECKS: tuple[Check, ...] = (runs_container("compose"), expressed("compose", volume_problems))


def _check_lines(plan: RunPlan, deployment: str) -> dict[str, str]:
    """The post-start check the header names: check-container for a deployment's own container; a node of a
    multi-node deployment is no deployment of its own, so the cluster's status is what there is to run."""
    if plan.name == deployment:
        return {
            "check_intro": "Then check that the GPUs, shm and stop timeout really arrived "
            "(fails loudly if not):",
            "check": f"invoke check-container --deployment {deployment}",
        }
    return {
        "check_intro": "Then see every node's state (this node's container is one of them):",
        "check": f"invoke status --deployment {deployment}",
    }


def render(plan: RunPlan, ctx: RenderContext) -> list[Artifact]:
    """``compose/NAME/compose.yaml``, and ``files.sh`` beside it when the plan mounts a file."""
    refuse(plan, ctx, CHECKS)
    rel = f"compose/{plan.name}/compose.yaml"
    body = yaml_text(document(plan))
    text = tpl.render(
        "compose/compose.yaml.j2",
        banner=banner(ctx.command, plan.spec_path),
        up=start_command(plan, rel),
        **_check_lines(plan, ctx.spec.name),
        # A comment line: a path with a line break is shown JSON-escaped, never as a second line.
        files=[
            (json.dumps(m.host) if breaks_line(m.host) else shquote(m.host), m.sparse_size)
            for m in plan.mounts
            if m.kind == "file"
        ],
        body=body,
    )
    out = [Artifact(ctx.out / rel, text)]
    checks = file_checks(plan)
    if checks:
        script = tpl.render(
            "compose/files.sh.j2",
            banner=banner(ctx.command, plan.spec_path),
            checks=[shlex.join(argv) for argv in checks],
        )
        out.append(Artifact(ctx.out / f"compose/{plan.name}/{FILES}", script, 0o755))
    return out
