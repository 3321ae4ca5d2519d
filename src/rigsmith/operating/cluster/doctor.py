"""``invoke doctor`` on a multi-node deployment (issue 15): each node's own table, and a cluster view.

Each node is probed through its Host (``noderun``: this machine, ssh, or a test's namespace) with the
one-box probes and checks (``host.gather``, ``doctor.evaluate``), against that node's share of the spec (its
``cdi_devices``). The cluster view then compares the nodes: one driver version, one image (same ID in every
node's storage), the locked model present and verified on every node, the inter-node interface up and
holding the node's address, and clocks that agree. ``cluster_rows`` is pure over ``NodeReport`` s.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Literal

from rigsmith.errors import shown
from rigsmith.operating.checkrow import Check
from rigsmith.operating.cluster.noderun import RemoteHost, describe, node_hosts, unreachable
from rigsmith.operating.doctor import doctor, drift
from rigsmith.operating.host import Host, LocalHost, gather, probe
from rigsmith.operating.probes import HostFacts, ModelFacts
from rigsmith.project import Project
from rigsmith.rendering import cluster as clustermod
from rigsmith.rendering import plan as planmod
from rigsmith.rendering import validate
from rigsmith.rendering.targets import RenderContext
from rigsmith.resolving.lock import lock as lockmod
from rigsmith.resolving.model.modelfiles import expand_dir
from rigsmith.resolving.model.verified import STATE_DIR, STATE_FILE
from rigsmith.spec import ClusterNode, Deployment

#: Clocks further apart than this fail the clocks row (logs, Ray's timeouts and tokens compare times).
MAX_CLOCK_SKEW = 1.0


@dataclass(frozen=True)
class Link:
    """The node's inter-node interface as ``ip`` shows it on the node."""

    name: str | None  # the interface holding the address (the declared one when the spec names it)
    state: Literal["up", "down", "no carrier"]  # up: UP and LOWER_UP; no carrier: UP, the link (peer) not
    addresses: tuple[str, ...]
    error: str | None = None


@dataclass(frozen=True)
class NodeReport:
    """One node's doctor run."""

    node: ClusterNode
    how: str  # "this machine", "ssh root@b", …
    facts: HostFacts
    checks: list[Check]
    link: Link
    clock: tuple[float, float] | None  # (offset from this machine, ± half the round trip) seconds


def parse_link(addr_text: str, link_text: str, name: str | None, address: str) -> Link:
    """``ip -o addr show [dev NAME]`` and ``ip -o link show [dev NAME]`` → the interface with ``address``
    (or ``name``): its state and addresses."""
    by_if: dict[str, list[str]] = {}
    for line in addr_text.splitlines():
        w = line.split()
        if len(w) > 3 and w[2] in ("inet", "inet6"):
            by_if.setdefault(w[1], []).append(w[3].split("/", 1)[0])
    if name is None:
        name = next((i for i, a in by_if.items() if address in a), None)
    flags: set[str] = set()
    for line in link_text.splitlines():
        w = line.split()
        if len(w) > 2 and w[1].rstrip(":").split("@", 1)[0] == name:
            flags = set(w[2].strip("<>").split(","))
    state: Literal["up", "down", "no carrier"] = (
        "down" if "UP" not in flags else "up" if "LOWER_UP" in flags else "no carrier"
    )
    return Link(name, state, tuple(by_if.get(name or "", ())))


def probe_link(host: Host, node: ClusterNode, address: str) -> Link:
    dev = ["dev", node.interface] if node.interface else []
    addrs = probe(host, ["ip", "-o", "addr", "show", *dev])
    links = probe(host, ["ip", "-o", "link", "show", *dev])
    if addrs.code or links.code:
        why = shown((addrs.stderr or links.stderr or f"ip exited {addrs.code or links.code}").strip())
        return Link(node.interface, "down", (), why)
    return parse_link(addrs.stdout, links.stdout, node.interface, address)


def probe_clock(host: Host, now: Callable[[], float] = time.time) -> tuple[float, float] | None:
    """The node's clock minus this machine's (``date +%s.%N`` there, halfway through the round trip)."""
    t0 = now()
    res = probe(host, ["date", "+%s.%N"])
    t1 = now()
    try:
        there = float(res.stdout.strip())
    except ValueError:
        return None
    return (there - (t0 + t1) / 2, (t1 - t0) / 2) if res.code == 0 else None


