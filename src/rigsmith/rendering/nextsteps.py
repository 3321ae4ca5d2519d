"""What to run after ``deploy`` writes one host's files: below ``deploy`` and the multi-node ``nodes``,
which both print it (per node for a cluster)."""

from __future__ import annotations

import shlex
from pathlib import Path

from rigsmith.rendering.plan import RunPlan


def next_steps(
    target: str, plan: RunPlan, out: Path | None = None, deployment: str | None = None
) -> list[str]:
    """What to run after deploy writes the files (the post-start check included where a front-end may drop
    devices). Paths are relative to the checkout, or under ``out`` when the files went there.
    ``deployment``: the spec a node's plan belongs to (multi-node: ``plan.name`` is the node's container,
    which is no deployment of its own, so the check is the cluster's status)."""

    def at(rel: str) -> str:
        return str(out / rel) if out is not None else rel

    check = (
        "then check it really got its GPUs, shm and stop timeout: "
        f"invoke check-container --deployment {plan.name}"
        if deployment in (None, plan.name)
        else f"then see every node's state: invoke status --deployment {deployment}"
    )
    if target == "compose":
        from rigsmith.rendering.targets.compose import start_command  # deploy loads no other target (startup)

        return [f"start: {start_command(plan, at(f'compose/{plan.name}/compose.yaml'))}", check]
    if target == "quadlet":
        return [
            f"install: cp {shlex.quote(at(f'quadlet/{plan.name}.container'))} /etc/containers/systemd/ "
            f"&& systemctl daemon-reload && systemctl start {plan.name}",
            check,
        ]
    merge = (
        f"merge {shlex.quote(at(f'lxc/{plan.name}'))}/*.conf into /etc/pve/lxc/, start the CT, "
        "run provision.sh inside it"
    )
    if target == "lxc" and plan.runtime == "venv":
        return [
            merge,
            f"then inside the CT: systemctl status {plan.name}.service (logs: journalctl -u {plan.name})",
        ]
    if target == "lxc":
        return [merge, check]
    if target == "kube":
        from rigsmith.rendering.targets.kube import file_steps  # as above: deploy loads no other target

        kube = shlex.quote(at(f"kube/{plan.name}.yaml"))
        return [
            *(f"on each node first, {what}" + (f": {how}" if how else "") for what, how in file_steps(plan)),
            f"kubectl apply -f {kube} (or podman kube play {kube})",
        ]
    return [f"start: {shlex.quote(at(f'podman/{plan.name}/run.sh'))}"]
