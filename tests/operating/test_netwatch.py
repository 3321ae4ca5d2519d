"""The namespace with no route out and its watch (operating/netwatch.py): DNS and frame parsing on captured
bytes, then a real namespace this test makes, where a lookup and a connection out are named host:port."""

from __future__ import annotations

import ipaddress
import socket
import struct
from collections.abc import Iterator

import pytest

from rigsmith.errors import PreflightError
from rigsmith.operating.bundle import netwatch
from rigsmith.operating.host import LocalHost
from tests.support.common import require

#: A glibc A query for huggingface.co (id 0x1234, recursion desired), as it leaves a resolver.
QUERY = bytes.fromhex("123401000001000000000000") + b"\x0bhuggingface\x02co\x00" + b"\x00\x01\x00\x01"


def test_a_query_is_parsed_and_answered_with_the_sinkhole_address() -> None:
    q = netwatch.parse_query(QUERY)
    assert q is not None and (q.ident, q.name, q.qtype) == (0x1234, "huggingface.co", 1)
    answer = netwatch.reply(q, ipaddress.IPv4Address("198.18.0.7"))
    ident, flags, qd, an = struct.unpack("!HHHH", answer[:8])
    assert (ident, flags & 0x8000, flags & 0x000F, qd, an) == (0x1234, 0x8000, 0, 1, 1)
    assert answer.endswith(bytes([198, 18, 0, 7]))
    aaaa = netwatch.parse_query(QUERY[:-4] + b"\x00\x1c\x00\x01")
    assert aaaa is not None and struct.unpack("!H", netwatch.reply(aaaa, None)[6:8])[0] == 0  # no records


@pytest.mark.parametrize("data", [b"", QUERY[:11], QUERY[:20], b"\x12\x34\x81\x80" + QUERY[4:]])
def test_a_truncated_packet_or_a_response_is_no_query(data: bytes) -> None:
    assert netwatch.parse_query(data) is None


def _frame(src: str, dst: str, proto: int, l4: bytes) -> bytes:
    ip = bytes([0x45, 0, 0, 40, 0, 0, 0, 0, 64, proto, 0, 0]) + socket.inet_aton(src) + socket.inet_aton(dst)
    return b"\x00" * 12 + b"\x08\x00" + ip + l4


def test_a_syn_and_a_datagram_are_attempts_an_ack_is_not() -> None:
    syn = struct.pack("!HHIIBBHHH", 40000, 443, 0, 0, 0x50, 0x02, 0, 0, 0)
    ack = struct.pack("!HHIIBBHHH", 40000, 443, 0, 0, 0x50, 0x12, 0, 0, 0)
    udp = struct.pack("!HHHH", 5000, 123, 8, 0)
    assert netwatch.parse_frame(_frame("127.0.0.1", "198.18.0.1", 6, syn)) == netwatch.Packet(
        "tcp", "198.18.0.1", 443, ("127.0.0.1", 40000)
    )
    assert netwatch.parse_frame(_frame("127.0.0.1", "198.18.0.1", 6, ack)) is None
    assert netwatch.parse_frame(_frame("10.0.0.1", "1.2.3.4", 17, udp)) == netwatch.Packet(
        "udp", "1.2.3.4", 123, ("10.0.0.1", 5000)
    )
    assert netwatch.parse_frame(b"\x00" * 12 + b"\x08\x06" + b"\x00" * 28) is None  # ARP


def test_nameservers_come_from_resolv_conf_and_glibc_default() -> None:
    text = "search lan\nnameserver 10.255.255.53\nnameserver fe80::1\n# nameserver 9.9.9.9\n"
    assert netwatch.nameservers(text) == ["10.255.255.53", "127.0.0.1"]


@pytest.fixture
def ns(request: pytest.FixtureRequest) -> Iterator[netwatch.Netns]:
    require("ip")
    n = netwatch.Netns(f"rs-test-{request.node.name[-12:].replace('_', '-')}")
    n.create(LocalHost())
    yield n
    n.delete(LocalHost())
    assert not n.path.exists()


def test_a_lookup_and_connections_out_of_the_namespace_are_refused_and_named(ns: netwatch.Netns) -> None:
    def reach_out() -> list[str]:
        seen = []
        host, port = socket.getaddrinfo("huggingface.co", 443, type=socket.SOCK_STREAM)[0][4][:2]
        for addr in ((host, port), ("203.0.113.9", 8080), ("127.0.0.1", 1)):
            try:
                socket.create_connection(addr, timeout=10).close()
            except OSError as err:
                seen.append(type(err).__name__)
        socket.getaddrinfo("cdn-lfs.hf.co", 443)
        return seen

    with netwatch.Watch(ns, netwatch.resolv_conf()) as watch, netwatch.inside(ns) as call:
        refused = call(reach_out)
    assert refused == ["ConnectionRefusedError"] * 3  # at once: no route out, nothing hangs
    assert watch.named() == ["huggingface.co:443", "203.0.113.9:8080", "cdn-lfs.hf.co (DNS lookup)"]
    assert watch.attempts == ["huggingface.co:443", "203.0.113.9:8080"]  # what fails a proof
    assert watch.lookups_only() == ["cdn-lfs.hf.co"]


def test_the_namespace_holds_only_loopback(ns: netwatch.Netns) -> None:
    out = LocalHost().run(["ip", "-n", ns.name, "-o", "link", "show"])
    assert [ln.split(":")[1].strip() for ln in out.stdout.splitlines()] == ["lo"]


def test_a_namespace_that_cannot_be_entered_is_one_clear_error() -> None:
    with pytest.raises(PreflightError) as caught, netwatch.Watch(netwatch.Netns("rs-test-none-such"), ""):
        pass
    assert "cannot watch namespace rs-test-none-such for attempts out" in caught.value.message
    assert caught.value.hint and "root" in caught.value.hint
