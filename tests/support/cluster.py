"""Multi-node test deployments: seed 003 (TP2 × PP2) as a two-node Ray cluster, and the corpus' Kimi-K2
data-parallel pair as imported, addresses filled."""

from __future__ import annotations

import contextlib
import copy
import hashlib
import json
import subprocess
import sys
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from rigsmith import spec as specmod
from rigsmith.importing import recipe
from rigsmith.operating.cluster.noderun import RemoteHost
from rigsmith.operating.host import Host, LocalHost
from rigsmith.rendering.cluster import NodePlan
from tests.support.common import REPO

RAY_NAME = "merlin-2x2-ray"
DP_NAME = "kimi-k2-dp-2node"
#: Addresses of the test's own network namespaces (two_netns's default).
HEAD_IP, WORKER_IP = "10.231.0.1", "10.231.0.2"


def ray_data(
    seed: dict[str, Any] | None = None, name: str = RAY_NAME, interface: str = "enp65s0"
) -> dict[str, Any]:
    """Seed 003's deployment (``seed``: that data already re-pointed, e.g. by standin_deployment) as two
    nodes of two GPUs joined by Ray."""
    data = (
        copy.deepcopy(seed)
        if seed is not None
        else yaml.safe_load((REPO / "deployments" / "flash-next-merlin-4x3090.yaml").read_text())
    )
    data["name"] = name
    # The seed picks 4 GPUs of one host with CUDA_VISIBLE_DEVICES; here each node's cdi_devices pick them.
    data["env"] = [e for e in data["env"] if e["name"] != "CUDA_VISIBLE_DEVICES"]
    data["engine"]["args"] = [*data["engine"]["args"], "--distributed-executor-backend", "ray"]
    vendor = data["resources"]["gpus"]["cdi_devices"][0].split("=", 1)[0]
    data["cluster"] = {
        "layout": "ray",
        "nodes": [
            {"name": "box-a", "address": HEAD_IP, "interface": interface,
             "cdi_devices": [f"{vendor}=0", f"{vendor}=1"]},
            {"name": "box-b", "address": WORKER_IP, "interface": interface,
             "cdi_devices": [f"{vendor}=0", f"{vendor}=1"]},
        ],
        "join_timeout_seconds": 120,
    }  # fmt: skip
    return data


def dp_data() -> dict[str, Any]:
    """The corpus' two-node data-parallel Kimi-K2 recipe as import-recipe writes it, then filled."""
    cases = json.loads((REPO / "tests/importing/data/vllm-commands.json").read_text())
    items = cases if isinstance(cases, list) else cases["commands"]
    case = next(c for c in items if c["id"] == "recipes-kimi-k2-dp16-ep-two-node-headless")
    raw = case["raw"]
    dep = recipe.parse(
        raw, source=case["source"], sha256=hashlib.sha256(raw.encode()).hexdigest(), name=DP_NAME
    )
    data = specmod.to_data(dep)
    data["engine"]["image"] = "localhost/vllm:1"
    # Each node's address is a placeholder (node 0's the one the recipe gives --data-parallel-address).
    addresses = ("192.168.50.11", "192.168.50.12")
    data["placeholders"] = {n["address"]: a for n, a in zip(data["cluster"]["nodes"], addresses, strict=True)}
    data["resources"]["host_ram_gib"] = 1024  # the lxc target sizes each CT from it
    for node in data["cluster"]["nodes"]:
        node["interface"] = "enp65s0"
    return data


# -- nodes in network namespaces (real Ray) -------------------------------------------------------------

#: The link between the test's namespaces, in each of them.
IFACE = "rsn0"
#: Ray in the test's Python environment (dev extras).
RAY = Path(sys.executable).parent / "ray"
#: Inside each node's fresh mount namespace: Ray's temp dir and /dev/shm private to the node.
PRIVATE_DIRS = 'mount -t tmpfs rs-ray /tmp/ray && mount -t tmpfs rs-shm /dev/shm && exec "$@"'


def ip(*args: str) -> None:
    subprocess.run(["ip", *args], check=True, capture_output=True, timeout=30)


