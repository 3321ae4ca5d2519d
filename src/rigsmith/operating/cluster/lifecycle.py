"""``invoke up`` / ``down`` / ``status`` on a multi-node deployment (issue 15).

Every node is driven through its Host (``noderun``) with its own generated artifacts (``podman/NAME-NODE/
run.sh`` and ``stop.sh``), and the order matters:

- ``up``: write the artifacts (asking before changing any), refuse lock drift on any node, start the head
  then every worker that is not already running (a worker started earlier keeps waiting for the head and
  joins), then wait — bounded by ``cluster.join_timeout_seconds`` — until the Ray cluster, asked from inside
  the head, holds every node and the planned GPU total; a timeout names the nodes that never joined. The
  head's script itself starts ``vllm serve`` once the cluster is whole; ``up`` checks it is still running.
- ``down``: stop the head first (its engine drains with the plan's grace, with Ray still up under it), then
  the workers; confirm each is gone and that no Ray process of the node's address is left on any node.
- ``status``: each node's state, how it is reached, and (Ray layout) whether the cluster counts it.

``NodeControl`` gives the argv for a node (``PodmanNodes`` for the podman target); tests pass one that runs
the same node plans in network namespaces with the real Ray.
"""

from __future__ import annotations

import json
import re
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from rigsmith.errors import CommandError, PreflightError, RigsmithError
from rigsmith.operating.cluster.doctor import node_model_facts
from rigsmith.operating.cluster.noderun import (
    RemoteHost,
    describe,
    node_hosts,
    require_reachable,
    unreachable,
)
from rigsmith.operating.cluster.portcheck import head_port_problems
from rigsmith.operating.doctor import drift
from rigsmith.operating.host import Host, LocalHost, image_facts, quadlet_lacks
from rigsmith.operating.lifecycle import wait as waitmod
from rigsmith.operating.lifecycle.verify import SPEC_LABEL, inspect_argv, parse_inspect
from rigsmith.operating.probes import CmdResult
from rigsmith.rendering.cluster import POLL_SECONDS, NodePlan
from rigsmith.rendering.plan import LOCK_LABEL
from rigsmith.rendering.targets.timing import health_argv
from rigsmith.resolving.lock import lock as lockmod
from rigsmith.spec import DEFAULT_NODE_DIR, Deployment

#: Asked inside the head: the live Ray nodes' addresses and their GPUs, as JSON (vLLM's images carry Ray).
RAY_NODES_PY = (
    "import json, ray; ray.init(address='auto', logging_level='ERROR'); "
    "alive = [x for x in ray.nodes() if x['Alive']]; "
    "print(json.dumps({'nodes': sorted(x['NodeManagerAddress'] for x in alive), "
    "'gpus': sum(x['Resources'].get('GPU', 0) for x in alive)}))"
)
#: Ray's own processes (raylet, GCS, ``ray start``), whose command lines carry the node's address.
RAY_PROCESS = re.compile(r"raylet|gcs_server|\bray\b.*\bstart\b|ray/_private|ray/dashboard")


class NodeControl(Protocol):
    """The argv that start, stop, inspect and reach into one node's engine (run on that node)."""

    def stage(self, host: Host, node: NodePlan) -> None:
        """Put the node's artifacts where ``start``/``stop`` run them on the node (nothing when they are
        there already)."""
        ...

    def start(self, host: Host, node: NodePlan) -> list[list[str]]: ...

    def stop(self, host: Host, node: NodePlan, grace: int) -> list[list[str]]: ...

    def state(self, host: Host, node: NodePlan) -> str:
        """running | exited | created | absent | …"""
        ...

    def labels(self, host: Host, node: NodePlan) -> Mapping[str, str] | None:
        """The labels of the node's container (None: it has none, or the control cannot tell)."""
        ...

    def clear(self, node: NodePlan) -> list[list[str]]:
        """Remove what a stopped node left (a stopped container) before starting it again."""
        ...

    def exec(self, node: NodePlan, argv: Sequence[str]) -> list[str]:
        """``argv`` run inside the node's running engine environment (where Ray's session is)."""
        ...

    def logs(self, node: NodePlan, follow: bool = False, tail: int | None = None) -> list[str]:
        """The argv that shows the node's engine log."""
        ...


