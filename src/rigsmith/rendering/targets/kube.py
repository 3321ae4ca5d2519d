"""The Kubernetes target: ``kube/NAME.yaml`` — Deployment + Service, for the step past one machine.

GPUs are a count of the vendor's extended resource (``nvidia.com/gpu: 3``): the device plugin picks which,
so fixed indices (``nvidia.com/gpu=1``) cannot be expressed and are refused. /dev/shm is a memory-backed
emptyDir with a size limit; the model dir and extra mounts are hostPath volumes (the node holds the
checkpoint, as on one box). Kubernetes has no per-pod RLIMIT_MEMLOCK: ``unlimited`` relies on the runtime's
default (containerd's unit sets LimitMEMLOCK=infinity), and a byte count is refused.
"""

from __future__ import annotations

import re
import shlex
from pathlib import PurePosixPath
from typing import Any

from rigsmith import render as tpl
from rigsmith.digits import ascii_digits
from rigsmith.render import banner, yaml_text
from rigsmith.rendering.plan import RunPlan, reach_host
from rigsmith.rendering.targets.context import RenderContext
from rigsmith.rendering.targets.refusals import Check, expressed, refuse, runs_container, volume_problems
from rigsmith.rendering.targets.timing import HEALTH_INTERVAL, HEALTH_TIMEOUT, timings
from rigsmith.writer import Artifact


def _gpu_limits(plan: RunPlan, count: int) -> dict[str, int]:
    """Device-plugin resource counts (``_gpu_problems`` refuses what maps to none)."""
    limits: dict[str, int] = {}
    for d in plan.devices:
        kind, name = d.split("=", 1)
        if name == "all":
            limits[kind] = max(limits.get(kind, 0), count)
        elif ascii_digits(name):
            limits[kind] = limits.get(kind, 0) + 1
    return limits


def _gpu_problems(plan: RunPlan) -> list[tuple[str, str]]:
    problems = [
        ("resources.gpus.cdi_devices", f"{d}: only whole GPUs (index or all) map to a {kind} count")
        for d in plan.devices
        for kind, name in [d.split("=", 1)]
        if not (name == "all" or ascii_digits(name))
    ]
    indices = sorted(int(n) for n in plan.gpu_indices if ascii_digits(n))
    if indices and indices != list(range(len(indices))):
        problems.append(
            (
                "resources.gpus.cdi_devices",
                f"GPUs {indices} are fixed indices; the device plugin picks them. Use 0..N-1 or =all",
            )
        )
    return problems


def _memlock_problems(plan: RunPlan) -> list[tuple[str, str]]:
    if not isinstance(plan.memlock, int):
        return []
    return [
        (
            "resources.memlock",
            f"{plan.memlock} bytes: Kubernetes sets no per-pod RLIMIT_MEMLOCK; use unlimited "
            "(the runtime's default) or host",
        )
    ]


def _pull_problems(plan: RunPlan) -> list[tuple[str, str]]:
    """A local build's image ID (``sha256:…``, no registry digest) is in this host's storage only: every
    node of a cluster would fail to pull it."""
    if not plan.image.startswith("sha256:"):
        return []
    return [
        (
            "engine.build",
            f"the image is {plan.image}, a local build's image ID: no cluster node can pull it; "
            f"`invoke build --push REGISTRY --deployment {plan.name}` pushes it and locks its registry "
            "digest",
        )
    ]


#: What the kube target cannot express. podman kube play turns a hostPath volume into a
#: host:container[:opts] bind string (seen with 4.3), hence the volume syntax check.
CHECKS: tuple[Check, ...] = (
    runs_container("kube"),
    expressed("kube", volume_problems, _memlock_problems, _gpu_problems, _pull_problems),
)


def object_name(name: str) -> str:
    """The deployment name as a Kubernetes DNS-1035 label (Service and container names need one).

    A deployment may be called ``qwen2.5-7b`` or ``3x3090_a``; the API server refuses a Service or
    container named that (lowercase letters, digits and '-', starting with a letter, at most 63).
    """
    label = re.sub(r"[^a-z0-9-]+", "-", name).strip("-")
    if not label[:1].isalpha():
        label = f"vllm-{label}"
    return label[:63].rstrip("-")


#: Kubernetes label values: at most 63, alphanumeric at both ends, '-', '_' and '.' inside.
_LABEL_VALUE = re.compile(r"(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?")


def _label_value(value: str) -> str:
    """A label value as is when Kubernetes accepts it, else as the object name (a deployment ``m_``)."""
    return value if len(value) <= 63 and _LABEL_VALUE.fullmatch(value) else object_name(value)


def _volume_name(i: int, role: str) -> str:
    return "model" if role == "model" else f"mount-{i}"


def file_steps(plan: RunPlan) -> list[tuple[str, str | None]]:
    """(what, the command that makes it or None) each node needs before the manifest is applied, one per
    file mount: a ``hostPath`` of type File refuses a missing path (the pod does not start), and nothing on
    the kube side makes the file the other targets create before their container starts (seeds/000 pitfall
    2: sparse, at its exact size)."""
    return [
        (
            f"{m.host} must be a file of exactly {m.sparse_size} bytes (sparse; never a directory)",
            f"mkdir -p {shlex.quote(str(PurePosixPath(m.host).parent))} && truncate -s {m.sparse_size} "
            + shlex.quote(m.host),
        )
        if m.sparse_size
        else (f"{m.host} must be the file the engine reads (never a directory): create it", None)
        for m in plan.mounts
        if m.kind == "file"
    ]


