"""Every target for a multi-node spec: the target's own renderer once per node (issue 15).

Each node gets its own artifacts named ``NAME-NODE`` (``podman/NAME-node0/run.sh``,
``quadlet/NAME-node1.container``, ``compose/NAME-node0/compose.yaml``, one Proxmox CT per node with VMIDs
counted up from ``--vmid``), rendered from that node's plan, so devices, shm, memlock, grace, mounts and
env follow the same rules as on one box. Kubernetes gets one LeaderWorkerSet instead (kube_lws).
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

from rigsmith import spec as specmod
from rigsmith.errors import RigsmithError
from rigsmith.rendering import cluster
from rigsmith.rendering.nextsteps import next_steps as one_node
from rigsmith.rendering.plan import RunPlan
from rigsmith.rendering.targets import kube_lws
from rigsmith.rendering.targets.context import RenderContext, Renderer
from rigsmith.writer import Artifact


def render(
    target: str, render_one: Renderer, spec: specmod.Deployment, plan: RunPlan, ctx: RenderContext
) -> list[Artifact]:
    """Artifacts of ``target`` (rendered by ``render_one``) for every node of ``spec.cluster``, head first."""
    nodes = cluster.node_plans(spec, plan)
    if target == "kube":
        return kube_lws.render(spec, plan, ctx)
    if target == "lxc" and ctx.lxc.config is not None:
        raise RigsmithError(
            f"--lxc-config {ctx.lxc.config} is one CT's pct.conf, but deployment {spec.name!r} has "
            f"{len(nodes)} nodes, one CT each",
            hint="render without --lxc-config (each node's NNN.conf is written new), then merge them by hand",
        )
    out: list[Artifact] = []
    for node in nodes:
        lxc = dataclasses.replace(ctx.lxc, vmid=ctx.lxc.vmid + node.index)
        out += render_one(node.plan, dataclasses.replace(ctx, lxc=lxc))
    return out


def next_steps(target: str, spec: specmod.Deployment, plan: RunPlan, out: Path | None) -> list[str]:
    """What to run on each node after deploy, head first, and the order to stop them in."""
    if target == "kube":
        return one_node(target, plan, out)
    nodes = cluster.node_plans(spec, plan)
    lines = [
        f"on {n.node.name} ({n.node.address}, {n.role}): {step}"
        for n in nodes
        for step in one_node(target, n.plan, out, deployment=spec.name)
    ]
    if spec.cluster is not None and spec.cluster.layout == "ray":
        lines.append(
            f"workers wait up to {spec.cluster.join_timeout_seconds}s for the head; the head starts vllm "
            "serve once every node and GPU has joined"
        )
    lines.append(
        f"stop the head ({nodes[0].plan.name}) first, then " + ", ".join(n.plan.name for n in nodes[1:])
    )
    return lines
