"""Multi-node deployments: one spec with ``cluster.nodes`` → one RunPlan per node (issue 15).

Two layouts, both vLLM's own distributed engines (never a home-made coordinator):

- ``ray``: the first node runs a Ray head (``ray start --head``), waits until the cluster holds every node
  and GPU, then execs the recipe's ``vllm serve`` (which must carry ``--distributed-executor-backend ray``);
  every other node waits for the head's port and runs ``ray start --block --address HEAD:PORT``
  (vLLM's examples/online_serving/run_cluster.sh and multi-node-serving.sh, in the engine image).
- ``data-parallel``: every node runs ``vllm serve`` for its own ranks (``--data-parallel-size-local``);
  the first one serves the API, the others add ``--headless --data-parallel-start-rank K``. The address
  and RPC port every rank meets at are the first node's, set from the spec.

Each node plan is the single-node plan with that node's devices, env (``VLLM_HOST_IP``, and
``NCCL_SOCKET_IFNAME``/``GLOO_SOCKET_IFNAME`` when the node names its interface), name and command, so
every target renders it with the same shm, memlock, grace and mounts as one box. Pure.
"""

from __future__ import annotations

import dataclasses
import shlex
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Literal

from rigsmith import spec as specmod
from rigsmith.errors import SpecError
from rigsmith.rendering.plan import RunPlan

#: vLLM's parallel flags and their short aliases (vllm/engine/arg_utils.py).
FLAGS: dict[str, tuple[str, ...]] = {
    "--tensor-parallel-size": ("-tp",),
    "--pipeline-parallel-size": ("-pp",),
    "--data-parallel-size": ("-dp",),
    "--data-parallel-size-local": ("-dpl",),
    "--data-parallel-address": ("-dpa",),
    "--data-parallel-rpc-port": ("-dpp",),
    "--data-parallel-start-rank": ("-dpr",),
    "--distributed-executor-backend": (),
}
#: Variables rigsmith sets per node; the spec's env may not set them too.
NODE_ENV = ("VLLM_HOST_IP", "NCCL_SOCKET_IFNAME", "GLOO_SOCKET_IFNAME")
#: Variables that select GPUs on one host; in a cluster each node's cdi_devices do that.
GPU_SELECT_ENV = ("CUDA_VISIBLE_DEVICES", "HIP_VISIBLE_DEVICES", "ROCR_VISIBLE_DEVICES")
#: Ports ``ray start --head`` opens besides ``--port`` (its defaults; rigsmith sets no other), by what opens
#: them; the dashboard's 8265 only with ray[default], which vLLM's images lack.
RAY_HEAD_PORTS = {"Ray's client server (ray start --ray-client-server-port)": 10001}
#: Seconds between the head's checks of the cluster and the workers' checks of the head's port.
POLL_SECONDS = 2
#: A Ray worker (or a --headless rank) serves no API, but every target health-checks ``network.port`` +
#: ``readiness.health_path`` on each node (quadlet's Notify=healthy waits for it). So such a node's main
#: process is this responder: it answers that path while its child (``ray start --block``, ``vllm serve
#: --headless``; pid argv[1]) lives, forwards SIGTERM to it, and exits with its status. Ray's own agent
#: endpoint needs ray[default], which vLLM's images do not carry. argv: pid, port, path.
_WORKER_HEALTH_PY = (
    "import http.server, os, signal, sys, threading; pid, port, path = int(sys.argv[1]), int(sys.argv[2]), "
    "sys.argv[3]; signal.signal(signal.SIGTERM, lambda *_: os.kill(pid, signal.SIGTERM)); "
    "H = type('H', (http.server.BaseHTTPRequestHandler,), {'do_GET': lambda s: (s.send_response(200 if "
    "s.path == path else 404), s.end_headers()), 'log_message': lambda *_: None}); "
    "srv = http.server.HTTPServer(('127.0.0.1', port), H); "
    "threading.Thread(target=srv.serve_forever, daemon=True).start(); "
    "sys.exit(os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1]))"
)


@dataclass(frozen=True)
class NodePlan:
    """One node's role and the plan every target renders for it."""

    index: int
    node: specmod.ClusterNode
    role: Literal["head", "worker"]
    plan: RunPlan


