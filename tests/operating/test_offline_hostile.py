"""Red team of ``up --offline`` (issue 29): the engine under proof is untrusted, so the bytes it sends to the
watch's DNS responder and packet socket are hostile; the namespace made from the deployment name must be one
``ip netns`` takes; and a failure at any step leaves no namespace behind."""

from __future__ import annotations

import ipaddress
import re
import socket
import struct
from collections.abc import Sequence

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rigsmith.errors import PreflightError
from rigsmith.operating.bundle import netwatch, offline
from rigsmith.operating.host import LocalHost
from rigsmith.operating.probes import CmdResult
from tests.support.common import require

#: A name as the watch reports it: safe label characters, '.' between labels, \DDD for any other byte.
_REPORTED = re.compile(r"^(?:[a-z0-9_-]|\\[0-9]{3}|\.)*\Z")


def _query(labels: list[bytes], qtype: int = 1) -> bytes:
    name = b"".join(bytes([len(x)]) + x for x in labels) + b"\x00"
    return bytes.fromhex("beef01000001000000000000") + name + struct.pack("!HH", qtype, 1)


@settings(max_examples=400, deadline=None)
@given(st.binary(max_size=600))
def test_no_bytes_make_the_dns_parser_raise(data: bytes) -> None:
    q = netwatch.parse_query(data)
    assert q is None or _REPORTED.match(q.name), q


@settings(max_examples=300, deadline=None)
@given(
    labels=st.lists(st.binary(min_size=1, max_size=63), min_size=1, max_size=6), qtype=st.integers(0, 65535)
)
def test_a_hostile_name_is_reported_as_plain_text_and_answered(labels: list[bytes], qtype: int) -> None:
    """Escape sequences, ':' or '.' inside a label, NUL: the name rigsmith prints holds none of them raw."""
    q = netwatch.parse_query(_query(labels, qtype))
    assert q is not None and _REPORTED.match(q.name) and q.name.count(".") == len(labels) - 1
    assert "\x1b" not in q.name and ":" not in q.name
    answer = netwatch.reply(q, ipaddress.IPv4Address("198.18.0.9"))
    assert answer[:2] == b"\xbe\xef" and struct.unpack("!H", answer[6:8])[0] == (1 if qtype == 1 else 0)


def test_an_escape_sequence_in_a_looked_up_name_never_reaches_a_message() -> None:
    q = netwatch.parse_query(_query([b"\x1b[2J\x1b]0;owned\x07", b"hub:443", b"co"]))
    assert q is not None and q.name == r"\027\0912j\027\0930\059owned\007.hub\058443.co"


_ETHER = st.sampled_from([b"\x08\x00", b"\x86\xdd", b"\x08\x06", b"\x00\x00"])


@settings(max_examples=400, deadline=None)
@given(head=st.binary(min_size=12, max_size=12), ether=_ETHER, rest=st.binary(max_size=120))
def test_no_frame_makes_the_packet_parser_raise(head: bytes, ether: bytes, rest: bytes) -> None:
    p = netwatch.parse_frame(head + ether + rest)
    assert p is None or (p.proto in ("tcp", "udp") and 0 <= p.port <= 65535 and ipaddress.ip_address(p.dst))


@settings(max_examples=200, deadline=None)
@given(st.binary(max_size=80))
def test_no_short_or_odd_frame_makes_the_packet_parser_raise(frame: bytes) -> None:
    netwatch.parse_frame(frame)


@settings(max_examples=300, deadline=None)
@given(st.text(max_size=300))
def test_nameservers_are_addresses_whatever_resolv_conf_holds(text: str) -> None:
    found = netwatch.nameservers(text)
    assert found[-1] == "127.0.0.1" and all(ipaddress.IPv4Address(a) for a in found)


def test_a_nameserver_that_is_no_address_is_not_bound() -> None:
    text = "nameserver 999.1.1.1\nnameserver 010.0.0.1\nnameserver 10.0.0.53\n"
    assert netwatch.nameservers(text) == ["10.0.0.53", "127.0.0.1"]