@dataclass(frozen=True)
class PodmanNodes:
    """The podman target: each node's ``run.sh``/``stop.sh`` (``root/podman/NAME-NODE`` here). On this
    machine they run where they are; on a node reached through a Host (ssh), ``stage`` copies them to
    ``node_dir/NAME-NODE`` there first (``cluster.node_dir``)."""

    root: Path
    node_dir: str = DEFAULT_NODE_DIR

    def _here(self, node: NodePlan) -> Path:
        return self.root / "podman" / node.plan.name

    def _dir(self, host: Host, node: NodePlan) -> str:
        return f"{self.node_dir}/{node.plan.name}" if isinstance(host, RemoteHost) else str(self._here(node))

    def stage(self, host: Host, node: NodePlan) -> None:
        if not isinstance(host, RemoteHost):
            return
        for name in ("run.sh", "stop.sh"):
            path = f"{self._dir(host, node)}/{name}"
            res = host.write(path, (self._here(node) / name).read_text(encoding="utf-8"), 0o755)
            if res.code:
                raise CommandError(
                    ["write", path], res.code, f"on {node.node.name}: {res.stderr or res.stdout}",
                    hint=f"cluster.node_dir ({self.node_dir}) must be a directory rigsmith may create and "
                    f"write on {node.node.name}",
                )  # fmt: skip

    def start(self, host: Host, node: NodePlan) -> list[list[str]]:
        return [["bash", f"{self._dir(host, node)}/run.sh"]]

    def stop(self, host: Host, node: NodePlan, grace: int) -> list[list[str]]:
        return [["bash", f"{self._dir(host, node)}/stop.sh"]]

    def state(self, host: Host, node: NodePlan) -> str:
        info = self._inspect(host, node)
        return str((info.get("State") or {}).get("Status", "unknown")) if info else "absent"

    def labels(self, host: Host, node: NodePlan) -> Mapping[str, str] | None:
        info = self._inspect(host, node)
        return ((info or {}).get("Config") or {}).get("Labels") or None

    def _inspect(self, host: Host, node: NodePlan) -> dict[str, Any] | None:
        res = host.run(inspect_argv(node.plan.name))
        return parse_inspect(res.stdout) if res.code == 0 else None

    def clear(self, node: NodePlan) -> list[list[str]]:
        return [["podman", "rm", "--force", node.plan.name]]

    def exec(self, node: NodePlan, argv: Sequence[str]) -> list[str]:
        return ["podman", "exec", node.plan.name, *argv]

    def logs(self, node: NodePlan, follow: bool = False, tail: int | None = None) -> list[str]:
        argv = ["podman", "logs", *(["--tail", str(tail)] if tail is not None else [])]
        return [*argv, *(["--follow"] if follow else []), node.plan.name]


@dataclass
class Cluster:
    """One multi-node deployment and the means to act on each of its nodes."""

    spec: Deployment
    nodes: list[NodePlan]  # head first
    hosts: Mapping[str, Host]
    control: NodeControl
    echo: Callable[[str], None] = print
    sleep: Callable[[float], None] = time.sleep
    clock: Callable[[], float] = time.monotonic

    def host(self, node: NodePlan) -> Host:
        return self.hosts[node.node.name]

    def must(self, node: NodePlan, argv: Sequence[str], hint: str | None = None) -> CmdResult:
        res = self.host(node).run(argv)
        if res.code != 0:
            raise CommandError(
                list(argv), res.code, f"on {node.node.name}: " + (res.stderr or res.stdout), hint=hint
            )
        return res

    def state(self, node: NodePlan) -> str:
        return self.control.state(self.host(node), node)

    def ray_view(self) -> tuple[list[str], float] | None:
        """(addresses, GPUs) of the live Ray nodes, asked inside the head; None when it cannot answer."""
        head = self.nodes[0]
        res = self.host(head).run(self.control.exec(head, ["python3", "-c", RAY_NODES_PY]))
        lines = [ln for ln in res.stdout.splitlines() if ln.startswith("{")]
        if res.code != 0 or not lines:
            return None
        try:
            data = json.loads(lines[-1])
            return [str(a) for a in data.get("nodes", [])], float(data.get("gpus", 0))
        except (ValueError, AttributeError, TypeError):  # not the probe's line: Ray printed something else
            return None


def drift_gate(c: Cluster, lock: lockmod.Lock, ignore: bool) -> None:
    """Refuse when any node's model dir or image differs from the lock (``ignore``: say so and go on)."""
    for n in c.nodes:
        host = c.host(n)
        image = (
            image_facts(host, n.plan.image, n.plan.image_pinned) if n.plan.runtime == "container" else None
        )
        try:
            drift.gate(f"{c.spec.name} on {n.node.name}", node_model_facts(c.spec, lock, host), image)
        except RigsmithError as err:
            if not ignore:
                raise
            c.echo(f"warning (--ignore-drift): {err.message}")


