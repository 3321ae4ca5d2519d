"""The Kubernetes target for a multi-node spec: ``kube/NAME.yaml`` — a LeaderWorkerSet + a Service.

LeaderWorkerSet (kubernetes-sigs/lws, ``leaderworkerset.x-k8s.io/v1``) starts one group of pods. Ray layout:
the leader runs the Ray head and then ``vllm serve``, each worker joins the head at ``$LWS_LEADER_ADDRESS``
(vLLM's docs/deployment/frameworks/lws.md does the same). Data-parallel layout: the leader runs rank 0
(the API) with ``--data-parallel-address`` its own pod address; each worker runs ``vllm serve --headless``
with the leader's address and ``--data-parallel-start-rank $((LWS_WORKER_INDEX * ranks per pod))``, LWS's
index of the pod in its group (1, 2, …). ``RecreateGroupOnPodRestart`` restarts the whole
group when one pod fails, because a Ray cluster that lost a node cannot finish a request. The pod templates
are the single-node kube target's pods built from each node's plan, so GPUs, shm, mounts, grace and env
follow the same rules; a pod learns its own address from the downward API (``status.podIP``).

A worker's probes ask the responder its script runs while Ray lives (rendering/cluster.py).
LWS pods share one worker template, so every worker must look the same: the same GPU count and NCCL
interface on every node. Node addresses in the spec are not used here (the cluster's DNS is).
"""

from __future__ import annotations

import dataclasses
import shlex
from typing import Any

from rigsmith import render as tpl
from rigsmith import spec as specmod
from rigsmith.errors import SpecError
from rigsmith.render import banner, yaml_text
from rigsmith.rendering import cluster
from rigsmith.rendering.plan import RunPlan
from rigsmith.rendering.targets.context import RenderContext
from rigsmith.rendering.targets.kube import manifests, object_name
from rigsmith.rendering.targets.refusals import cannot_express, refuse, runs_container, volume_problems
from rigsmith.writer import Artifact

#: Stand-in node addresses (valid host names) swapped for the shell words each pod uses.
_LEADER = "rigsmith-lws-leader-address"
_SELF = "rigsmith-lws-pod-address"
#: Stand-in start rank of a data-parallel worker, swapped for shell arithmetic on the pod's LWS index.
_START = "rigsmith-lws-start-rank"
#: The label LWS puts on every pod with its index in the group; 0 is the leader.
WORKER_INDEX_LABEL = "leaderworkerset.sigs.k8s.io/worker-index"


def _problems(spec: specmod.Deployment) -> list[tuple[str, str]]:
    c = spec.cluster
    assert c is not None
    out = []
    first = c.nodes[0]
    for i, n in enumerate(c.nodes[1:], start=1):
        if len(n.cdi_devices) != len(first.cdi_devices):
            out.append(
                (
                    f"cluster.nodes[{i}].cdi_devices",
                    f"{len(n.cdi_devices)} GPUs, node 0 has {len(first.cdi_devices)}: LeaderWorkerSet pods "
                    "share one GPU request; give every node the same number",
                )
            )
        if n.interface != first.interface:
            out.append(
                (
                    f"cluster.nodes[{i}].interface",
                    f"{n.interface!r}, node 0 has {first.interface!r}: LeaderWorkerSet pods share one env; "
                    "name the same interface on every node",
                )
            )
        if (
            i > 1
            and n.args is not None
            and c.nodes[1].args is not None
            and _unranked(n) != _unranked(c.nodes[1])
        ):
            out.append(
                (
                    f"cluster.nodes[{i}].args",
                    "differs from cluster.nodes[1].args beyond its start rank: LeaderWorkerSet workers share "
                    "one command; give every worker the same args",
                )
            )
    return out


def _unranked(node: specmod.ClusterNode) -> list[str]:
    return cluster.set_flag(node.args or (), "--data-parallel-start-rank", "0")


def _lws_spec(spec: specmod.Deployment) -> specmod.Deployment:
    """The spec with stand-in addresses, so the scripts name the leader and the pod symbolically."""
    c = spec.cluster
    assert c is not None
    nodes = tuple(
        n.model_copy(update={"address": _LEADER if i == 0 else _SELF}) for i, n in enumerate(c.nodes)
    )
    return spec.model_copy(update={"cluster": c.model_copy(update={"nodes": nodes})})


