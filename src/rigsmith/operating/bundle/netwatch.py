"""A network namespace with no route out, and a log of what tried to leave it (``up --offline``).

The namespace holds only ``lo``, with every address routed to it (``ip route add local 0.0.0.0/0 dev lo``:
the "AnyIP" local route). Nothing can leave it, and a connection out is refused at once instead of hanging
in SYN retries, so an engine that reaches for the Hub fails fast, as on an air-gapped rig. Inside, two
listeners name the attempts (host:port):

- a DNS responder on the nameserver addresses of /etc/resolv.conf (podman copies that file into a
  ``--network host`` container) answers every A query with a sinkhole address of 198.18.0.0/15 (RFC 2544,
  never routed) and remembers which name got which address;
- a packet socket on ``lo`` sees every outgoing TCP SYN and UDP datagram; one to an address outside
  127.0.0.0/8 and ::1 is an attempt out, named by the name the responder handed that address to.

Threads enter the namespace with setns(2) (network namespaces are per thread; Python 3.11 has no os.setns,
hence ctypes); the sockets they open stay in it. Needs root (CAP_SYS_ADMIN and CAP_NET_RAW), as
``ip netns`` does.
"""

from __future__ import annotations

import contextlib
import ctypes
import ipaddress
import os
import re
import select
import socket
import struct
import threading
from collections.abc import Callable, Iterator
from concurrent.futures import BrokenExecutor, ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import TypeVar

from rigsmith.errors import PreflightError
from rigsmith.operating.host import LocalHost

T = TypeVar("T")
NETNS_DIR = Path("/run/netns")
CLONE_NEWNET = 0x40000000
ETH_P_ALL = 0x0003
PACKET_OUTGOING = 4
SINKHOLE = ipaddress.IPv4Address("198.18.0.0")
SINKHOLE_SIZE = 1 << 17  # 198.18.0.0/15: past it, an address would be a real one
#: podman copies it into a ``--network host`` container: its nameservers are where the engine asks.
RESOLV_CONF = Path("/etc/resolv.conf")
_NAMESERVER = re.compile(r"^\s*nameserver\s+(\d+\.\d+\.\d+\.\d+)\s*$", re.M)


# -- pure: DNS and frames --------------------------------------------------------------------------------


@dataclass(frozen=True)
class Query:
    """One DNS question: transaction id, name, type (1 = A, 28 = AAAA), and the question's bytes."""

    ident: int
    name: str
    qtype: int
    question: bytes


def parse_query(data: bytes) -> Query | None:
    """The first question of a DNS query; None for anything else (a response, a truncated packet)."""
    if len(data) < 12:
        return None
    ident, flags, qdcount = struct.unpack("!HHH", data[:6])
    if flags & 0x8000 or qdcount < 1:
        return None
    labels, i = [], 12
    while i < len(data) and data[i] != 0:
        n = data[i]
        if n & 0xC0 or i + 1 + n > len(data):
            return None
        labels.append(_label(data[i + 1 : i + 1 + n]))
        i += 1 + n
    if i + 5 > len(data):
        return None
    qtype = struct.unpack("!H", data[i + 1 : i + 3])[0]
    return Query(ident, ".".join(labels).lower(), qtype, data[12 : i + 5])


#: Label bytes kept as they are; any other byte is written ``\\DDD`` (RFC 1035 presentation format), so a
#: name a hostile engine asks for reaches rigsmith's messages as plain text (no escape sequence, no ':').
_LABEL_SAFE = frozenset(b"abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789-_")


def _label(raw: bytes) -> str:
    return "".join(chr(b) if b in _LABEL_SAFE else f"\\{b:03d}" for b in raw)


def reply(q: Query, addr: ipaddress.IPv4Address | None) -> bytes:
    """A NOERROR answer to ``q``: ``addr`` for an A question, no records for any other type."""
    answers = 1 if addr is not None and q.qtype == 1 else 0
    out = struct.pack("!HHHHHH", q.ident, 0x8180, 1, answers, 0, 0) + q.question
    if answers and addr is not None:
        out += struct.pack("!HHHIH", 0xC00C, 1, 1, 0, 4) + addr.packed
    return out


@dataclass(frozen=True)
class Packet:
    """An outgoing TCP connection attempt or UDP datagram, by protocol and destination."""

    proto: str  # tcp | udp
    dst: str
    port: int
    src: tuple[str, int]  # the sender (address, port): the DNS responder's answers are not attempts