def _spells(word: str, flag: str) -> bool:
    name = word.split("=", 1)[0]
    return name == flag or name in FLAGS.get(flag, ())


def flag_value(args: Sequence[str], flag: str) -> str | None:
    """The last value of ``flag`` (or an alias) in ``args``, ``--f V`` or ``--f=V``."""
    found = None
    for i, a in enumerate(args):
        if _spells(a, flag):
            if "=" in a:
                found = a.split("=", 1)[1]
            elif i + 1 < len(args):
                found = args[i + 1]
    return found


def set_flag(args: Sequence[str], flag: str, value: str | None) -> list[str]:
    """``args`` with every ``flag`` set to ``value`` in place (``None``: a bare switch), else appended."""
    out = list(args)
    hit = False
    for i, a in enumerate(out):
        if not _spells(a, flag):
            continue
        hit = True
        if value is None:
            continue
        if "=" in a:
            out[i] = f"{a.split('=', 1)[0]}={value}"
        elif i + 1 < len(out):
            out[i + 1] = value
    if not hit:
        out += [flag] if value is None else [flag, value]
    return out


def _size(args: Sequence[str], flag: str, default: int = 1) -> int | None:
    v = flag_value(args, flag)
    return default if v is None else specmod.ascii_int(v)


def _node_args(spec: specmod.Deployment, i: int) -> tuple[str, ...]:
    """The argv (after the subcommand) node ``i`` runs before the cluster facts are set."""
    cluster = spec.cluster
    assert cluster is not None
    node = cluster.nodes[i]
    return node.args if node.args is not None else spec.engine.args


def local_dp(spec: specmod.Deployment, i: int) -> int:
    """Data-parallel ranks on node ``i``: its GPUs over TP × PP."""
    args = _node_args(spec, i)
    per_rank = (_size(args, "--tensor-parallel-size") or 1) * (_size(args, "--pipeline-parallel-size") or 1)
    assert spec.cluster is not None
    return len(spec.cluster.nodes[i].cdi_devices) // per_rank


def head_ports(spec: specmod.Deployment) -> dict[str, int]:
    """The TCP ports the head (rank 0) listens on, each by the spec field that sets it (or, for a port
    no field sets, what opens it), fixed ones first."""
    cluster = spec.cluster
    assert cluster is not None
    ray = cluster.layout == "ray"
    return {
        **(RAY_HEAD_PORTS if ray else {}),
        "network.port": spec.network.port,
        **({"cluster.ray_port": cluster.ray_port} if ray else {"cluster.dp_rpc_port": cluster.dp_rpc_port}),
    }


def port_problems(spec: specmod.Deployment) -> list[tuple[str, str]]:
    """The head's ports that collide (the API, Ray's or the data-parallel RPC port), by the field to
    change."""
    seen: dict[int, str] = {}
    out = []
    for what, port in head_ports(spec).items():
        if port in seen:
            user = "the API server (network.port)" if seen[port] == "network.port" else seen[port]
            out.append((what, f"is {port}, which {user} uses on the head too; pick another port"))
        else:
            seen[port] = what
    return out