@contextlib.contextmanager
def two_netns(tag: str, addresses: tuple[str, str] = (HEAD_IP, WORKER_IP)) -> Iterator[tuple[str, str]]:
    """Two namespaces, head and worker, with ``addresses`` on a veth pair named IFACE in both."""
    head, worker = f"{tag}-h", f"{tag}-w"
    made: list[str] = []
    try:
        for ns in (head, worker):
            ip("netns", "add", ns)
            made.append(ns)
        ip("link", "add", f"{tag}a", "type", "veth", "peer", "name", f"{tag}b")
        for ns, end, addr in ((head, f"{tag}a", addresses[0]), (worker, f"{tag}b", addresses[1])):
            ip("link", "set", end, "netns", ns)
            ip("-n", ns, "link", "set", end, "name", IFACE)
            ip("-n", ns, "addr", "add", f"{addr}/24", "dev", IFACE)
            ip("-n", ns, "link", "set", IFACE, "up")
            ip("-n", ns, "link", "set", "lo", "up")
        yield head, worker
    finally:
        for ns in made:  # deleting a namespace deletes its end of the veth pair, and so the pair
            subprocess.run(["ip", "netns", "del", ns], check=False, capture_output=True, timeout=30)


def netns_host(ns: str, env: dict[str, str] | None = None, via: Sequence[str] = ()) -> RemoteHost:
    """A node reached by running commands in namespace ``ns`` (``via``: more prefix words after it)."""
    return RemoteHost(("ip", "netns", "exec", ns, *via), f"netns {ns}", LocalHost(env, timeout=120))


STANDIN = """#!/bin/sh
# Stand-in for the engine: what the head's script execs once the cluster is complete.
printf '%s\\0' "$@" > "$RIGSMITH_OUT/argv"
env > "$RIGSMITH_OUT/env"
python3 -c 'import json, ray; ray.init(address="auto", logging_level="ERROR"); \\
nodes = [n for n in ray.nodes() if n["Alive"]]; \\
print(json.dumps({"nodes": sorted(n["NodeManagerAddress"] for n in nodes), \\
"gpus": sum(n["Resources"].get("GPU", 0) for n in nodes)}))' \\
  > "$RIGSMITH_OUT/cluster.json" 2> "$RIGSMITH_OUT/err"
touch "$RIGSMITH_OUT/done"
exec sleep 600
"""


def bin_dir(dest: Path) -> Path:
    """PATH for the nodes: the test's python3 and ray, and the engine stand-in as ``vllm``."""
    dest.mkdir()
    (dest / "python3").symlink_to(sys.executable)
    (dest / "ray").symlink_to(RAY)
    (dest / "vllm").write_text(STANDIN)
    (dest / "vllm").chmod(0o755)
    return dest


def node_argv(node: NodePlan, bins: Path, out: Path) -> list[str]:
    """The node's plan — the entrypoint, command and env every target writes for it — as a container runs
    it: fresh PID and mount namespaces, private /tmp/ray and /dev/shm, nothing but the plan's env."""
    p = node.plan
    env = [f"{k}={v}" for k, v in p.env]
    env += [f"PATH={bins}:/usr/bin:/bin", f"HOME={out}", f"RIGSMITH_OUT={out}"]
    return [
        "unshare", "--pid", "--fork", "--mount-proc", "--kill-child",
        "sh", "-c", PRIVATE_DIRS, "node", "env", "-i", *env, p.entrypoint, *p.command,
    ]  # fmt: skip


#: True while PID $1 lives (a zombie does not count: nobody may reap the detached node).
_ALIVE = 'alive() { s=$(cut -d" " -f3 "/proc/$1/stat" 2>/dev/null) && [ "$s" != Z ]; }; '