def parse_frame(frame: bytes) -> Packet | None:
    """A TCP SYN (without ACK) or a UDP datagram in an Ethernet frame as ``lo`` gives it; else None."""
    if len(frame) < 14:
        return None
    ethertype = struct.unpack("!H", frame[12:14])[0]
    ip = frame[14:]
    if ethertype == 0x0800 and len(ip) >= 20:
        proto, start = ip[9], (ip[0] & 0x0F) * 4
        src, dst = str(ipaddress.IPv4Address(ip[12:16])), str(ipaddress.IPv4Address(ip[16:20]))
    elif ethertype == 0x86DD and len(ip) >= 40:
        proto, start = ip[6], 40
        src, dst = str(ipaddress.IPv6Address(ip[8:24])), str(ipaddress.IPv6Address(ip[24:40]))
    else:
        return None
    l4 = ip[start:]
    if (proto == 6 and len(l4) >= 14 and l4[13] & 0x12 == 0x02) or (proto == 17 and len(l4) >= 8):
        sport, dport = struct.unpack("!HH", l4[:4])
        return Packet("tcp" if proto == 6 else "udp", dst, dport, (src, sport))
    return None


def resolv_conf() -> str:
    """This host's resolv.conf text ("" where there is none: glibc then asks 127.0.0.1)."""
    return RESOLV_CONF.read_text() if RESOLV_CONF.is_file() else ""


def nameservers(resolv_conf: str) -> list[str]:
    """The IPv4 nameservers of a resolv.conf, and 127.0.0.1 (glibc's default when it names none)."""
    found = [a for a in _NAMESERVER.findall(resolv_conf) if _ipv4(a)]
    return list(dict.fromkeys([*found, "127.0.0.1"]))


def _ipv4(text: str) -> bool:
    """A dotted quad that is an address (``999.1.1.1`` or ``010.0.0.1`` is not one to bind)."""
    try:
        ipaddress.IPv4Address(text)
    except ValueError:
        return False
    return True


# -- the namespace ---------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Netns:
    """A named network namespace (``ip netns``): only ``lo``, every address local to it."""

    name: str

    @property
    def path(self) -> Path:
        return NETNS_DIR / self.name

    def enter_argv(self) -> list[str]:
        """The prefix that runs a command inside it (network only: the mounts stay the host's, so podman's
        storage and state are the ones ``down`` and ``logs`` see)."""
        return ["nsenter", f"--net={self.path}"]

    def create(self, host: LocalHost) -> None:
        """Make it anew (an old one of this name is dropped first)."""
        self.delete(host)
        steps = [
            ["ip", "netns", "add", self.name],
            ["ip", "-n", self.name, "link", "set", "lo", "up"],
            ["ip", "-n", self.name, "route", "add", "local", "0.0.0.0/0", "dev", "lo"],
            ["ip", "-n", self.name, "-6", "route", "add", "local", "::/0", "dev", "lo"],
        ]
        for argv in steps:
            res = host.run(argv)
            if res.code == 127:
                raise PreflightError(
                    f"{argv[0]} is not installed: up --offline cannot make a namespace with no route out",
                    hint="install iproute2 (ip) and util-linux (nsenter)",
                )
            if res.code != 0:
                self.delete(host)
                raise PreflightError(
                    f"up --offline: `{' '.join(argv)}` failed ({res.code}): {res.stderr.strip()}",
                    hint="making a network namespace needs root (CAP_SYS_ADMIN); run it as root",
                )

    def delete(self, host: LocalHost) -> None:
        if self.path.exists():
            host.run(["ip", "netns", "delete", self.name])


def _enter(path: Path) -> None:
    libc = ctypes.CDLL(None, use_errno=True)
    fd = os.open(path, os.O_RDONLY)
    try:
        if libc.setns(fd, CLONE_NEWNET) != 0:
            err = ctypes.get_errno()
            raise OSError(err, f"setns {path}: {os.strerror(err)}")
    finally:
        os.close(fd)


@contextmanager
def inside(ns: Netns) -> Iterator[Callable[[Callable[[], T]], T]]:
    """``call(fn)`` runs ``fn`` on a thread inside ``ns`` (its sockets are the namespace's)."""
    with ThreadPoolExecutor(max_workers=1, initializer=_enter, initargs=(ns.path,)) as pool:

        def call(fn: Callable[[], T]) -> T:
            return pool.submit(fn).result()

        yield call


# -- the watch -------------------------------------------------------------------------------------------