def start(c: Cluster) -> list[str]:
    """Start every node not already running, head first; the names started. Refuses first, starting nothing,
    when a node cannot be reached or runs a container of another spec or lock."""
    states = preflight(c)
    started = []
    for n in c.nodes:
        st = states[n.node.name]
        if st == "running":
            c.echo(f"  {n.node.name} ({n.role}, {describe(c.host(n))}): already running")
            continue
        if st != "absent":
            for argv in c.control.clear(n):
                c.must(n, argv)
        if n is c.nodes[0] and type(c.host(n)) is LocalHost:
            _head_ports_free(c)
        c.echo(f"  {n.node.name} ({n.role}, {describe(c.host(n))}): starting {n.plan.name}")
        c.control.stage(c.host(n), n)
        for argv in c.control.start(c.host(n), n):
            c.must(n, argv, hint=f"fix what it names on {n.node.name}, then `invoke up` again")
        started.append(n.node.name)
    return started


def preflight(c: Cluster) -> dict[str, str]:
    """Every node reachable, and none running a container of another spec or lock; each node's state."""
    require_reachable(c.spec, c.hosts)
    states = {n.node.name: c.state(n) for n in c.nodes}
    _refuse_foreign(c, [n for n in c.nodes if states[n.node.name] == "running"])
    return states


#: The labels ``up`` compares on a running node: what they identify and where the current value comes from.
_IDENTITY = ((SPEC_LABEL, "spec", "deployments/{name}.yaml"), (LOCK_LABEL, "lock", "rigsmith.lock"))


def _refuse_foreign(c: Cluster, running: list[NodePlan]) -> None:
    """Raise naming each running node whose container's labels say another spec or lock started it."""
    bad = []
    for n in running:
        got = c.control.labels(c.host(n), n)
        if got is None:
            continue
        want = dict(n.plan.labels)
        for label, what, where in _IDENTITY:
            if got.get(label) != want.get(label):
                bad.append(
                    f"node {n.node.name} runs {n.plan.name} from another {what} (label {label} is "
                    f"{got.get(label) or 'missing'}; {where.format(name=c.spec.name)} gives "
                    f"{want.get(label)})"
                )
    if bad:
        raise RigsmithError(
            f"up {c.spec.name}: refused, nothing started: " + "; ".join(bad),
            hint=f"`invoke down --deployment {c.spec.name}` stops every node, then `invoke up` starts them "
            "from the current spec and lock",
        )


def _head_ports_free(c: Cluster) -> None:
    """The head runs here: its API and Ray (or data-parallel RPC) ports must be free before it starts, or
    Ray's GCS or the API server dies late and obscurely after the image loads."""
    busy = head_port_problems(c.spec)
    if busy:
        raise RigsmithError(
            f"the head {c.nodes[0].node.name} cannot start here: "
            + "; ".join(f"{field}: {why}" for field, why in busy),
            hint="free the port (or change the field named) and run `invoke up` again; nothing was started",
        )


def wait_ray(c: Cluster, timeout: float | None = None) -> float:
    """Wait (bounded) until Ray counts every node and the planned GPUs; the seconds it took."""
    assert c.spec.cluster is not None
    limit = float(c.spec.cluster.join_timeout_seconds if timeout is None else timeout)
    want = {n.node.address: n.node.name for n in c.nodes}
    gpus = sum(len(n.node.cdi_devices) for n in c.nodes)
    head = c.nodes[0]
    t0 = c.clock()
    seen: tuple[list[str], float] | None = None
    while True:
        stopped = c.state(head) != "running"
        seen = None if stopped else c.ray_view() or seen
        if seen and set(want) <= set(seen[0]) and seen[1] >= gpus:
            return c.clock() - t0
        if stopped or c.clock() - t0 >= limit:
            break
        c.sleep(POLL_SECONDS)
    missing = [f"{name} ({addr})" for addr, name in want.items() if not seen or addr not in seen[0]]
    why = (
        f"the head {head.plan.name} stopped (its own wait for the nodes ended)"
        if stopped
        else f"the Ray cluster is incomplete after {limit:g}s"
    )
    raise RigsmithError(
        f"{c.spec.name}: {why}: missing {', '.join(missing) or 'no node'}; "
        + (f"{seen[1]:g} of {gpus} GPUs" if seen else f"the head's Ray did not answer; {gpus} GPUs planned"),
        hint="check each missing node's log and the link between the nodes (`invoke doctor`); "
        "raise cluster.join_timeout_seconds for slow starts",
    )