def problems(spec: specmod.Deployment) -> list[tuple[str, str]]:
    """Every reason the cluster section cannot run as written, by field path (empty: it can)."""
    cluster = spec.cluster
    if cluster is None:
        return []
    out: list[tuple[str, str]] = []
    for fld in ("name", "address"):
        values = [getattr(n, fld) for n in cluster.nodes]
        for i, v in enumerate(values):
            if values.index(v) != i:
                out.append((f"cluster.nodes[{i}].{fld}", f"{v!r} is already node {values.index(v)}'s {fld}"))
    for i, n in enumerate(cluster.nodes):
        dup = specmod.repeated(n.cdi_devices)
        if dup:
            out.append((f"cluster.nodes[{i}].cdi_devices", f"{dup} listed twice; list each GPU once"))
        if any(d.endswith("=all") for d in n.cdi_devices):
            out.append(
                (
                    f"cluster.nodes[{i}].cdi_devices",
                    "=all does not say how many GPUs the node gives; list them (vendor.com/gpu=0, =1, …)",
                )
            )
    out += [
        (f"env[{i}]", f"{e.name} is set per node by rigsmith from cluster.nodes; remove it from env")
        for i, e in enumerate(spec.env)
        if e.active and e.name in NODE_ENV
    ]
    out += [
        (
            f"env[{i}]",
            f"{e.name} selects GPUs on one host; in a cluster each node's cdi_devices select them "
            "(renumbered from 0 in the container): remove it",
        )
        for i, e in enumerate(spec.env)
        if e.active and e.name in GPU_SELECT_ENV
    ]
    out += port_problems(spec)
    total = sum(len(n.cdi_devices) for n in cluster.nodes)
    args = spec.engine.args
    sizes = {f: _size(args, f) for f in ("--tensor-parallel-size", "--pipeline-parallel-size")}
    sizes["--data-parallel-size"] = _size(args, "--data-parallel-size")
    bad = [f for f, v in sizes.items() if v is None or v < 1]
    out += [("engine.args", f"{f} {flag_value(args, f)!r} is not a whole number ≥ 1") for f in bad]
    if bad:
        return out
    tp, pp, dp = (sizes[f] or 1 for f in sizes)
    if tp * pp * dp != total:
        out.append(
            (
                "cluster.nodes",
                f"the nodes give {total} GPUs but TP {tp} × PP {pp} × DP {dp} = {tp * pp * dp}; make "
                "engine.args' parallel sizes and the nodes' cdi_devices agree",
            )
        )
    if cluster.layout == "ray":
        backend = flag_value(args, "--distributed-executor-backend")
        if backend != "ray":
            out.append(
                (
                    "engine.args",
                    f"--distributed-executor-backend is {backend!r}; a Ray cluster needs "
                    "--distributed-executor-backend ray (add it, or use layout: data-parallel)",
                )
            )
        out += [
            (
                f"cluster.nodes[{i}].args",
                "is for the data-parallel layout; remove it (Ray workers run no vllm)",
            )
            for i, n in enumerate(cluster.nodes)
            if n.args is not None
        ]
        return out
    out += _dp_problems(spec, tp * pp)
    return out


def _dp_problems(spec: specmod.Deployment, per_rank: int) -> list[tuple[str, str]]:
    cluster = spec.cluster
    assert cluster is not None
    out: list[tuple[str, str]] = []
    if flag_value(spec.engine.args, "--data-parallel-size") is None:
        out.append(("engine.args", "layout data-parallel needs --data-parallel-size N (all ranks)"))
    start = 0
    for i, n in enumerate(cluster.nodes):
        where = f"cluster.nodes[{i}]"
        gpus = len(n.cdi_devices)
        if gpus % per_rank:
            out.append((f"{where}.cdi_devices", f"{gpus} GPUs is not a multiple of TP × PP = {per_rank}"))
        args = _node_args(spec, i)
        model_arg = spec.engine.model_arg
        if (
            n.args is not None
            and model_arg is not None
            and (model_arg >= len(n.args) or n.args[model_arg] != spec.engine.args[model_arg])
        ):
            out.append(
                (f"{where}.args", f"args[{model_arg}] must be the model word of engine.args, as on node 0")
            )
        for sm in spec.secondary_models if n.args is not None else ():
            if spec.engine.args[sm.arg] not in (n.args or ()):
                out.append(
                    (
                        f"{where}.args",
                        f"must name {sm.repo} with the word engine.args[{sm.arg}] "
                        f"({spec.engine.args[sm.arg]!r}), as node 0 does: it is mounted and pointed at for "
                        "every node",
                    )
                )
        local = gpus // per_rank
        # A node's own argv (or node 0's engine.args) must agree with its GPUs; a node without one gets
        # these flags set from them.
        checks = (("--data-parallel-size-local", local), ("--data-parallel-start-rank", start))
        args_field = f"{where}.args" if n.args is not None else "engine.args"
        for flag, want in checks if n.args is not None or i == 0 else ():
            got = flag_value(args, flag)
            if got is not None and specmod.ascii_int(got) != want:
                out.append(
                    (args_field, f"{flag} is {got} but {n.name}'s GPUs give {want}; fix it or drop it")
                )
        headless = any(a == "--headless" for a in args)
        if i and n.args is not None and not headless:
            out.append((f"{where}.args", "a rank after the first serves no API: add --headless"))
        if i == 0 and headless:
            out.append(
                (
                    f"{where}.args" if n.args else "engine.args",
                    "the first node serves the API: drop --headless",
                )
            )
        start += local
    return out


