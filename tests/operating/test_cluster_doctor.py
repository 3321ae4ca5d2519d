"""``invoke doctor`` on a multi-node deployment (issue 15): per-node tables and the cluster view's rows,
each passing and failing. Links and clocks are probed for real in the test's network namespaces; drivers
come from the rigs' captured nvidia-smi outputs; the model from a real fetch-model against the Hub
stand-in, one node seeing another copy (its own mount namespace)."""

from __future__ import annotations

import os
import re
import shutil
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from rigsmith import spec as specmod
from rigsmith.errors import CommandError, RigsmithError, SpecError
from rigsmith.operating.cluster import doctor as clusterdoctor
from rigsmith.operating.cluster import noderun
from rigsmith.operating.cluster.doctor import Link, NodeReport
from rigsmith.operating.cluster.noderun import RemoteHost, node_hosts, ssh_host
from rigsmith.operating.host import LocalHost, gather
from rigsmith.operating.probes import CmdResult, HostFacts, ImageFacts
from rigsmith.project import Project
from rigsmith.rendering import cluster
from rigsmith.rendering import plan as planmod
from rigsmith.resolving.lock import lock as lockmod
from rigsmith.resolving.model.hub import HfHub
from rigsmith.resolving.model.modelfetch import fetch_model
from rigsmith.spec import Deployment
from tests.support import cluster as fixtures
from tests.support.common import invoke_cli, write_project
from tests.support.hubserver import HubServer
from tests.support.models import tiny_files
from tests.support.replay import ReplayHost

NODES = specmod.from_data(fixtures.ray_data()).cluster.nodes  # type: ignore[union-attr]
ADDRESSES = {n.name: n.address for n in NODES}

netns_only = pytest.mark.skipif(
    os.geteuid() != 0 or not shutil.which("ip") or not shutil.which("unshare"),
    reason="network namespaces need root, iproute2 and unshare",
)


def _report(i: int, facts: HostFacts, link: Link | None = None, clock: float = 0.0) -> NodeReport:
    node = NODES[i]
    lk = link or Link(fixtures.IFACE, "up", (node.address,))
    return NodeReport(node, "test", facts, [], lk, (clock, 0.001))


def _row(rows: list[clusterdoctor.Check], name: str) -> clusterdoctor.Check:
    return next(r for r in rows if r.name == name)


def test_same_driver_passes_on_two_identical_rigs_and_fails_on_mixed_ones() -> None:
    h200 = gather(ReplayHost("h200x2-nvlink-idle"))
    rtx = gather(ReplayHost("4x3090-idle"))
    assert h200.driver_version and rtx.driver_version and h200.driver_version != rtx.driver_version
    same = _row(clusterdoctor.cluster_rows([_report(0, h200), _report(1, h200)], ADDRESSES), "same driver")
    assert same.verdict == "go" and same.detail == f"{h200.driver_version} on all 2 nodes"
    mixed = _row(clusterdoctor.cluster_rows([_report(0, h200), _report(1, rtx)], ADDRESSES), "same driver")
    assert mixed.verdict == "no-go"
    assert mixed.detail == f"differ: box-a {h200.driver_version}, box-b {rtx.driver_version}"
    none = _row(
        clusterdoctor.cluster_rows(
            [_report(0, h200), _report(1, gather(ReplayHost("no-driver")))], ADDRESSES
        ),
        "same driver",
    )
    assert none.verdict == "no-go" and none.detail.startswith("none on box-b")


def test_same_image_needs_the_same_image_id_on_every_node() -> None:
    def facts(image_id: str | None) -> HostFacts:
        return HostFacts(
            image=ImageFacts("reg/vllm@sha256:" + "a" * 64, True, image_id is not None, image_id)
        )

    rows = clusterdoctor.cluster_rows(
        [_report(0, facts("sha256:1")), _report(1, facts("sha256:1"))], ADDRESSES
    )
    assert _row(rows, "same image").verdict == "go"
    rows = clusterdoctor.cluster_rows(
        [_report(0, facts("sha256:1")), _report(1, facts("sha256:2"))], ADDRESSES
    )
    assert _row(rows, "same image").verdict == "no-go"
    rows = clusterdoctor.cluster_rows([_report(0, facts("sha256:1")), _report(1, facts(None))], ADDRESSES)
    bad = _row(rows, "same image")
    assert bad.verdict == "no-go" and "none on box-b" in bad.detail and "podman pull" in (bad.hint or "")


