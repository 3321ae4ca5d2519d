"""A two-node cluster for real: each node's generated ``run.sh`` run in its own podman, reached over real ssh
(issue 30).

``tests.support.sshcluster`` makes the nodes (network namespaces on a bridge, each with its own sshd, podman
storage and fake CDI GPUs); ``tests.support.rayimage`` makes the engine image with the real Ray. rigsmith
reaches the nodes only through ``cluster.nodes[].ssh`` and ``ssh_options``: ``up`` copies each node's
``run.sh`` there and runs it (head first), the head's script starts ``ray start --head``, waits for both
nodes and all four GPUs, then execs the stand-in ``vllm``, which records the Ray cluster it sees and serves.
Needs root, iproute2, openssh-server/client, podman and the ``ray`` package (dev extras).
"""

from __future__ import annotations

import functools
import json
import os
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from rigsmith.errors import PreflightError, RigsmithError
from rigsmith.operating.cluster import doctor as clusterdoctor
from rigsmith.operating.cluster import lifecycle as clusterlife
from rigsmith.operating.lifecycle import lifecycle
from rigsmith.operating.lifecycle.lifecycle import Ops
from tests.support import cluster as fixtures
from tests.support import rayimage
from tests.support.common import (
    HOST_MEMLOCK,
    invoke_cli,
    prepare_host_dirs,
    standin_deployment,
    write_project,
)
from tests.support.sshcluster import IFACE, SshCluster, ssh_cluster

NAME = "ray-over-ssh"
SUBNET = "10.233.0"
WAIT_TIMEOUT = 180

pytestmark = [
    pytest.mark.skipif(os.geteuid() != 0, reason="network namespaces, sshd and rootful podman need root"),
    pytest.mark.skipif(not fixtures.RAY.is_file(), reason="ray is not installed (pip install -e '.[dev]')"),
]


@pytest.fixture(scope="module")
def nodes(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SshCluster]:
    """Two nodes, each with sshd, its own podman storage holding the Ray image, and its own fake GPUs."""
    base = tmp_path_factory.mktemp("sshc")
    store = rayimage.image_store()
    with ssh_cluster(base, f"rq{os.getpid() % 10000}", SUBNET, image_stores=(store,)) as c:
        yield c


def _data(c: SshCluster, base: Path, **ssh: str) -> dict[str, Any]:
    data = fixtures.ray_data(standin_deployment(base, name=NAME), name=NAME, interface=IFACE)
    data["engine"]["image"] = rayimage.RAY_IMAGE
    for spec_node, n in zip(data["cluster"]["nodes"], c.nodes, strict=True):
        spec_node.update(address=n.address, ssh=f"root@{n.address}", ssh_options=c.ssh_options(**ssh))
    data["cluster"]["node_dir"] = str(base / "node-dir")
    prepare_host_dirs(data)
    return data


def _ops(c: SshCluster, base: Path, data: dict[str, Any]) -> tuple[Ops, list[str]]:
    lines: list[str] = []
    ops = Ops(write_project(base, data), target="podman", out=base / "out", env=c.env, echo=lines.append)
    return ops, lines


def _cluster(ops: Ops) -> clusterlife.Cluster:
    got = lifecycle.cluster_of(ops, NAME)
    assert got is not None
    return got


def _run_here(argv: list[str], env: dict[str, str]) -> str:
    return subprocess.run(argv, capture_output=True, text=True, env=env, timeout=60, check=False).stdout


def _containers(c: SshCluster) -> dict[str, list[str]]:
    return {n.name: n.podman("ps", "--all", "--format", "{{.Names}}").stdout.split() for n in c.nodes}