def node_spec(spec: Deployment, node: ClusterNode) -> Deployment:
    """The spec as one node sees it: its own GPUs."""
    gpus = spec.resources.gpus.model_copy(
        update={"cdi_devices": node.cdi_devices, "count": len(node.cdi_devices)}
    )
    return spec.model_copy(update={"resources": spec.resources.model_copy(update={"gpus": gpus})})


def node_model_facts(spec: Deployment, lock: lockmod.Lock, host: Host, *, verify: bool = False) -> ModelFacts:
    """The node's model dir against the lock (another machine's: sizes and its verified-file record, read
    through its Host, at the same path as here)."""
    listing = None
    if isinstance(host, RemoteHost):
        root = str(expand_dir(spec.model.local_dir))
        listing = (host.files(root), host.read(f"{root}/{STATE_DIR}/{STATE_FILE}"))
    return drift.model_facts(spec, lock, verify=verify, listing=listing)


def diagnose_node(
    spec: Deployment,
    lock: lockmod.Lock,
    node: clustermod.NodePlan,
    host: Host,
    *,
    target: str,
    verify: bool = False,
) -> NodeReport:
    """Probe one node and check it against its share of the spec."""
    plan = node.plan
    image = (plan.image, plan.image_pinned) if plan.runtime == "container" and target != "lxc" else None
    root = str(expand_dir(spec.model.local_dir))
    model = node_model_facts(spec, lock, host, verify=verify)
    sparse = [(str(expand_dir(m.host)), m.sparse_size) for m in plan.mounts if m.sparse_size]
    facts = gather(host, model_dir=root, target=target, image=image, sparse=sparse, model=model)
    mine = node_spec(spec, node.node)
    return NodeReport(
        node.node,
        describe(host),
        facts,
        doctor.evaluate(mine, facts, target),
        probe_link(host, node.node, node.node.address),
        probe_clock(host),
    )


def _same(what: str, by_node: Mapping[str, str | None], hint: str) -> Check:
    missing = [n for n, v in by_node.items() if v is None]
    values = sorted({v for v in by_node.values() if v is not None})
    detail = ", ".join(f"{n} {v or '-'}" for n, v in by_node.items())
    if missing:
        return Check(what, "no-go", f"none on {', '.join(missing)} ({detail})", hint)
    if len(values) > 1:
        return Check(what, "no-go", f"differ: {detail}", hint)
    return Check(what, "go", f"{values[0]} on all {len(by_node)} nodes")


def _model_row(reports: list[NodeReport]) -> Check:
    bad = []
    for r in reports:
        m = r.facts.model
        if m is not None and m.problems:
            bad.append(
                f"{r.node.name}: {len(m.problems)} of {m.checked} files differ ({'; '.join(m.problems)})"
            )
    if bad:
        return Check(
            "model on every node",
            "no-go",
            "; ".join(bad),
            "on each node named: `invoke fetch-model --verify` (every node loads its own copy)",
        )
    first = reports[0].facts.model
    how = first.note if first and first.note else f"{first.checked if first else 0} files match rigsmith.lock"
    return Check("model on every node", "go", f"{how} on {', '.join(r.node.name for r in reports)}")


def _link_row(reports: list[NodeReport], addresses: Mapping[str, str]) -> Check:
    bad, ok = [], []
    for r in reports:
        lk, want = r.link, addresses[r.node.name]
        where = f"{r.node.name} {lk.name or r.node.interface or '?'}"
        if lk.error:
            bad.append(f"{where}: {lk.error}")
        elif lk.name is None:
            bad.append(f"{r.node.name}: no interface holds {want}")
        elif lk.state != "up":
            bad.append(
                f"{where} is {lk.state}" + (" (the cable or the peer is down)" if lk.state != "down" else "")
            )
        elif want not in lk.addresses:
            bad.append(f"{where} holds {', '.join(lk.addresses) or 'no address'}, not {want}")
        else:
            ok.append(f"{where} up with {want}")
    if bad:
        return Check(
            "NCCL interface",
            "no-go",
            "; ".join(bad),
            "bring the link up with the node's address (`ip link set DEV up`, "
            "`ip addr add ADDR/NN dev DEV`), or fix cluster.nodes[].address / .interface",
        )
    return Check("NCCL interface", "go", "; ".join(ok))


