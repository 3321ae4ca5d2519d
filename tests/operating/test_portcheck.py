"""The head's ports, free or not on this host: real binds on 127.0.0.1 against a real listener."""

from __future__ import annotations

import socket

import pytest

from rigsmith import spec as specmod
from rigsmith.errors import RigsmithError
from rigsmith.operating.cluster import lifecycle as clusterlife
from rigsmith.operating.cluster import portcheck
from rigsmith.operating.host import LocalHost
from rigsmith.rendering import plan as planmod
from rigsmith.rendering.cluster import NodePlan, node_plans
from rigsmith.resolving.lock import lock as lockmod
from tests.support import cluster as fixtures


def _listener() -> socket.socket:
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    s.listen()
    return s


def test_a_port_a_server_listens_on_is_busy_and_a_closed_one_is_free() -> None:
    held = _listener()
    free = _listener()
    free_port = free.getsockname()[1]
    free.close()
    try:
        port = held.getsockname()[1]
        found = portcheck.busy({"network.port": port, "cluster.ray_port": free_port}, "127.0.0.1")
        assert found == [("network.port", port, "in use")]
        # The wildcard address collides with a listener on loopback too (what the head binds).
        assert [w for w, _, _ in portcheck.busy({"network.port": port})] == ["network.port"]
    finally:
        held.close()
    assert portcheck.busy({"network.port": port}, "127.0.0.1") == []


def test_head_port_problems_name_the_spec_field_of_each_busy_port() -> None:
    held = _listener()
    spare = _listener()  # the API port: one no other process on this machine holds (not the fixture's 8000)
    api_port = spare.getsockname()[1]
    spare.close()
    try:
        data = fixtures.ray_data()
        data["cluster"]["ray_port"] = held.getsockname()[1]
        data["network"] = {**data.get("network", {}), "port": api_port}
        spec = specmod.from_data(data)
        found = portcheck.head_port_problems(spec, "127.0.0.1")
        assert [f for f, _ in found] == ["cluster.ray_port"]
        assert f"port {held.getsockname()[1]} on 127.0.0.1 is in use" in found[0][1]
    finally:
        held.close()
    assert portcheck.head_port_problems(spec, "127.0.0.1") == []
    one = fixtures.ray_data()
    del one["cluster"]
    assert portcheck.head_port_problems(specmod.from_data(one), "127.0.0.1") == []


class _Recorded:
    """A NodeControl that starts nothing and records what it was asked to start."""

    def __init__(self) -> None:
        self.started: list[str] = []

    def stage(self, host: object, node: NodePlan) -> None:
        return None

    def start(self, host: object, node: NodePlan) -> list[list[str]]:
        self.started.append(node.node.name)
        return []

    def state(self, host: object, node: NodePlan) -> str:
        return "absent"

    def clear(self, node: NodePlan) -> list[list[str]]:
        return []


def test_up_on_the_head_refuses_a_busy_port_before_starting_anything() -> None:
    held = socket.socket()
    held.bind(("0.0.0.0", 0))
    held.listen()
    try:
        data = fixtures.ray_data()
        data["network"] = {**data.get("network", {}), "port": held.getsockname()[1]}
        spec = specmod.from_data(data)
        plan = planmod.make(spec, lockmod.Lock(), spec_path="x.yaml", image="localhost/x:1")
        nodes = node_plans(spec, plan)
        control = _Recorded()
        hosts = {n.node.name: LocalHost() for n in nodes}
        c = clusterlife.Cluster(spec, nodes, hosts, control, echo=lambda _m: None)  # type: ignore[arg-type]
        with pytest.raises(RigsmithError, match=r"network\.port: port \d+ on 0\.0\.0\.0 is in use"):
            clusterlife.start(c)
        assert control.started == []
    finally:
        held.close()
    clusterlife.start(c)  # free again: the head and the worker start
    assert control.started == [n.node.name for n in nodes]
