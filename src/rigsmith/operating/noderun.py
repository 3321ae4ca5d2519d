"""Reaching each node of a multi-node deployment (issue 15): one Host per node, on top of ``LocalHost``.

A node is this machine (``LocalHost`` itself), a machine reached with ``ssh -o BatchMode=yes DEST``
(``cluster.nodes[].ssh``), or anything else that runs argv "there" when put in front of it (tests use
``ip netns exec NS``). ``RemoteHost`` turns every Host method into a command run through that prefix, so the
probes, the doctor and the lifecycle see the node's own files, processes and tools. ssh joins its words
into one remote shell line, so the argv is quoted with ``shlex.join`` for it; other prefixes exec argv as is.
"""

from __future__ import annotations

import shlex
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from rigsmith.errors import RigsmithError
from rigsmith.operating.host import Host, LocalHost
from rigsmith.operating.probes import CmdResult
from rigsmith.spec import ClusterNode, Deployment

if TYPE_CHECKING:
    from rigsmith.resolving.modelfiles import Seen

#: ssh never prompts (a missing key is an error, not a hang) and gives up on a dead host.
SSH = ("ssh", "-o", "BatchMode=yes", "-o", "ConnectTimeout=10")

#: statvfs of ``$1``, or of its nearest existing parent (as ``LocalHost.statvfs`` does).
_STATVFS = (
    'p=$1; while [ ! -e "$p" ] && [ "$p" != / ]; do p=$(dirname -- "$p"); done; '
    'exec stat -f -L -c "%b %a %S" -- "$p"'
)


@dataclass
class RemoteHost:
    """A node reached through a command prefix; ``label`` says how, for messages."""

    via: tuple[str, ...]
    label: str
    local: LocalHost

    def argv(self, argv: Sequence[str]) -> list[str]:
        """The command that runs ``argv`` on the node."""
        if self.via[:1] == ("ssh",):
            return [*self.via, shlex.join(argv)]
        return [*self.via, *argv]

    def run(self, argv: Sequence[str]) -> CmdResult:
        return self.local.run(self.argv(argv))

    def read(self, path: str) -> str | None:
        res = self.run(["cat", "--", path])
        return res.stdout if res.code == 0 else None

    def listdir(self, path: str) -> list[str]:
        res = self.run(["ls", "-1A", "--", path])
        return sorted(ln for ln in res.stdout.splitlines() if ln) if res.code == 0 else []

    def statvfs(self, path: str) -> tuple[int, int] | None:
        res = self.run(["sh", "-c", _STATVFS, "sh", path])
        words = res.stdout.split()
        if res.code or len(words) != 3 or not all(w.isdigit() for w in words):
            return None
        blocks, avail, frsize = map(int, words)
        return blocks * frsize, avail * frsize

    def tree_bytes(self, path: str) -> int:
        return sum(seen[0] for seen in self.files(path).values())

    def size(self, path: str) -> int | None:
        res = self.run(["stat", "-L", "-c", "%s %F", "--", path])
        size, _, kind = res.stdout.strip().partition(" ")
        return int(size) if res.code == 0 and size.isdigit() and kind.startswith("regular") else None

    def files(self, path: str) -> dict[str, Seen]:
        """Every file under ``path``: relative path → (size, mtime ns, ctime ns, inode, device), as
        :func:`~rigsmith.resolving.modelfiles.seen` has it here; empty when there is none."""
        res = self.run(["find", path, "-type", "f", "-printf", r"%P\t%s\t%T@\t%C@\t%i\t%D\n"])
        out: dict[str, Seen] = {}
        for line in res.stdout.splitlines():
            rel, *rest = line.split("\t")
            if len(rest) == 5 and all(x.isdigit() for x in (rest[0], *rest[3:])):
                mtime, ctime = _ns(rest[1]), _ns(rest[2])
                if mtime is not None and ctime is not None:
                    out[rel] = (int(rest[0]), mtime, ctime, int(rest[3]), int(rest[4]))
        return out


def _ns(text: str) -> int | None:
    """``find -printf %T@`` (seconds with a fraction) in nanoseconds."""
    secs, _, frac = text.partition(".")
    if not secs.isdigit() or not (frac.isdigit() or not frac):
        return None
    return int(secs) * 10**9 + int((frac + "0" * 9)[:9])


def ssh_host(dest: str, local: LocalHost) -> RemoteHost:
    """The node at ssh destination ``dest`` (validated by the spec: no option, no control character)."""
    return RemoteHost((*SSH, "--", dest), f"ssh {dest}", local)


def local_addresses(host: Host) -> set[str]:
    """This machine's addresses (``ip -o addr``) and host names, to tell which node it is."""
    out = set()
    res = host.run(["ip", "-o", "addr", "show"])
    for line in res.stdout.splitlines():
        words = line.split()
        if len(words) > 3 and words[2] in ("inet", "inet6"):
            out.add(words[3].split("/", 1)[0])
    name = host.run(["hostname"])
    out.update(w for w in (name.stdout.strip(), name.stdout.strip().split(".", 1)[0]) if w)
    return out


def node_hosts(
    spec: Deployment,
    local: LocalHost,
    override: Mapping[str, Host] | None = None,
    only: str | None = None,
) -> dict[str, Host]:
    """name → Host for every node (``only``: just that node, taken to be this machine).

    ``override`` (tests, callers with their own way in) wins; then ``ssh``; then this machine when one of its
    addresses or names is the node's address. A node none of these reaches is an error naming the fix.
    """
    assert spec.cluster is not None
    nodes = spec.cluster.nodes
    if only is not None:
        if only not in {n.name for n in nodes}:
            raise RigsmithError(
                f"--node {only!r} is not a node of {spec.name}",
                hint="use one of: " + ", ".join(n.name for n in nodes),
            )
        return {only: (override or {}).get(only, local)}
    here: set[str] | None = None
    out: dict[str, Host] = {}
    unreachable: list[ClusterNode] = []
    for n in nodes:
        if override and n.name in override:
            out[n.name] = override[n.name]
        elif n.ssh:
            out[n.name] = ssh_host(n.ssh, local)
        else:
            here = local_addresses(local) if here is None else here
            if spec.fill(n.address) in here:
                out[n.name] = local
            else:
                unreachable.append(n)
    if unreachable:
        i = {n.name: k for k, n in enumerate(nodes)}
        raise RigsmithError(
            "cannot reach node(s) "
            + ", ".join(f"{n.name} ({spec.fill(n.address)})" for n in unreachable)
            + " from this machine",
            hint="set "
            + ", ".join(f"cluster.nodes[{i[n.name]}].ssh" for n in unreachable)
            + " to user@host (key-based ssh), or run `invoke doctor --node NAME` on each node",
        )
    return out


def describe(host: Host) -> str:
    """How a node is reached, for tables and messages."""
    return host.label if isinstance(host, RemoteHost) else "this machine"