def check(spec: specmod.Deployment, spec_path: str) -> None:
    """Raise one SpecError with every cluster problem."""
    found = problems(spec)
    if found:
        raise SpecError(spec_path, found)


def _node_env(node: specmod.ClusterNode) -> tuple[tuple[str, str], ...]:
    env = [("VLLM_HOST_IP", node.address)]
    if node.interface:
        env += [("NCCL_SOCKET_IFNAME", node.interface), ("GLOO_SOCKET_IFNAME", node.interface)]
    return tuple(env)


#: The head's wait for the whole cluster, in the engine image's Python (it has Ray): one line, so a unit
#: file or a compose scalar carries it as is. argv: nodes, GPUs, tries.
_WAIT_PY = (
    "import sys, time, ray; n, g, tries = map(int, sys.argv[1:4]); "
    'ray.init(address="auto", logging_level="ERROR"); '
    'alive = lambda: [x for x in ray.nodes() if x["Alive"]]; '
    'ok = lambda: len(alive()) >= n and sum(x["Resources"].get("GPU", 0) for x in alive()) >= g; '
    f"ready = next((True for _ in range(tries) if ok() or time.sleep({POLL_SECONDS})), False); "
    'sys.exit(0 if ready else f"rigsmith: the Ray cluster has {len(alive())} of {n} nodes after the join '
    'timeout; start the workers (cluster.nodes) or raise cluster.join_timeout_seconds")'
)