def up(c: Cluster) -> float | None:
    """Start the cluster in order and wait until it is whole; seconds the join took (None: no Ray)."""
    assert c.spec.cluster is not None
    c.echo(
        f"up {c.spec.name}: {len(c.nodes)} nodes, {c.spec.cluster.layout} layout, head {c.nodes[0].node.name}"
    )
    start(c)
    if c.spec.cluster.layout != "ray":
        down_nodes = [n.node.name for n in c.nodes if c.state(n) != "running"]
        if down_nodes:
            raise RigsmithError(f"node(s) {', '.join(down_nodes)} stopped after start", hint="see their logs")
        return None
    took = wait_ray(c)
    gpus = sum(len(n.node.cdi_devices) for n in c.nodes)
    c.echo(f"up {c.spec.name}: Ray holds all {len(c.nodes)} nodes and {gpus} GPUs ({took:.1f}s)")
    head = c.nodes[0]
    if c.state(head) != "running":
        raise RigsmithError(f"the head {head.plan.name} stopped after the cluster formed", hint="see its log")
    c.echo(
        f"up {c.spec.name}: the head runs vllm serve now; `invoke wait --deployment {c.spec.name}` follows it"
    )
    return took


@dataclass(frozen=True)
class NodeStatus:
    """One node as ``status`` shows it."""

    name: str
    role: str
    address: str
    how: str
    state: str  # running | exited | absent | … | unreachable
    in_ray: bool | None  # None: not a Ray layout, or the head's Ray does not answer
    problem: tuple[str, str] | None = None  # (what, hint) when the node cannot be reached


def status(c: Cluster) -> list[NodeStatus]:
    """Every node's state, head first; a node ssh cannot reach is ``unreachable``, with why and the fix."""
    assert c.spec.cluster is not None
    lost = unreachable(c.spec, c.hosts)
    states = {n.node.name: "unreachable" if n.node.name in lost else c.state(n) for n in c.nodes}
    view = (
        c.ray_view() if c.spec.cluster.layout == "ray" and states[c.nodes[0].node.name] == "running" else None
    )
    return [
        NodeStatus(
            n.node.name,
            n.role,
            n.node.address,
            describe(c.host(n)),
            states[n.node.name],
            None if view is None else n.node.address in view[0],
            lost.get(n.node.name),
        )
        for n in c.nodes
    ]


def logs_argv(c: Cluster, node: str | None, follow: bool = False, tail: int | None = None) -> list[str]:
    """The command, run here, that shows one node's engine log (``node`` None: the head's)."""
    n = c.nodes[0] if node is None else next((x for x in c.nodes if x.node.name == node), None)
    if n is None:
        raise RigsmithError(
            f"--node {node!r} is not a node of {c.spec.name}",
            hint="use one of: " + ", ".join(x.node.name for x in c.nodes),
        )
    require_reachable(c.spec, {n.node.name: c.host(n)})
    argv = c.control.logs(n, follow, tail)
    host = c.host(n)
    return host.argv(argv) if isinstance(host, RemoteHost) else argv


def wait(c: Cluster, timeout: float, echo: Callable[[str], None]) -> waitmod.WaitResult:
    """Every node's join (Ray counts it and its GPUs), then the head's readiness gates: its log lines,
    followed over its Host, and its health answered inside its container."""
    require_reachable(c.spec, c.hosts)
    t0 = c.clock()
    assert c.spec.cluster is not None
    if c.spec.cluster.layout == "ray":
        took = wait_ray(c, timeout)
        echo(f"wait: Ray holds all {len(c.nodes)} nodes after {took:.0f}s")
    head, host = c.nodes[0], c.host(c.nodes[0])
    # ssh (or the node's prefix) runs from here, with the environment this machine's commands get.
    here = host.local if isinstance(host, RemoteHost) else host
    follower = waitmod.LogFollower(
        argv=logs_argv(c, head.node.name, follow=True), env=getattr(here, "env", None)
    )
    probe = c.control.exec(head, health_argv(head.plan))
    left = max(timeout - (c.clock() - t0), 1.0)
    return waitmod.wait(
        waitmod.Gates.from_spec(c.spec), follower, lambda: host.run(probe).code == 0, timeout=left, echo=echo
    )


#: ``ps -eo pid=,args=`` limited to the processes in the caller's network namespace: a node's Ray runs with
#: host networking, so its processes are there, and another node's sharing the PID table (a test's
#: namespaces on one kernel) are not counted as this node's.
_PS_HERE = (
    "me=$(readlink /proc/self/ns/net); ps -eo pid=,args= | while read -r pid args; do "
    '[ "$(readlink "/proc/$pid/ns/net" 2>/dev/null)" = "$me" ] && printf "%s %s\\n" "$pid" "$args"; '
    "done; true"
)