@dataclass
class Watch:
    """Names every attempt out of a namespace while it runs (a context manager; see the module doc)."""

    ns: Netns
    resolv_conf: str
    names: dict[str, str] = field(default_factory=dict)  # sinkhole address → name asked for
    _given: dict[str, str] = field(default_factory=dict)  # name → its sinkhole address
    _asked: set[str] = field(default_factory=set)  # the names of looked_up
    looked_up: list[str] = field(default_factory=list)
    attempts: list[str] = field(default_factory=list)  # host:port, in order, once each
    _socks: list[socket.socket] = field(default_factory=list)
    _stop: threading.Event = field(default_factory=threading.Event)
    _threads: list[threading.Thread] = field(default_factory=list)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def __enter__(self) -> Watch:
        servers = nameservers(self.resolv_conf)
        try:
            with inside(self.ns) as call:
                self._socks = [call(lambda a=a: _udp(a)) for a in servers]  # type: ignore[misc]
                raw = call(_packet_socket)
        except (OSError, BrokenExecutor) as err:
            for s in self._socks:
                s.close()
            raise PreflightError(
                f"up --offline: cannot watch namespace {self.ns.name} for attempts out ({err})",
                hint="it needs root: CAP_SYS_ADMIN to enter the namespace, CAP_NET_RAW for the packet socket",
            ) from None
        dns = list(self._socks)
        self._socks.append(raw)
        for s in dns:
            self._spawn(lambda s=s: self._serve_dns(s))  # type: ignore[misc]
        self._spawn(lambda: self._sniff(raw, {(a, 53) for a in servers}))
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        for t in self._threads:
            t.join()
        for s in self._socks:
            s.close()

    def _spawn(self, fn: Callable[[], None]) -> None:
        t = threading.Thread(target=fn, daemon=True)
        t.start()
        self._threads.append(t)

    def _ready(self, s: socket.socket) -> bool:
        """Wait for data on ``s``; after stop, take only what is already queued (nothing is lost)."""
        while True:
            stopping = self._stop.is_set()
            if select.select([s], [], [], 0 if stopping else 0.1)[0]:
                return True
            if stopping:
                return False

    def _serve_dns(self, s: socket.socket) -> None:
        while self._ready(s):
            # A datagram that cannot be read or answered is dropped, never the end of the responder.
            with contextlib.suppress(OSError):
                data, peer = s.recvfrom(4096)
                q = parse_query(data)
                if q is not None:
                    s.sendto(reply(q, self._sinkhole(q.name)), peer)

    def _sinkhole(self, name: str) -> ipaddress.IPv4Address | None:
        """The sinkhole address handed to ``name`` (the same one each time); None once the /15 is used up
        (then the name is still recorded as looked up, and answered with no address)."""
        with self._lock:
            if name not in self._asked:  # a set: an engine asking endless names costs no quadratic scan
                self._asked.add(name)
                self.looked_up.append(name)
            addr = self._given.get(name)
            if addr is None and len(self.names) < SINKHOLE_SIZE - 2:
                addr = str(SINKHOLE + len(self.names) + 1)
                self.names[addr], self._given[name] = name, addr
        return None if addr is None else ipaddress.IPv4Address(addr)

    def _sniff(self, s: socket.socket, dns: set[tuple[str, int]]) -> None:
        while self._ready(s):
            try:
                frame, meta = s.recvfrom(65535)
            except OSError:
                continue
            p = parse_frame(frame) if meta[2] == PACKET_OUTGOING else None
            if p is None or ipaddress.ip_address(p.dst).is_loopback or {(p.dst, p.port), p.src} & dns:
                continue
            with self._lock:
                name = self.names.get(p.dst, p.dst if ":" not in p.dst else f"[{p.dst}]")
                what = f"{name}:{p.port}" + ("/udp" if p.proto == "udp" else "")
                if what not in self.attempts:
                    self.attempts.append(what)

    def lookups_only(self) -> list[str]:
        """Names looked up but never connected to (a lookup alone sends nothing past the namespace)."""
        with self._lock:
            reached = {a.rsplit(":", 1)[0] for a in self.attempts}
            return [n for n in self.looked_up if n not in reached]

    def named(self) -> list[str]:
        """Every attempt out, host:port; a name looked up but never connected to, as 'NAME (DNS lookup)'."""
        with self._lock:
            attempts = list(self.attempts)
        return [*attempts, *(f"{n} (DNS lookup)" for n in self.lookups_only())]


def _udp(addr: str) -> socket.socket:
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    with contextlib.suppress(OSError):
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    s.bind((addr, 53))
    return s


def _packet_socket() -> socket.socket:
    s = socket.socket(socket.AF_PACKET, socket.SOCK_RAW, socket.htons(ETH_P_ALL))
    s.bind(("lo", 0))
    return s