def head_script(
    spec: specmod.Deployment, command: Sequence[str], executable: str, group_size: str | None = None
) -> str:
    """The Ray head's one-line bash program: start the head, wait for every node and GPU, exec vLLM.

    ``group_size``: a shell variable holding the node count (a LeaderWorkerSet's ``LWS_GROUP_SIZE``)
    instead of the spec's, for nodes that all give the head's GPU count.
    """
    cluster = spec.cluster
    assert cluster is not None
    head = cluster.nodes[0]
    tries = -(-cluster.join_timeout_seconds // POLL_SECONDS)
    start = [
        "ray", "start", "--head", f"--port={cluster.ray_port}", f"--node-ip-address={head.address}",
        f"--num-gpus={len(head.cdi_devices)}", "--disable-usage-stats",
    ]  # fmt: skip
    wait = shlex.join(["python3", "-c", _WAIT_PY])
    if group_size is None:
        total = sum(len(n.cdi_devices) for n in cluster.nodes)
        wait += f" {len(cluster.nodes)} {total} {tries}"
    else:
        wait += f' "${group_size}" "$(({group_size} * {len(head.cdi_devices)}))" {tries}'
    return f"{shlex.join(start)} && {wait} && exec {shlex.join([executable, *command])}"


def worker_script(spec: specmod.Deployment, i: int) -> str:
    """A Ray worker's one-line bash program: wait (bounded) for the head's port, join, and answer the
    health path while Ray runs (the container ends when ``ray start --block`` does)."""
    cluster = spec.cluster
    assert cluster is not None
    node, head = cluster.nodes[i], cluster.nodes[0]
    tries = -(-cluster.join_timeout_seconds // POLL_SECONDS)
    probe = f"/dev/tcp/{head.address}/{cluster.ray_port}"
    join = [
        "ray", "start", "--block", f"--address={head.address}:{cluster.ray_port}",
        f"--node-ip-address={node.address}", f"--num-gpus={len(node.cdi_devices)}", "--disable-usage-stats",
    ]  # fmt: skip
    wait = (
        f"for _ in $(seq {tries}); do (exec 3<>{shlex.quote(probe)}) 2>/dev/null && break; "
        f"sleep {POLL_SECONDS}; done"
    )
    return f"{wait}; {with_health(spec, join)}"


def with_health(spec: specmod.Deployment, argv: Sequence[str]) -> str:
    """Bash that runs ``argv`` (a node that serves no API) under the health responder, which exits with
    its status."""
    health = ["python3", "-c", _WORKER_HEALTH_PY]
    port, path = spec.network.port, shlex.quote(spec.readiness.health_path)
    return f"{shlex.join(argv)} & exec {shlex.join(health)} $! {port} {path}"


def dp_command(spec: specmod.Deployment, plan: RunPlan, i: int, start: str | None = None) -> tuple[str, ...]:
    """Node ``i``'s data-parallel argv (subcommand first); ``start``: the word its start rank is written
    as instead of the number (a LeaderWorkerSet's shell arithmetic on the pod's index)."""
    cluster = spec.cluster
    assert cluster is not None
    sub = len(spec.engine.subcommand)
    base = list(plan.command)
    node = cluster.nodes[i]
    if node.args is not None:
        base = [*base[:sub], *(spec.fill(a) for a in node.args)]
        if spec.engine.model_arg is not None:
            base[sub + spec.engine.model_arg] = plan.command[sub + spec.engine.model_arg]
        # A secondary model's word (the same text as in engine.args, checked) names its mount, as there.
        for sm in spec.secondary_models:
            written, pointed = spec.fill(spec.engine.args[sm.arg]), plan.command[sub + sm.arg]
            base = [*base[:sub], *(pointed if a == written else a for a in base[sub:])]
    args = base[sub:]
    args = set_flag(args, "--data-parallel-size-local", str(local_dp(spec, i)))
    args = set_flag(args, "--data-parallel-address", cluster.nodes[0].address)
    args = set_flag(args, "--data-parallel-rpc-port", str(cluster.dp_rpc_port))
    if i:
        rank = start if start is not None else str(sum(local_dp(spec, k) for k in range(i)))
        args = set_flag(args, "--data-parallel-start-rank", rank)
        args = set_flag(args, "--headless", None)
    return (*base[:sub], *args)


def node_plans(spec: specmod.Deployment, plan: RunPlan) -> list[NodePlan]:
    """One plan per node, head (rank 0) first; ``plan`` is the deployment's single-node plan."""
    assert spec.cluster is not None
    check(spec, plan.spec_path)
    # Addresses may be placeholders ('<node0 address>') the user filled in `placeholders`.
    nodes = tuple(n.model_copy(update={"address": spec.fill(n.address)}) for n in spec.cluster.nodes)
    # A filled value is the user's text, not validated by the spec's field rule: check it as an address.
    bad = [
        (
            f"cluster.nodes[{i}].address",
            f"{n.address!r} (after filling placeholders) is not an IP address or host name",
        )
        for i, (n, was) in enumerate(zip(nodes, spec.cluster.nodes, strict=True))
        if specmod.PLACEHOLDER_RE.search(was.address)
        and (not specmod.ADDRESS_RE.match(n.address) or n.address.startswith("<"))
    ]
    if bad:
        raise SpecError(plan.spec_path, bad)
    spec = spec.model_copy(update={"cluster": spec.cluster.model_copy(update={"nodes": nodes})})
    cluster = spec.cluster
    assert cluster is not None
    out = []
    for i, node in enumerate(cluster.nodes):
        role: Literal["head", "worker"] = "head" if i == 0 else "worker"
        entrypoint, command = plan.entrypoint, plan.command
        # The head's first boot includes waiting for every node: its health start period covers both.
        health: dict[str, Any] = (
            {"startup_seconds": plan.startup_seconds + cluster.join_timeout_seconds} if i == 0 else {}
        )
        if cluster.layout == "ray":
            script = head_script(spec, plan.command, plan.entrypoint) if i == 0 else worker_script(spec, i)
            entrypoint, command = "bash", ("-c", script)
        elif i == 0:
            command = dp_command(spec, plan, i)
        else:
            # A --headless rank serves no API: it runs under the health responder, as a Ray worker does.
            entrypoint = "bash"
            command = ("-c", with_health(spec, [plan.entrypoint, *dp_command(spec, plan, i)]))
        name = f"{plan.name}-{node.name}"
        out.append(
            NodePlan(
                index=i,
                node=node,
                role=role,
                plan=dataclasses.replace(
                    plan,
                    name=name,
                    entrypoint=entrypoint,
                    command=command,
                    devices=node.cdi_devices,
                    gpu_indices=tuple(d.split("=", 1)[1] for d in node.cdi_devices),
                    env=(*plan.env, *_node_env(node)),
                    labels=(
                        *plan.labels,
                        ("io.rigsmith.node", node.name),
                        ("io.rigsmith.role", role),
                    ),
                    **health,
                ),
            )
        )
    return out