def test_parse_link_reads_ip_one_line_output() -> None:
    addr = (
        f"3: {fixtures.IFACE}    inet 10.231.0.2/24 scope global {fixtures.IFACE}\\       valid_lft forever\n"
    )
    up = f"3: {fixtures.IFACE}@if4: <BROADCAST,MULTICAST,UP,LOWER_UP> mtu 1500 qdisc noqueue state UP\n"
    down = f"3: {fixtures.IFACE}@if4: <BROADCAST,MULTICAST> mtu 1500 qdisc noqueue state DOWN\n"
    assert clusterdoctor.parse_link(addr, up, None, "10.231.0.2") == Link(
        fixtures.IFACE, "up", ("10.231.0.2",)
    )
    assert clusterdoctor.parse_link(addr, down, fixtures.IFACE, "10.231.0.2").state == "down"
    lost = up.replace("UP,LOWER_UP", "UP")
    assert clusterdoctor.parse_link(addr, lost, fixtures.IFACE, "10.231.0.2").state == "no carrier"
    assert clusterdoctor.parse_link(addr, up, None, "10.9.9.9").name is None


@pytest.fixture
def pair() -> Iterator[tuple[str, str]]:
    with fixtures.two_netns(f"rd{os.getpid() % 100000}") as ns:
        yield ns


def _diagnose(pair: tuple[str, str]) -> list[clusterdoctor.Check]:
    spec = specmod.from_data(fixtures.ray_data(interface=fixtures.IFACE))
    plan = planmod.make(spec, lockmod.Lock(), spec_path="deployments/x.yaml")
    hosts = {"box-a": fixtures.netns_host(pair[0]), "box-b": fixtures.netns_host(pair[1])}
    reports, rows = clusterdoctor.diagnose(spec, lockmod.Lock(), plan, hosts, target="podman")
    assert [r.node.name for r in reports] == ["box-a", "box-b"] and all(r.checks for r in reports)
    return rows


@netns_only
def test_interface_and_clock_rows_probe_each_namespace(pair: tuple[str, str]) -> None:
    rows = _diagnose(pair)
    link = _row(rows, "NCCL interface")
    assert link.verdict == "go", link
    i = fixtures.IFACE
    assert link.detail == f"box-a {i} up with {fixtures.HEAD_IP}; box-b {i} up with {fixtures.WORKER_IP}"
    assert _row(rows, "clocks").verdict == "go"
    fixtures.ip("-n", pair[1], "link", "set", fixtures.IFACE, "down")
    link = _row(_diagnose(pair), "NCCL interface")
    # box-b's end is down; box-a's end sees its peer gone (no carrier): both named.
    assert link.verdict == "no-go"
    assert link.detail == f"box-a {i} is no carrier (the cable or the peer is down); box-b {i} is down"
    assert "ip link set DEV up" in (link.hint or "")
    fixtures.ip("-n", pair[1], "link", "set", fixtures.IFACE, "up")
    fixtures.ip("-n", pair[1], "addr", "flush", "dev", fixtures.IFACE)
    link = _row(_diagnose(pair), "NCCL interface")
    assert link.verdict == "no-go" and f"not {fixtures.WORKER_IP}" in link.detail


def test_a_node_clock_seconds_off_fails_the_clocks_row() -> None:
    here = LocalHost()
    ahead = clusterdoctor.probe_clock(here, now=lambda: time.time() - 5)  # that node runs 5 s ahead
    even = clusterdoctor.probe_clock(here)
    assert ahead and even and 4.5 < ahead[0] < 5.5 and abs(even[0]) < 0.5
    h = HostFacts()
    ok = _row(
        clusterdoctor.cluster_rows([_report(0, h, clock=even[0]), _report(1, h, clock=even[0])], ADDRESSES),
        "clocks",
    )
    assert ok.verdict == "go"
    bad = _row(
        clusterdoctor.cluster_rows([_report(0, h, clock=even[0]), _report(1, h, clock=ahead[0])], ADDRESSES),
        "clocks",
    )
    assert bad.verdict == "no-go" and "NTP" in (bad.hint or "")
    # The offsets are measured (a loaded machine reads +4.999s as well as +5.0s): the one named is ~5 s.
    named = re.search(r"box-b \+(\d+\.\d+)s", bad.detail)
    assert named and 4.5 < float(named.group(1)) < 5.5, bad.detail