@dataclass(frozen=True)
class NsNodes:
    """NodeControl for nodes run as :func:`node_argv` (the container's stand-in), detached, with a PID file
    per node under ``run_dir``; outputs in ``run_dir/NODE``, logs in ``run_dir/NODE.log``."""

    bins: Path
    run_dir: Path
    #: Seconds a stop waits at most, whatever the plan's grace (Ray's daemons outwait TERM; tests are short).
    max_grace: int = 3

    def pidfile(self, node: NodePlan) -> str:
        return str(self.run_dir / f"{node.node.name}.pid")

    def stage(self, host: Host, node: NodePlan) -> None:
        """The node runs its plan from here: nothing to copy."""

    def labels(self, host: Host, node: NodePlan) -> Mapping[str, str] | None:
        return None

    def logs(self, node: NodePlan, follow: bool = False, tail: int | None = None) -> list[str]:
        return ["cat", str(self.run_dir / f"{node.node.name}.log")]

    def start(self, host: Host, node: NodePlan) -> list[list[str]]:
        out = self.run_dir / node.node.name
        out.mkdir(exist_ok=True)
        script = 'echo $$ > "$0"; log=$1; shift; exec "$@" > "$log" 2>&1'
        log = str(self.run_dir / f"{node.node.name}.log")
        return [
            ["setsid", "-f", "sh", "-c", script, self.pidfile(node), log, *node_argv(node, self.bins, out)]
        ]

    def stop(self, host: Host, node: NodePlan, grace: int) -> list[list[str]]:
        """As a container stop with an init: TERM to every process of the node, up to ``grace`` seconds for
        them to end (the PID-namespace init ignores TERM, as PID 1 does), then KILL the node."""
        script = _ALIVE + (
            'p=$(cat "$0") || exit 0; c=$(pgrep -P "$p" | head -n1); '
            '[ -n "$c" ] && pkill -TERM --ns "$c" --nslist pid .; i=0; '
            'while [ -n "$c" ] && [ "$i" -lt "$1" ]; do left=0; '
            'for q in $(pgrep --ns "$c" --nslist pid .); do [ "$q" != "$c" ] && alive "$q" && left=1; done; '
            '[ "$left" = 0 ] && break; i=$((i+1)); sleep 0.2; done; '
            'kill -KILL "$p" 2>/dev/null; while alive "$p"; do sleep 0.2; done; rm -f "$0"'
        )
        return [["sh", "-c", script, self.pidfile(node), str(min(grace, self.max_grace) * 5)]]

    def state(self, host: Host, node: NodePlan) -> str:
        script = (
            _ALIVE
            + '[ -f "$0" ] || { echo absent; exit; }; alive "$(cat "$0")" && echo running || echo exited'
        )
        return host.run(["sh", "-c", script, self.pidfile(node)]).stdout.strip() or "unknown"

    def clear(self, node: NodePlan) -> list[list[str]]:
        return [["rm", "-f", self.pidfile(node)]]

    def exec(self, node: NodePlan, argv: Sequence[str]) -> list[str]:
        script = 'c=$(pgrep -P "$(cat "$0")" | head -n1) && exec nsenter -t "$c" -m -p -- "$@"'
        words = [sys.executable if a == "python3" else a for a in argv]
        return ["sh", "-c", script, self.pidfile(node), *words]


def wait_for_descendant(pidfile: str, command: str, timeout: float = 60) -> bool:
    """Whether a process named ``command`` ran below the node of ``pidfile`` within ``timeout`` seconds
    (e.g. the worker's ``sleep`` between two probes of the head: it found no head and waits on)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        with contextlib.suppress(OSError, ValueError):
            if command in _descendant_names(int(Path(pidfile).read_text())):
                return True
        time.sleep(0.05)
    return False


def _proc(entry: str) -> Iterator[tuple[int, bytes]]:
    """(pid, /proc/PID/ENTRY) of every process that still exists."""
    for proc in Path("/proc").iterdir():
        if proc.name.isdigit():
            with contextlib.suppress(OSError):
                yield int(proc.name), (proc / entry).read_bytes()


def _descendant_names(root: int) -> set[str]:
    children: dict[int, list[int]] = {}
    names: dict[int, str] = {}
    for pid, raw in _proc("stat"):
        stat = raw.decode(errors="replace")
        names[pid] = stat[stat.index("(") + 1 : stat.rindex(")")]
        children.setdefault(int(stat[stat.rindex(")") + 2 :].split()[1]), []).append(pid)
    found, todo = set(), list(children.get(root, []))
    while todo:
        pid = todo.pop()
        found.add(names[pid])
        todo += children.get(pid, [])
    return found


def node_pids(prefix: str) -> list[int]:
    """Processes whose command line names an address starting with ``prefix`` (a raylet, GCS, ray start)."""
    return [pid for pid, cmd in _proc("cmdline") if prefix.encode() in cmd]