def _script(word: str, leader: bool, ranks: int = 0) -> str:
    """A node script with the stand-ins swapped for the pod's shell variables (``ranks``: a data-parallel
    pod's local ranks, which its start rank is the multiple of)."""
    word = word.replace(_START, f'"$((LWS_WORKER_INDEX * {ranks}))"')
    word = word.replace(_SELF, '"$VLLM_HOST_IP"')
    return word.replace(_LEADER, '"$VLLM_HOST_IP"' if leader else '"$LWS_LEADER_ADDRESS"')


def _template(plan: RunPlan, ctx: RenderContext, leader: bool, ranks: int = 0) -> dict[str, Any]:
    plan = dataclasses.replace(plan, command=tuple(_script(a, leader, ranks) for a in plan.command))
    pod: dict[str, Any] = manifests(plan, ctx)[0]["spec"]["template"]
    container = pod["spec"]["containers"][0]
    container["env"] = [
        {"name": "VLLM_HOST_IP", "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}},
        *(e for e in container["env"] if e["name"] != "VLLM_HOST_IP"),
    ]
    return pod


def manifests_lws(spec: specmod.Deployment, plan: RunPlan, ctx: RenderContext) -> list[dict[str, Any]]:
    """LeaderWorkerSet and the leader's Service as data."""
    bad = _problems(spec)
    if bad:
        raise SpecError(plan.spec_path, cannot_express("kube", bad))
    c = spec.cluster
    assert c is not None
    lws_spec = _lws_spec(spec)
    nodes = cluster.node_plans(lws_spec, plan)
    kname = object_name(plan.name)
    labels = {"app.kubernetes.io/name": kname, "app.kubernetes.io/managed-by": "rigsmith"}
    head, ranks = nodes[0].plan, 0
    if c.layout == "ray":
        script = cluster.head_script(lws_spec, plan.command, plan.entrypoint, group_size="LWS_GROUP_SIZE")
        worker_plan = nodes[1].plan
    else:
        # Rank 0 runs in bash too, so its --data-parallel-address is the pod's own address at run time.
        script = f"exec {shlex.join([head.entrypoint, *head.command])}"
        ranks = cluster.local_dp(lws_spec, 1)
        argv = [plan.entrypoint, *cluster.dp_command(lws_spec, plan, 1, start=_START)]
        worker_plan = dataclasses.replace(nodes[1].plan, command=("-c", cluster.with_health(lws_spec, argv)))
    leader = _template(dataclasses.replace(head, entrypoint="bash", command=("-c", script)), ctx, leader=True)
    worker = _template(worker_plan, ctx, leader=False, ranks=ranks)
    for pod, role in ((leader, "leader"), (worker, "worker")):
        pod["metadata"] = {"labels": {**labels, "app.kubernetes.io/component": role}}
        pod["spec"]["containers"][0]["name"] = f"{kname[:56].rstrip('-')}-{role}"[:63]
    lws = {
        "apiVersion": "leaderworkerset.x-k8s.io/v1",
        "kind": "LeaderWorkerSet",
        "metadata": {"name": kname, "labels": labels},
        "spec": {
            "replicas": 1,
            "leaderWorkerTemplate": {
                "size": len(c.nodes),
                "restartPolicy": "RecreateGroupOnPodRestart",
                "leaderTemplate": leader,
                "workerTemplate": worker,
            },
        },
    }
    selector = {**labels, "app.kubernetes.io/component": "leader", WORKER_INDEX_LABEL: "0"}
    service = {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {"name": kname, "labels": labels},
        "spec": {
            "selector": selector,
            "ports": [{"name": "http", "port": plan.port, "targetPort": plan.port}],
        },
    }
    return [lws, service]


def render(spec: specmod.Deployment, plan: RunPlan, ctx: RenderContext) -> list[Artifact]:
    """``kube/NAME.yaml`` for a multi-node spec."""
    refuse(plan, ctx, (runs_container("kube"), lambda p, _c: cannot_express("kube", volume_problems(p))))
    body = yaml_text(*manifests_lws(spec, plan, ctx), explicit_start=True)
    text = tpl.render(
        "kube/lws.yaml.j2",
        banner=banner(ctx.command, plan.spec_path),
        name=plan.name,
        size=len(spec.cluster.nodes) if spec.cluster else 0,
        layout=spec.cluster.layout if spec.cluster else "ray",
        body=body,
    )
    return [Artifact(ctx.out / "kube" / f"{plan.name}.yaml", text)]