def _clock_row(reports: list[NodeReport], limit: float) -> Check:
    seen = {r.node.name: r.clock for r in reports}
    unknown = [n for n, c in seen.items() if c is None]
    if unknown:
        return Check(
            "clocks", "no-go", f"cannot read the clock on {', '.join(unknown)}", "`date` must run there"
        )
    offsets = {n: c[0] for n, c in seen.items() if c is not None}
    skew = max(offsets.values()) - min(offsets.values())
    slack = max(c[1] for c in seen.values() if c is not None)
    detail = f"skew {skew:.3f}s (±{slack:.3f}s): " + ", ".join(f"{n} {o:+.3f}s" for n, o in offsets.items())
    if skew - 2 * slack > limit:
        return Check(
            "clocks",
            "no-go",
            detail + f"; more than {limit:g}s apart",
            "run NTP on every node (`timedatectl set-ntp true`, or chrony)",
        )
    return Check("clocks", "go", detail)


def cluster_rows(
    reports: list[NodeReport], addresses: Mapping[str, str], limit: float = MAX_CLOCK_SKEW
) -> list[Check]:
    """The cluster view, one row per thing the nodes must agree on. Pure. ``addresses``: node → filled
    address."""
    images = {
        r.node.name: (r.facts.image.image_id if r.facts.image and r.facts.image.present else None)
        for r in reports
    }
    rows = [
        _same(
            "same driver",
            {r.node.name: r.facts.driver_version for r in reports},
            "install one NVIDIA driver version on every node (NCCL and the CUDA runtime must match)",
        ),
    ]
    if any(r.facts.image is not None for r in reports):
        rows.append(
            _same(
                "same image",
                images,
                "pull the locked image (name@digest) on every node: `podman pull REF` there",
            )
        )
    return [*rows, _model_row(reports), _link_row(reports, addresses), _clock_row(reports, limit)]


def diagnose(
    spec: Deployment,
    lock: lockmod.Lock,
    plan: planmod.RunPlan,
    hosts: Mapping[str, Host],
    *,
    target: str,
    verify: bool = False,
) -> tuple[list[NodeReport], list[Check]]:
    """Every node's report (those in ``hosts``) and, with two or more, the cluster view."""
    nodes = [n for n in clustermod.node_plans(spec, plan) if n.node.name in hosts]
    reports = [diagnose_node(spec, lock, n, hosts[n.node.name], target=target, verify=verify) for n in nodes]
    addresses = {n.node.name: n.node.address for n in nodes}
    return reports, cluster_rows(reports, addresses) if len(reports) > 1 else []


def diagnose_project(
    project: Project, deployment: str | None, *, target: str, verify: bool = False, only: str | None = None
) -> list[tuple[str, list[Check]]]:
    """(title, rows) for each node of the deployment and the cluster view (``only``: that node, here)."""
    name = project.resolve_name(deployment)
    spec = project.load(name)
    lock = lockmod.read(project.lock_path)
    spec_path = f"deployments/{name}.yaml"
    ctx = RenderContext(spec, project.root, "invoke doctor", podman_version=spec.podman_version)
    validate.refuse(spec_path, validate.problems(spec, lock, target, ctx, spec_path=spec_path))
    plan = planmod.make(spec, lock, spec_path=spec_path)
    hosts = node_hosts(spec, LocalHost(), only=only)
    # A node ssh cannot reach (a cut link, a refused key) gets one row saying so: probing it would only
    # repeat the failure once per probe.
    lost = unreachable(spec, hosts)
    reachable = {k: h for k, h in hosts.items() if k not in lost}
    reports, view = diagnose(spec, lock, plan, reachable, target=target, verify=verify)
    tables = [(f"doctor: {name} on {r.node.name} ({r.how}, {target})", r.checks) for r in reports]
    tables += [
        (f"doctor: {name} on {k} ({describe(hosts[k])}, {target})", [Check("reach", "no-go", what, hint)])
        for k, (what, hint) in lost.items()
    ]
    return tables + ([(f"doctor: {name} cluster view ({len(reports)} nodes)", view)] if view else [])