@pytest.fixture
def fetched(
    hub: HubServer, client: HfHub, make_project: Callable[..., tuple[Project, Deployment]]
) -> tuple[Project, Deployment]:
    sha = hub.repo("acme/nodes").add_commit(tiny_files("nodes", shards=2, shard_size=64 * 1024), refs=())
    project, spec = make_project(name="nodes", repo="acme/nodes", revision=sha)
    fetch_model(project, spec, hub=client, echo=lambda _m: None)
    return project, spec


def test_model_row_reads_each_node_model_dir_and_names_the_node_that_differs(
    fetched, client: HfHub, tmp_path: Path
) -> None:
    if os.geteuid() != 0 or not shutil.which("unshare"):
        pytest.skip("a private mount namespace needs root and unshare")
    project, spec = fetched
    lock = lockmod.read(project.lock_path)
    root = Path(spec.model.local_dir)
    other = tmp_path / "node-b-models"
    fetch_model(project, spec, dest=other, hub=client, echo=lambda _m: None)  # box-b's own fetch
    # box-b: its own mount namespace, where its copy sits at the model path.
    bind = 'mount --bind "$1" "$2" && shift 2 && exec "$@"'
    box_b = RemoteHost(
        ("unshare", "--mount", "sh", "-c", bind, "sh", str(other), str(root)), "ns b", LocalHost()
    )
    a = clusterdoctor.node_model_facts(spec, lock, LocalHost())
    b = clusterdoctor.node_model_facts(spec, lock, box_b)
    assert a.problems == () and b.problems == () and a.checked == b.checked > 0
    rows = clusterdoctor.cluster_rows(
        [_report(0, HostFacts(model=a)), _report(1, HostFacts(model=b))], ADDRESSES
    )
    assert _row(rows, "model on every node").verdict == "go"
    (other / "model-00002-of-00002.safetensors").unlink()
    (other / "config.json").write_text("{}")
    b = clusterdoctor.node_model_facts(spec, lock, box_b)
    assert clusterdoctor.node_model_facts(spec, lock, LocalHost()).problems == ()  # box-a's dir is untouched
    rows = clusterdoctor.cluster_rows(
        [_report(0, HostFacts(model=a)), _report(1, HostFacts(model=b))], ADDRESSES
    )
    row = _row(rows, "model on every node")
    assert row.verdict == "no-go" and row.detail.startswith("box-b: 2 of")
    assert "model-00002-of-00002.safetensors: missing" in row.detail and "config.json: " in row.detail


def test_remote_host_reads_files_and_sizes_through_its_prefix(tmp_path: Path) -> None:
    (tmp_path / "d").mkdir()
    (tmp_path / "d" / "f").write_text("12345")
    host = RemoteHost(("env", "--"), "env", LocalHost())
    assert host.read(str(tmp_path / "d" / "f")) == "12345"
    assert host.listdir(str(tmp_path / "d")) == ["f"]
    assert host.size(str(tmp_path / "d" / "f")) == 5 and host.size(str(tmp_path / "d")) is None
    assert host.tree_bytes(str(tmp_path)) == 5
    there, here = host.statvfs(str(tmp_path / "not" / "yet")), LocalHost().statvfs(str(tmp_path))
    assert there and here and there[0] == here[0] and 0 < there[1] <= there[0]  # free space moves meanwhile
    assert host.read(str(tmp_path / "missing")) is None


def test_ssh_nodes_run_one_quoted_line_in_batch_mode() -> None:
    host = ssh_host("root@box-b", LocalHost())
    assert host.argv(["cat", "--", "/x y/$HOME"]) == [
        "ssh", "-o", "BatchMode=yes", "-o", "ConnectTimeout=10", "--", "root@box-b", "cat -- '/x y/$HOME'",
    ]  # fmt: skip