def ray_leftovers(host: Host, address: str) -> list[str]:
    """Ray processes on ``host`` (in its network namespace) whose command line names ``address``."""
    res = host.run(["sh", "-c", _PS_HERE])
    pat = re.compile(rf"(?<![\d.]){re.escape(address)}(?![\d.])")
    return [
        ln.strip()
        for ln in res.stdout.splitlines()
        if RAY_PROCESS.search(ln) and pat.search(ln) and "ps -eo" not in ln
    ]


#: How often, and how far apart, ``down`` looks for Ray processes that outlived the stop (5 s in all).
LEFTOVER_LOOKS, LEFTOVER_PAUSE = 10, 0.5


def down(c: Cluster, grace: int) -> None:
    """Stop the head (its engine) first, then the workers; fail naming any Ray process left, and any node
    ssh cannot reach (the others are stopped all the same)."""
    lost = unreachable(c.spec, c.hosts)
    for n in c.nodes:  # head first
        if n.node.name in lost:
            c.echo(f"down {n.plan.name}: cannot reach {n.node.name}; stopping the other nodes")
            continue
        if c.state(n) == "absent":
            c.echo(f"down {n.plan.name}: not running")
            continue
        c.echo(f"down {n.plan.name} ({n.role} on {n.node.name}): stopping (up to {grace}s grace)")
        c.control.stage(c.host(n), n)
        for argv in c.control.stop(c.host(n), n, grace):
            c.must(n, argv)
        if c.state(n) not in ("absent", "exited"):
            raise RigsmithError(
                f"{n.plan.name} still runs on {n.node.name} after stop", hint="stop it there by hand"
            )
    # A killed node's processes end a moment after its stop returns (the kernel tears a PID namespace
    # down asynchronously): look again for a few seconds before naming any as left behind.
    for _ in range(LEFTOVER_LOOKS):
        left = {
            n.node.name: ray_leftovers(c.host(n), n.node.address) for n in c.nodes if n.node.name not in lost
        }
        left = {k: v for k, v in left.items() if v}
        if not left:
            break
        time.sleep(LEFTOVER_PAUSE)
    if left:
        raise RigsmithError(
            "Ray processes outlived the stop: " + "; ".join(f"{k}: {', '.join(v)}" for k, v in left.items()),
            hint="on each node named: `ray stop --force`, or kill the PIDs listed",
        )
    if lost:
        raise RigsmithError(
            "down stopped every node it reached; " + "; ".join(what for what, _ in lost.values()),
            hint="; ".join(dict.fromkeys(h for _, h in lost.values())) + "; then `invoke down` again",
        )
    c.echo(f"down {c.spec.name}: all {len(c.nodes)} nodes stopped; no Ray process left")


def build(
    spec: Deployment,
    nodes: list[NodePlan],
    *,
    target: str,
    root: Path,
    local: LocalHost,
    hosts: Mapping[str, Host] | None = None,
    control: NodeControl | None = None,
    echo: Callable[[str], None] = print,
) -> Cluster:
    """The cluster for ``spec``: each node's Host (``noderun.node_hosts``) and the target's node control."""
    reached = node_hosts(spec, local, hosts)
    if control is None:
        if target == "quadlet":
            _refuse_quadlet(spec, nodes, reached)
        assert spec.cluster is not None
        control = PodmanNodes(root, spec.cluster.node_dir)
    return Cluster(spec, nodes, reached, control, echo)


def _refuse_quadlet(spec: Deployment, nodes: list[NodePlan], hosts: Mapping[str, Host]) -> None:
    """Quadlet units are not installed on nodes over ssh (yet): say what each node lacks for them anyway,
    so the user knows whether `deploy --target quadlet` and a hand install can work there."""
    require_reachable(spec, hosts)
    lacks = {n.node.name: quadlet_lacks(hosts[n.node.name], f"{n.plan.name}.container") for n in nodes}
    named = [f"{name}: {'; '.join(why)}" for name, why in lacks.items() if why]
    raise PreflightError(
        f"{spec.name}: up/down/status --target quadlet do not drive a multi-node deployment; "
        + ("; ".join(named) if named else "every node has systemd and podman's quadlet generator"),
        hint="use --target podman (each node's run.sh over ssh), or `invoke deploy --target quadlet` and "
        "install quadlet/NAME-NODE.container in /etc/containers/systemd on each node (start the head first)",
    )
