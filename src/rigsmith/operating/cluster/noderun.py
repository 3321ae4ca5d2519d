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

from rigsmith.digits import ascii_digits
from rigsmith.errors import RigsmithError, shown
from rigsmith.operating.host import Host, LocalHost
from rigsmith.operating.probes import CmdResult
from rigsmith.spec import ClusterNode, Deployment

if TYPE_CHECKING:
    from rigsmith.resolving.model.verified import Seen

#: ssh never prompts (a missing key is an error, not a hang) and gives up on a dead host.
SSH = ("ssh", "-o", "BatchMode=yes", "-o", "ConnectTimeout=10")

#: statvfs of ``$1``, or of its nearest existing parent (as ``LocalHost.statvfs`` does).
_STATVFS = (
    'p=$1; while [ ! -e "$p" ] && [ "$p" != / ]; do p=$(dirname -- "$p"); done; '
    'exec stat -f -L -c "%b %a %S" -- "$p"'
)


#: Write $2 to $1 through a temp file in the same directory (mode $3).
_WRITE = (
    'mkdir -p -- "$(dirname -- "$1")" && printf %s "$2" > "$1.rs-tmp" && chmod "$3" "$1.rs-tmp" '
    '&& mv -f -- "$1.rs-tmp" "$1"'
)
#: ssh's own failures (exit 255), by what its message says, each with what the user should do.
_SSH_FAILURES = (
    (
        ("Host key verification failed", "REMOTE HOST IDENTIFICATION HAS CHANGED"),
        "its host key is not the one this machine knows for it, so ssh refused to talk to it",
        "if the node was reinstalled, compare its key's fingerprint (`ssh-keygen -lf` on the node) and "
        "replace its line in the known-hosts file (cluster.nodes[{i}].ssh_options.UserKnownHostsFile, else "
        "~/.ssh/known_hosts); if it was not, something else answers at that address",
    ),
    (
        ("Permission denied",),
        "it refused this machine's key",
        "add the public key to the node's authorized_keys (`ssh-copy-id`), or point "
        "cluster.nodes[{i}].ssh_options.IdentityFile at the key it accepts",
    ),
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

    def write(self, path: str, text: str, mode: int = 0o644) -> CmdResult:
        """Write ``text`` to ``path`` on the node, atomically (a temp file renamed), its directory made."""
        return self.run(["sh", "-c", _WRITE, "sh", path, text, f"{mode:o}"])

    def read(self, path: str) -> str | None:
        res = self.run(["cat", "--", path])
        return res.stdout if res.code == 0 else None

    def listdir(self, path: str) -> list[str]:
        res = self.run(["ls", "-1A", "--", path])
        return sorted(ln for ln in res.stdout.splitlines() if ln) if res.code == 0 else []

    def statvfs(self, path: str) -> tuple[int, int] | None:
        res = self.run(["sh", "-c", _STATVFS, "sh", path])
        words = res.stdout.split()
        if res.code or len(words) != 3 or not all(ascii_digits(w) for w in words):
            return None
        blocks, avail, frsize = map(int, words)
        return blocks * frsize, avail * frsize

    def tree_bytes(self, path: str) -> int:
        return sum(seen[0] for seen in self.files(path).values())

    def size(self, path: str) -> int | None:
        res = self.run(["stat", "-L", "-c", "%s %F", "--", path])
        size, _, kind = res.stdout.strip().partition(" ")
        return int(size) if res.code == 0 and ascii_digits(size) and kind.startswith("regular") else None

    def files(self, path: str) -> dict[str, Seen]:
        """Every file under ``path``: relative path → (size, mtime ns, ctime ns, inode, device), as
        :func:`~rigsmith.resolving.model.verified.seen` has it here; empty when there is none."""
        start = path if path.startswith("/") else f"./{path}"  # find has no '--': '-delete' is an action
        res = self.run(["find", start, "-type", "f", "-printf", r"%P\t%s\t%T@\t%C@\t%i\t%D\n"])
        out: dict[str, Seen] = {}
        for line in res.stdout.splitlines():
            rel, *rest = line.split("\t")
            if len(rest) == 5 and all(ascii_digits(x) for x in (rest[0], *rest[3:])):
                mtime, ctime = _ns(rest[1]), _ns(rest[2])
                if mtime is not None and ctime is not None:
                    out[rel] = (int(rest[0]), mtime, ctime, int(rest[3]), int(rest[4]))
        return out


def _ns(text: str) -> int | None:
    """``find -printf %T@`` (seconds with a fraction) in nanoseconds."""
    secs, _, frac = text.partition(".")
    if not ascii_digits(secs) or not (ascii_digits(frac) or not frac):
        return None
    return int(secs) * 10**9 + int((frac + "0" * 9)[:9])


def ssh_host(dest: str, local: LocalHost, options: Mapping[str, str] | None = None) -> RemoteHost:
    """The node at ssh destination ``dest`` (validated by the spec: no option, no control character), with
    the node's ``ssh_options`` (allow-listed ssh_config keys) as ``-o KEY=VALUE``; ssh takes the first value
    of a key, so BatchMode stays on."""
    words = [w for key, value in (options or {}).items() for w in ("-o", f"{key}={value}")]
    return RemoteHost((SSH[0], *SSH[1:3], *words, *SSH[3:], "--", dest), f"ssh {dest}", local)


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
            out[n.name] = ssh_host(n.ssh, local, n.ssh_options)
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


def ssh_problem(spec: Deployment, name: str, res: CmdResult) -> tuple[str, str] | None:
    """(what, hint) when ``res`` is ssh failing to reach node ``name`` (exit 255), else None."""
    assert spec.cluster is not None
    i, node = next((k, n) for k, n in enumerate(spec.cluster.nodes) if n.name == name)
    if res.code != 255:
        return None
    said = shown(" ".join(res.stderr.split())[-300:])
    where = f"node {name} (cluster.nodes[{i}].ssh {node.ssh})"
    for needles, what, hint in _SSH_FAILURES:
        if any(x in res.stderr for x in needles):
            return f"{where}: {what} ({said})", hint.format(i=i)
    return (
        f"{where} cannot be reached over ssh ({said or 'ssh exited 255'})",
        f"check that {name} is up and its link to this machine works (`invoke doctor` shows the link of "
        f"every node it reaches); fix cluster.nodes[{i}].ssh if the address changed",
    )


def unreachable(spec: Deployment, hosts: Mapping[str, Host]) -> dict[str, tuple[str, str]]:
    """node → (what, hint) for every ssh node that does not answer ``true`` (the others are left out)."""
    out = {}
    for name, host in hosts.items():
        if isinstance(host, RemoteHost) and host.via[:1] == ("ssh",):
            problem = ssh_problem(spec, name, host.run(["true"]))
            if problem:
                out[name] = problem
    return out


def require_reachable(spec: Deployment, hosts: Mapping[str, Host]) -> None:
    """Raise one paragraph naming every ssh node that cannot be reached, and why."""
    bad = unreachable(spec, hosts)
    if bad:
        raise RigsmithError(
            "; ".join(what for what, _ in bad.values()),
            hint="; ".join(dict.fromkeys(h for _, h in bad.values())),
        )