@pytest.mark.parametrize("bad", ["-oProxyCommand=touch /tmp/p", "root@box b", "root@box-b\n", "a@@b", ""])
def test_an_ssh_destination_that_is_not_one_is_refused_naming_the_field(bad: str) -> None:
    data = fixtures.ray_data()
    data["cluster"]["nodes"][1]["ssh"] = bad
    with pytest.raises(SpecError) as err:
        specmod.from_data(data)
    assert "cluster.nodes[1].ssh" in str(err.value) and "no leading '-'" in str(err.value)


def test_nodes_are_reached_by_ssh_here_or_named_as_unreachable() -> None:
    data = fixtures.ray_data()
    data["cluster"]["nodes"][0]["address"] = "127.0.0.1"
    data["cluster"]["nodes"][1]["ssh"] = "root@box-b"
    spec = specmod.from_data(data)
    hosts = node_hosts(spec, LocalHost())
    assert isinstance(hosts["box-a"], LocalHost) and isinstance(hosts["box-b"], RemoteHost)
    del data["cluster"]["nodes"][1]["ssh"]
    with pytest.raises(RigsmithError) as err:
        node_hosts(specmod.from_data(data), LocalHost())
    assert "box-b (10.231.0.2)" in err.value.message and "cluster.nodes[1].ssh" in (err.value.hint or "")


def test_cli_doctor_names_unreachable_nodes_and_checks_one_node_with_node_flag(tmp_path: Path) -> None:
    project = write_project(tmp_path, fixtures.ray_data())
    res = invoke_cli(project.root, "doctor", "--deployment", fixtures.RAY_NAME)
    assert res.returncode != 0 and "Traceback" not in res.stderr
    assert "cannot reach node(s) box-a (10.231.0.1), box-b (10.231.0.2)" in res.stdout + res.stderr
    res = invoke_cli(project.root, "doctor", "--deployment", fixtures.RAY_NAME, "--node", "box-b")
    out = res.stdout + res.stderr
    assert f"doctor: {fixtures.RAY_NAME} on box-b (this machine, podman)" in out and "cluster view" not in out
    assert "Traceback" not in out


def test_node_plans_unchanged_by_ssh() -> None:
    data = fixtures.ray_data()
    data["cluster"]["nodes"][1]["ssh"] = "root@box-b"
    spec = specmod.from_data(data)
    plain = specmod.from_data(fixtures.ray_data())
    base = planmod.make(spec, lockmod.Lock(), spec_path="deployments/x.yaml")
    assert [n.plan.command for n in cluster.node_plans(spec, base)] == [
        n.plan.command
        for n in cluster.node_plans(
            plain, planmod.make(plain, lockmod.Lock(), spec_path="deployments/x.yaml")
        )
    ]


def test_cli_status_and_up_name_the_nodes_they_cannot_reach(tmp_path: Path) -> None:
    project = write_project(tmp_path, fixtures.ray_data())
    for task in ("status", "up", "down"):
        res = invoke_cli(project.root, task, "--deployment", fixtures.RAY_NAME)
        out = res.stdout + res.stderr
        assert res.returncode != 0 and "Traceback" not in out, out
        assert "cannot reach node(s) box-a (10.231.0.1), box-b (10.231.0.2)" in out, out
        assert "cluster.nodes[0].ssh, cluster.nodes[1].ssh" in out, out


def test_podman_nodes_run_each_node_s_own_scripts_and_reach_into_its_container(tmp_path: Path) -> None:
    from rigsmith.operating.cluster.lifecycle import PodmanNodes

    spec = specmod.from_data(fixtures.ray_data())
    nodes = cluster.node_plans(spec, planmod.make(spec, lockmod.Lock(), spec_path="deployments/x.yaml"))
    ctl = PodmanNodes(tmp_path, "/srv/rs")
    worker = f"{fixtures.RAY_NAME}-box-b"
    here, there = LocalHost(), ssh_host("root@box-b", LocalHost())
    assert ctl.start(here, nodes[1]) == [["bash", str(tmp_path / "podman" / worker / "run.sh")]]
    assert ctl.stop(here, nodes[1], 30) == [["bash", str(tmp_path / "podman" / worker / "stop.sh")]]
    # A node reached over ssh runs the copies `stage` put under cluster.node_dir there.
    assert ctl.start(there, nodes[1]) == [["bash", f"/srv/rs/{worker}/run.sh"]]
    assert ctl.stop(there, nodes[1], 30) == [["bash", f"/srv/rs/{worker}/stop.sh"]]
    assert ctl.exec(nodes[0], ["python3", "-c", "x"]) == [
        "podman",
        "exec",
        f"{fixtures.RAY_NAME}-box-a",
        "python3",
        "-c",
        "x",
    ]
    # No such container on this machine's podman: the node reads as absent.
    assert ctl.state(LocalHost({"PATH": os.environ["PATH"]}), nodes[1]) == "absent"