def test_up_runs_each_node_s_generated_script_over_ssh_and_the_artifacts_form_the_cluster(
    nodes: SshCluster, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    c = nodes
    data = _data(c, tmp_path)
    ops, lines = _ops(c, tmp_path, data)
    t0 = time.monotonic()
    try:
        lifecycle.up(ops, deployment=NAME, memlock=HOST_MEMLOCK, yes=True)
        formed = time.monotonic() - t0
        assert any("Ray holds all 2 nodes and 4 GPUs" in ln for ln in lines), lines
        cl = _cluster(ops)
        # The CLI as a user runs it: wait (every node's join, then the head's gates), status, logs --node.
        cli = functools.partial(invoke_cli, ops.project.root, env=c.env, timeout=WAIT_TIMEOUT + 60)
        out = ["--deployment", NAME, "--out", str(ops.out)]
        waited = cli("wait", *out, "--timeout", str(WAIT_TIMEOUT))
        assert waited.returncode == 0, waited.stdout + waited.stderr
        assert "Ray holds all 2 nodes" in waited.stdout and "ready after" in waited.stdout, waited.stdout
        print(f"up over ssh: cluster formed {formed:.1f}s, head serving {time.monotonic() - t0:.1f}s")
        shown = cli("status", *out)
        assert shown.returncode == 0, shown.stderr
        assert shown.stdout.splitlines() == [
            f"box-a (head, {SUBNET}.1, ssh root@{SUBNET}.1): running; in the Ray cluster",
            f"box-b (worker, {SUBNET}.2, ssh root@{SUBNET}.2): running; in the Ray cluster",
        ]
        worker_cli_log = cli("logs", *out, "--node", "box-b")
        assert worker_cli_log.returncode == 0, worker_cli_log.stderr
        assert f"Local node IP: {SUBNET}.2" in worker_cli_log.stdout, worker_cli_log.stdout  # box-b's own Ray
        # Each node ran its own generated run.sh, copied under cluster.node_dir, in its own podman.
        for plan_node, n in zip(cl.nodes, c.nodes, strict=True):
            copied = Path(data["cluster"]["node_dir"]) / plan_node.plan.name / "run.sh"
            assert copied.read_text() == (ops.out / "podman" / plan_node.plan.name / "run.sh").read_text()
            info = json.loads(n.podman("container", "inspect", plan_node.plan.name).stdout)[0]
            labels = info["Config"]["Labels"]
            assert labels["io.rigsmith.node"] == n.name and labels["io.rigsmith.spec-sha256"]
            assert labels["io.rigsmith.lock-sha256"] == plan_node.plan.lock_sha256[:16]
            env = dict(e.split("=", 1) for e in info["Config"]["Env"])
            assert env["FAKE_GPU_0"] == env["FAKE_GPU_1"] == f"on-{n.name}"  # this node's own CDI GPUs
            assert env["VLLM_HOST_IP"] == n.address
        assert _containers(c) == {"box-a": [f"{NAME}-box-a"], "box-b": [f"{NAME}-box-b"]}
        # The head's engine (the stand-in vllm the artifacts exec) saw the whole cluster and its argv.
        head_log = _run_here(clusterlife.logs_argv(cl, "box-a"), c.env)
        ray_line = next(ln for ln in head_log.splitlines() if ln.startswith("STANDIN-RAY "))
        assert json.loads(ray_line.split(" ", 1)[1]) == {"nodes": [f"{SUBNET}.1", f"{SUBNET}.2"], "gpus": 4.0}
        argv_line = next(ln for ln in head_log.splitlines() if ln.startswith("STANDIN-ARGV "))
        assert json.loads(argv_line.split(" ", 1)[1]) == list(lifecycle.plan_for(ops.project, NAME).command)
        assert [(s.name, s.state, s.in_ray, s.problem) for s in clusterlife.status(cl)] == [
            ("box-a", "running", True, None),
            ("box-b", "running", True, None),
        ]
        lines.clear()
        lifecycle.up(ops, deployment=NAME, memlock=HOST_MEMLOCK, yes=True)  # converged: starts nothing
        assert sum("already running" in ln for ln in lines) == 2, lines

        # Another lock: up refuses, naming each node and the label, and changes nothing.
        lock = {"version": 1, "images": {rayimage.RAY_IMAGE: {"digest": "sha256:" + "5" * 64}}}
        (ops.project.root / "rigsmith.lock").write_text(json.dumps(lock))
        before = (ops.out / "podman" / f"{NAME}-box-b" / "run.sh").read_text()
        with pytest.raises(RigsmithError) as err:
            lifecycle.up(ops, deployment=NAME, memlock=HOST_MEMLOCK, yes=True, ignore_drift=True)
        msg = err.value.message
        assert "node box-a" in msg and "node box-b" in msg and "io.rigsmith.lock-sha256" in msg, msg
        assert "invoke down" in (err.value.hint or "")
        assert (ops.out / "podman" / f"{NAME}-box-b" / "run.sh").read_text() == before
        (ops.project.root / "rigsmith.lock").unlink()

        # A node lost mid-run: status and doctor name it and the fix.
        c.cut("box-b")
        lost_cli = cli("status", *out)
        assert lost_cli.returncode == 1 and "node box-b (cluster.nodes[1].ssh" in lost_cli.stdout, lost_cli
        lost = {s.name: s for s in clusterlife.status(cl)}
        assert lost["box-a"].state == "running"
        assert lost["box-b"].state == "unreachable" and lost["box-b"].problem is not None
        what, hint = lost["box-b"].problem
        assert "node box-b (cluster.nodes[1].ssh" in what and "cannot be reached" in what
        assert "link" in hint and "cluster.nodes[1].ssh" in hint
        monkeypatch.setenv("PATH", c.env["PATH"])  # doctor reaches the nodes with this machine's env
        tables = dict(clusterdoctor.diagnose_project(ops.project, NAME, target="podman"))
        rows = tables[f"doctor: {NAME} on box-b (ssh root@{SUBNET}.2, podman)"]
        assert [(r.name, r.verdict) for r in rows] == [("reach", "no-go")]
        assert "cannot be reached" in rows[0].detail and rows[0].hint == hint
        # down stops what it reaches (the head) and names the node it cannot; once back, down finishes.
        with pytest.raises(RigsmithError) as err:
            lifecycle.down(ops, deployment=NAME)
        assert "node box-b (cluster.nodes[1].ssh" in err.value.message and "invoke down" in (
            err.value.hint or ""
        )
        assert _containers(c)["box-a"] == []
        c.mend("box-b")
    finally:
        if "box-b" in c.cut_links:
            c.mend("box-b")
        lines.clear()
        lifecycle.down(ops, deployment=NAME)
    print(f"up → wait → checks → lost node → down over ssh: {time.monotonic() - t0:.1f}s")
    stops = [ln.split()[1] for ln in lines if ln.startswith("down ") and "stopping" in ln]
    assert stops == [f"{NAME}-box-b"], lines  # the head was stopped first, by the down that named box-b
    assert lines[-1].endswith("no Ray process left"), lines
    assert _containers(c) == {"box-a": [], "box-b": []}
    assert fixtures.node_pids(f"{SUBNET}.") == [], "a Ray process outlived down"


@pytest.mark.parametrize("fault", ["wrong host key", "refused key"])
def test_up_names_the_node_ssh_will_not_reach_and_starts_nothing(
    nodes: SshCluster, tmp_path: Path, fault: str
) -> None:
    c = nodes
    if fault == "wrong host key":
        other = tmp_path / "other_host_key"
        subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(other)], check=True)
        pub = " ".join(other.with_suffix(".pub").read_text().split()[:2])
        lines = c.known_hosts.read_text().splitlines()
        known = tmp_path / "known_hosts"
        known.write_text(f"{lines[0]}\n{SUBNET}.2 {pub}\n")
        data = _data(c, tmp_path, UserKnownHostsFile=str(known))
    else:
        stranger = tmp_path / "stranger_key"
        subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(stranger)], check=True)
        data = _data(c, tmp_path)
        data["cluster"]["nodes"][1]["ssh_options"]["IdentityFile"] = str(stranger)
    ops, _lines = _ops(c, tmp_path, data)
    with pytest.raises(RigsmithError) as err:
        lifecycle.up(ops, deployment=NAME, memlock=HOST_MEMLOCK, yes=True)
    msg, hint = err.value.message, err.value.hint or ""
    assert msg.startswith("node box-b (cluster.nodes[1].ssh root@10.233.0.2)"), msg
    assert "box-a" not in msg
    if fault == "wrong host key":
        assert "host key" in msg and "known-hosts" in hint and "UserKnownHostsFile" in hint
    else:
        assert "refused this machine's key" in msg and "cluster.nodes[1].ssh_options.IdentityFile" in hint
    assert _containers(c) == {"box-a": [], "box-b": []}
    assert not (ops.out / "podman").exists()  # refused before anything was written


def test_quadlet_across_nodes_is_refused_naming_what_each_node_lacks(
    nodes: SshCluster, tmp_path: Path
) -> None:
    c = nodes
    lines: list[str] = []
    project = write_project(tmp_path, _data(c, tmp_path))
    ops = Ops(project, target="quadlet", out=tmp_path / "out", env=c.env, echo=lines.append)
    with pytest.raises(PreflightError) as err:
        lifecycle.up(ops, deployment=NAME, memlock=HOST_MEMLOCK, yes=True)
    msg = err.value.message
    for node in ("box-a", "box-b"):  # each node over its own ssh: PID 1 there is not systemd, podman 4.3
        assert f"{node}: PID 1 is " in msg and f"{NAME}-{node}.container into a service" in msg, msg
    assert msg.count("quadlet generator is not installed") == 2, msg
    assert "--target podman" in (err.value.hint or "")
    assert _containers(c) == {"box-a": [], "box-b": []} and not (tmp_path / "out").exists()
