"""The head's ports, free or not on this host: real binds on 127.0.0.1 against a real listener."""

from __future__ import annotations

import socket

from rigsmith import spec as specmod
from rigsmith.operating import portcheck
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
    try:
        data = fixtures.ray_data()
        data["cluster"]["ray_port"] = held.getsockname()[1]
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