def test_ssh_options_become_o_words_before_the_defaults_so_batch_mode_stays_on() -> None:
    host = ssh_host("root@box-b", LocalHost(), {"IdentityFile": "/k/id", "ConnectTimeout": "4"})
    assert host.argv(["true"]) == [
        "ssh", "-o", "BatchMode=yes", "-o", "IdentityFile=/k/id", "-o", "ConnectTimeout=4",
        "-o", "ConnectTimeout=10", "--", "root@box-b", "true",
    ]  # fmt: skip


@pytest.mark.parametrize(
    ("options", "says"),
    [
        ({"ProxyCommand": "touch /tmp/p"}, "'ProxyCommand' is not one of the ssh options"),
        ({"LocalCommand": "x"}, "'LocalCommand' is not one of the ssh options"),
        ({"IdentityFile": "/k/id\n-oProxyCommand=x"}, "IdentityFile: "),
        ({"Port": ""}, "Port: '' is not a port number"),
    ],
)
def test_an_ssh_option_that_could_run_a_command_or_inject_one_is_refused(
    options: dict[str, str], says: str
) -> None:
    data = fixtures.ray_data()
    data["cluster"]["nodes"][1]["ssh_options"] = options
    with pytest.raises(SpecError) as err:
        specmod.from_data(data)
    assert "cluster.nodes[1].ssh_options" in str(err.value) and says in str(err.value), str(err.value)


@pytest.mark.parametrize(
    ("stderr", "says", "fix"),
    [
        ("@@@ WARNING: REMOTE HOST IDENTIFICATION HAS CHANGED! @@@\nHost key verification failed.\n",
         "its host key is not the one", "cluster.nodes[1].ssh_options.UserKnownHostsFile"),
        ("root@10.0.0.2: Permission denied (publickey).\n", "refused this machine's key",
         "cluster.nodes[1].ssh_options.IdentityFile"),
        ("ssh: connect to host 10.0.0.2 port 22: No route to host\n", "cannot be reached over ssh",
         "its link"),
    ],
)  # fmt: skip
def test_ssh_s_own_failures_become_one_paragraph_naming_the_node_and_the_fix(
    stderr: str, says: str, fix: str
) -> None:
    data = fixtures.ray_data()
    data["cluster"]["nodes"][1]["ssh"] = "root@10.0.0.2"
    spec = specmod.from_data(data)
    found = noderun.ssh_problem(spec, "box-b", CmdResult(255, "", stderr))
    assert found is not None
    what, hint = found
    assert what.startswith("node box-b (cluster.nodes[1].ssh root@10.0.0.2)") and says in what
    assert fix in hint
    assert noderun.ssh_problem(spec, "box-b", CmdResult(1, "", "cat: x: No such file")) is None  # not ssh's


def test_what_a_node_says_over_ssh_reaches_the_terminal_escaped() -> None:
    # A node (or whatever answers at its address) controls ssh's stderr: a terminal escape or a carriage
    # return in it must not recolour, clear or overwrite the user's screen, nor forge a line of ours.
    data = fixtures.ray_data()
    data["cluster"]["nodes"][1]["ssh"] = "root@10.0.0.2"
    spec = specmod.from_data(data)
    hostile = "kex_exchange_identification: \x1b[2J\x1b]0;pwned\x07\rerror: all good\x9b31m\n"
    found = noderun.ssh_problem(spec, "box-b", CmdResult(255, "", hostile))
    assert found is not None
    what, _ = found
    assert not any(c in what for c in "\x1b\x07\r\x9b"), what
    assert "\\x1b[2J" in what and "\\x9b31m" in what and "kex_exchange_identification" in what
    err = CommandError(["ssh", "box-b", "true"], 255, "first\n" + hostile)
    assert not any(c in str(err) for c in "\x1b\x07\r\x9b"), str(err)
    assert "  | first" in str(err) and "\\x1b]0;pwned\\x07" in str(err)