def test_the_sinkhole_never_hands_out_an_address_past_its_range() -> None:
    """An engine asking for endless distinct names gets addresses of 198.18.0.0/15 only, then no address;
    every name stays recorded as looked up."""
    w = netwatch.Watch(netwatch.Netns("unused"), "")
    net = ipaddress.IPv4Network("198.18.0.0/15")
    given_out = [w._sinkhole(f"n{i}.example") for i in range(netwatch.SINKHOLE_SIZE)]
    assert all(a in net for a in given_out if a is not None)
    assert given_out[-1] is None and len(set(given_out) - {None}) == netwatch.SINKHOLE_SIZE - 2
    assert w._sinkhole("n7.example") == given_out[7]  # the same name, the same address
    assert len(w.looked_up) == netwatch.SINKHOLE_SIZE


def test_the_namespace_of_the_longest_deployment_name_is_one_ip_netns_takes() -> None:
    require("ip")
    ns = offline.namespace("a" + "b-._" * 15 + "zz")  # 63 characters, every kind NAME_RE allows
    local = LocalHost()
    try:
        ns.create(local)
        assert (
            ns.path.exists() and local.run(["ip", "-n", ns.name, "route", "show", "table", "local"]).code == 0
        )
    finally:
        ns.delete(local)
    assert not ns.path.exists()


class _FailsAt(LocalHost):
    """This machine, except that the ``k``-th ``ip`` command of a namespace's making fails."""

    def __init__(self, k: int) -> None:
        super().__init__()
        self.k, self.seen = k, 0

    def run(self, argv: Sequence[str]) -> CmdResult:
        if argv[0] == "ip" and list(argv[1:3]) != ["netns", "delete"]:
            self.seen += 1
            if self.seen == self.k:
                return CmdResult(2, "", "RTNETLINK answers: Operation not permitted")
        return super().run(argv)


@pytest.mark.parametrize("k", [1, 2, 3, 4])
def test_a_namespace_that_fails_at_any_step_of_its_making_is_not_left_behind(k: int) -> None:
    require("ip")
    ns = netwatch.Netns("rigsmith-rt2-fail")
    with pytest.raises(PreflightError) as err:
        ns.create(_FailsAt(k))
    assert "failed (2)" in err.value.message and not ns.path.exists()


def test_a_stop_interrupted_after_the_proof_still_drops_the_namespace() -> None:
    """Ctrl-C (or any non-rigsmith error) while the proof stops the engine: the namespace goes anyway."""
    require("ip")
    ns, local = netwatch.Netns("rigsmith-rt2-stop"), LocalHost()
    ns.create(local)

    class _Ops:
        echo = staticmethod(print)

        @staticmethod
        def run(argv: Sequence[str]) -> CmdResult:
            raise KeyboardInterrupt

    try:
        with pytest.raises(KeyboardInterrupt):
            offline._stop(_Ops(), "x", ns, local)  # type: ignore[arg-type]
        assert not ns.path.exists()
    finally:
        ns.delete(local)


def test_hostile_datagrams_do_not_stop_the_watch_s_dns_responder() -> None:
    """The responder keeps answering after a datagram it cannot parse (garbage first, then a real query)."""
    require("ip")
    ns, local = netwatch.Netns("rigsmith-rt2-dns"), LocalHost()
    ns.create(local)
    try:
        with (
            netwatch.Watch(ns, "nameserver 999.9.9.9\nnameserver 10.9.9.53\n") as w,
            netwatch.inside(ns) as call,
        ):

            def ask() -> bytes:
                s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
                s.settimeout(30)  # a bound on an answer that comes at once; not a wait on time
                for junk in (b"", b"\xff" * 11, b"\x00" * 12 + b"\xc0\x0c", _query([b"\x1b[31m"], 28)[:-3]):
                    s.sendto(junk, ("10.9.9.53", 53))
                s.sendto(_query([b"hub\x1b", b"example"]), ("10.9.9.53", 53))
                data = s.recv(512)
                s.close()
                return data

            data = call(ask)
        assert data[:2] == b"\xbe\xef" and data[-4:-2] == b"\xc6\x12"  # 198.18.x.x
        assert w.looked_up == ["hub\\027.example"]
    finally:
        ns.delete(local)
    assert not ns.path.exists()