def k8s_literal(text: str) -> str:
    """Text that Kubernetes' ``$(VAR)`` expansion (command, args, env values) gives back unchanged.

    Kubernetes turns ``$$`` into ``$`` and ``$(NAME)`` into NAME's value; any other ``$`` stays. So
    doubling every ``$`` is needed exactly when one is followed by ``$`` or ``(``.
    (podman kube play expands the same way since 4.7; Debian 12's 4.3 does not expand at all.)
    """
    return text.replace("$", "$$") if "$(" in text or "$$" in text else text


def manifests(plan: RunPlan, ctx: RenderContext) -> list[dict[str, Any]]:
    """Deployment and Service as data."""
    t = timings(plan)
    kname = object_name(plan.name)
    labels = {"app.kubernetes.io/name": kname, "app.kubernetes.io/managed-by": "rigsmith"}
    volumes: list[dict[str, Any]] = []
    mounts: list[dict[str, Any]] = []
    for i, m in enumerate(plan.mounts):
        vname = _volume_name(i, m.role)
        kind = "Directory" if m.kind == "dir" else "File"
        volumes.append({"name": vname, "hostPath": {"path": m.host, "type": kind}})
        mounts.append({"name": vname, "mountPath": m.container, **({"readOnly": True} if m.readonly else {})})
    # Named after the deployment: podman kube play (4.3) turns an emptyDir into a named volume, which every
    # pod using the same volume name would share.
    shm = kname[:59].rstrip("-") + "-shm"
    volumes.append({"name": shm, "emptyDir": {"medium": "Memory", "sizeLimit": k8s_quantity(plan.shm_bytes)}})
    mounts.append({"name": shm, "mountPath": "/dev/shm"})
    env: list[dict[str, Any]] = [{"name": k, "value": k8s_literal(v)} for k, v in plan.env]
    env += [
        {"name": k, "valueFrom": {"secretKeyRef": {"name": f"{kname}-secrets", "key": plan.secret_source(k)}}}
        for k in plan.secret_env
    ]
    # With hostNetwork the server may listen on loopback only (the seeds do; network.listen); kubelet probes
    # from the node, on the address vLLM listens on.
    get = {
        "path": plan.health_path,
        "port": plan.port,
        **({"host": reach_host(plan.host)} if plan.network_mode == "host" else {}),
    }
    probe = {"httpGet": get, "periodSeconds": HEALTH_INTERVAL, "timeoutSeconds": HEALTH_TIMEOUT}
    gpus = _gpu_limits(plan, ctx.spec.resources.gpus.count)
    container: dict[str, Any] = {
        "name": kname,
        "image": plan.image,
        "imagePullPolicy": "IfNotPresent",
        "command": [k8s_literal(plan.entrypoint)],
        "args": [k8s_literal(a) for a in plan.command],
        "env": env,
        # With hostNetwork the server binds the node's port directly; podman kube play (4.3) also refuses
        # port mappings there ("PortMappings can only be used with Bridge or slirp4netns networking").
        **({} if plan.network_mode == "host" else {"ports": [{"name": "http", "containerPort": plan.port}]}),
        "resources": {"limits": dict(gpus)} if gpus else {},
        "volumeMounts": mounts,
        "startupProbe": {**probe, "failureThreshold": -(-t.start_period // HEALTH_INTERVAL)},
        "readinessProbe": {**probe, "failureThreshold": 3},
    }
    deployment = {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": kname, "labels": {**labels, **{k: _label_value(v) for k, v in plan.labels}}},
        "spec": {
            "replicas": 1,
            "strategy": {
                "type": "Recreate"
            },  # one set of GPUs: the old pod must be gone before the new starts
            "selector": {"matchLabels": labels},
            "template": {
                "metadata": {"labels": labels},
                "spec": {
                    "hostNetwork": plan.network_mode == "host",
                    "terminationGracePeriodSeconds": t.container_stop,
                    "containers": [container],
                    "volumes": volumes,
                },
            },
        },
    }
    service = {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {"name": kname, "labels": labels},
        "spec": {"selector": labels, "ports": [{"name": "http", "port": plan.port, "targetPort": plan.port}]},
    }
    return [deployment, service]


def render(plan: RunPlan, ctx: RenderContext) -> list[Artifact]:
    """``kube/NAME.yaml``."""
    refuse(plan, ctx, CHECKS)
    docs = manifests(plan, ctx)
    body = yaml_text(*docs, explicit_start=True)
    text = tpl.render(
        "kube/kube.yaml.j2",
        banner=banner(ctx.command, plan.spec_path),
        name=plan.name,
        body=body,
        files=file_steps(plan),
    )
    return [Artifact(ctx.out / "kube" / f"{plan.name}.yaml", text)]


def k8s_quantity(n: int) -> str:
    """Bytes as a Kubernetes quantity (``8Gi`` when exact)."""
    for unit, size in (("Ti", 2**40), ("Gi", 2**30), ("Mi", 2**20), ("Ki", 2**10)):
        if n % size == 0:
            return f"{n // size}{unit}"
    return str(n)
