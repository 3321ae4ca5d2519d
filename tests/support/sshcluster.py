"""A test cluster reached only over real ssh (issue 30).

Topology, all in network namespaces the test creates: a control namespace ``TAG-c`` holding a bridge
(SUBNET.254), and one namespace per node (``TAG-0``, ``TAG-1``…) whose interface IFACE (SUBNET.N+1/24) is a
veth pair's end, the other end enslaved to the bridge. Cutting a node's link (``cut``) is setting that end
down. Each node runs its own Debian sshd (``-D -e -f`` a config of its own: a throwaway host key, the test's
authorized key, listening on the node's address only) and has its own podman storage (containers.conf and
storage.conf selected by env that sshd sets for every session) and its own fake CDI vendor spec (sshd runs
in a mount namespace of its own where the node's CDI dir is bound over /etc/cdi). rigsmith reaches a node
only through ``cluster.nodes[].ssh`` and ``ssh_options``; the ``ssh`` it runs is a wrapper (first on the
PATH given to it) that runs the real ssh inside the control namespace. The user's ~/.ssh is never read for
keys or written: the key, the known-hosts file and IdentitiesOnly come from the spec's options.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import subprocess
import tempfile
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

from tests.support.common import FAKE_VENDOR, require
from tests.support.podman import containers_conf, unmount_under

IFACE = "rsn0"
SSHD = "/usr/sbin/sshd"
#: How long a node's sshd may take to say it listens (it starts in well under a second).
SSHD_START_TIMEOUT = 30


def _run(*argv: str, timeout: float = 60, **kw: object) -> subprocess.CompletedProcess[str]:
    proc = subprocess.run(list(argv), capture_output=True, text=True, timeout=timeout, check=False, **kw)  # type: ignore[call-overload]
    if proc.returncode != 0:
        raise AssertionError(f"{' '.join(argv)} failed ({proc.returncode}): {proc.stderr.strip()}")
    return proc  # type: ignore[no-any-return]


@dataclass
class SshNode:
    """One node: its namespace, address, sshd and podman storage."""

    name: str
    ns: str
    address: str
    dir: Path
    runroot: Path
    gpus: tuple[str, ...]
    sshd: subprocess.Popen[str] | None = None
    #: The bridge-side end of the node's link (in the control namespace).
    port: str = ""

    @property
    def podman_env(self) -> dict[str, str]:
        return {
            **os.environ,
            "CONTAINERS_CONF": str(self.dir / "containers.conf"),
            "CONTAINERS_STORAGE_CONF": str(self.dir / "storage.conf"),
        }

    def podman(
        self, *args: str, check: bool = True, timeout: float = 120
    ) -> subprocess.CompletedProcess[str]:
        """podman on this node's storage, in its namespaces (where its sessions' podman mounts live)."""
        assert self.sshd is not None
        argv = ["nsenter", "-t", str(self.sshd.pid), "-m", "-n", "--", "podman", *args]
        proc = subprocess.run(
            argv, capture_output=True, text=True, env=self.podman_env, timeout=timeout, check=False
        )
        if check and proc.returncode != 0:
            raise AssertionError(f"podman {' '.join(args)} on {self.name}: {proc.stderr.strip()}")
        return proc

    @property
    def host_key_pub(self) -> str:
        return " ".join((self.dir / "host_key.pub").read_text().split()[:2])


@dataclass
class SshCluster:
    """The nodes, the client key and known-hosts file, and the PATH prefix holding the ssh wrapper."""

    tag: str
    ctl: str
    nodes: list[SshNode]
    key: Path
    known_hosts: Path
    bin: Path
    cut_links: set[str] = field(default_factory=set)

    def ssh_options(self, **more: str) -> dict[str, str]:
        return {
            "IdentityFile": str(self.key),
            "IdentitiesOnly": "yes",
            "UserKnownHostsFile": str(self.known_hosts),
            "StrictHostKeyChecking": "yes",
            "ConnectTimeout": "5",  # a cut link is named after this long (twice: status, then doctor)
            **more,
        }

    @property
    def env(self) -> dict[str, str]:
        """The environment rigsmith runs with: the ssh wrapper first on PATH."""
        return {**os.environ, "PATH": f"{self.bin}:{os.environ['PATH']}"}

    def node(self, name: str) -> SshNode:
        return next(n for n in self.nodes if n.name == name)

    def cut(self, name: str) -> None:
        """Cut a node's link (the bridge side), as a pulled cable."""
        _run("ip", "-n", self.ctl, "link", "set", self.node(name).port, "down")
        self.cut_links.add(name)

    def mend(self, name: str) -> None:
        _run("ip", "-n", self.ctl, "link", "set", self.node(name).port, "up")
        self.cut_links.discard(name)

    def ns_pids(self, ns: str) -> list[int]:
        res = subprocess.run(["ip", "netns", "pids", ns], capture_output=True, text=True, check=False)
        return [int(p) for p in res.stdout.split()]


def _cdi_spec(node: SshNode) -> str:
    """The node's own fake GPUs: each injects an env var naming the node and a /dev/null device node."""
    devices = [
        {
            "name": g,
            "containerEdits": {
                "env": [f"FAKE_GPU_{g}=on-{node.name}"],
                "deviceNodes": [{"path": f"/dev/fakegpu{g}", "hostPath": "/dev/null"}],
            },
        }
        for g in node.gpus
    ]
    return json.dumps({"cdiVersion": "0.5.0", "kind": FAKE_VENDOR, "devices": devices}, indent=1)


def _sshd_config(node: SshNode) -> str:
    d = node.dir
    return "\n".join(
        [
            f"ListenAddress {node.address}",
            "Port 22",
            f"HostKey {d / 'host_key'}",
            f"PidFile {d / 'sshd.pid'}",
            f"AuthorizedKeysFile {d / 'authorized_keys'}",
            "StrictModes no",  # the test's files live under /tmp (world-writable parents)
            "UsePAM no",
            "PasswordAuthentication no",
            "KbdInteractiveAuthentication no",
            "PermitRootLogin prohibit-password",
            f"SetEnv CONTAINERS_CONF={d / 'containers.conf'} CONTAINERS_STORAGE_CONF={d / 'storage.conf'}",
            "",
        ]
    )


def _start_sshd(node: SshNode) -> None:
    """Start the node's sshd and return once it says it listens (its own log line, not a poll)."""
    # Its network namespace, and a mount namespace of its own where the node's CDI dir is /etc/cdi (not
    # `ip netns exec`, which also mounts a fresh /sys without the cgroup mounts podman needs).
    bind = 'mount --bind "$0" /etc/cdi && exec "$@"'
    proc = subprocess.Popen(
        [
            "nsenter",
            f"--net=/run/netns/{node.ns}",
            "--",
            "unshare",
            "--mount",
            "--propagation",
            "private",
            "--",
            "sh",
            "-c",
            bind,
            str(node.dir / "cdi"),
            SSHD,
            "-D",
            "-e",
            "-f",
            str(node.dir / "sshd_config"),
        ],
        stderr=subprocess.PIPE,
        stdout=subprocess.DEVNULL,
        text=True,
    )
    node.sshd = proc
    assert proc.stderr is not None
    seen: list[str] = []
    listening = threading.Event()

    def pump() -> None:
        assert proc.stderr is not None
        with (node.dir / "sshd.log").open("a") as log:
            for line in proc.stderr:
                log.write(line)
                log.flush()
                seen.append(line)
                if "Server listening on" in line:
                    listening.set()
        listening.set()  # sshd ended: stop waiting

    threading.Thread(target=pump, daemon=True).start()
    if not listening.wait(SSHD_START_TIMEOUT) or proc.poll() is not None:
        raise AssertionError(f"sshd on {node.name} did not start: {''.join(seen)}")


def _storage(node: SshNode, stores: tuple[Path, ...]) -> None:
    d = node.dir
    (d / "containers.conf").write_text(containers_conf(node.runroot))
    extra = ", ".join(f'"{s}"' for s in stores)
    (d / "storage.conf").write_text(
        f'[storage]\ndriver = "overlay"\ngraphroot = "{d / "storage"}"\nrunroot = "{node.runroot}"\n'
        f"[storage.options]\nadditionalimagestores = [{extra}]\n"
    )


@contextlib.contextmanager
def ssh_cluster(
    base: Path,
    tag: str,
    subnet: str,
    gpus: tuple[tuple[str, ...], ...] = (("0", "1"), ("0", "1")),
    image_stores: tuple[Path, ...] = (),
) -> Iterator[SshCluster]:
    """``len(gpus)`` nodes named box-a, box-b… at SUBNET.1, .2…, each with sshd and podman storage (plus the
    read-only ``image_stores``)."""
    for tool in ("ip", "ssh", "ssh-keygen", SSHD, "podman"):
        require(tool)
    ctl = f"{tag}-c"
    key = base / "client_key"
    _run("ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", "rigsmith-test", "-f", str(key))
    wrapper = base / "bin" / "ssh"
    wrapper.parent.mkdir()
    wrapper.write_text(f'#!/bin/sh\nexec ip netns exec {ctl} {shutil.which("ssh")} "$@"\n')
    wrapper.chmod(0o755)
    nodes = [
        SshNode(
            f"box-{chr(ord('a') + i)}",
            f"{tag}-{i}",
            f"{subnet}.{i + 1}",
            base / f"node{i}",
            Path(tempfile.mkdtemp(prefix="rsrr-", dir="/tmp")),  # podman refuses a runroot over 50 chars
            g,
        )
        for i, g in enumerate(gpus)
    ]
    c = SshCluster(tag, ctl, nodes, key, base / "known_hosts", base / "bin")
    made: list[str] = []
    Path("/run/sshd").mkdir(mode=0o755, exist_ok=True)  # sshd's privilege-separation directory
    try:
        _run("ip", "netns", "add", ctl)
        made.append(ctl)
        _run("ip", "-n", ctl, "link", "add", "rsbr", "type", "bridge")
        _run("ip", "-n", ctl, "addr", "add", f"{subnet}.254/24", "dev", "rsbr")
        _run("ip", "-n", ctl, "link", "set", "rsbr", "up")
        _run("ip", "-n", ctl, "link", "set", "lo", "up")
        known = []
        for i, n in enumerate(nodes):
            _run("ip", "netns", "add", n.ns)
            made.append(n.ns)
            n.dir.mkdir()
            (n.dir / "cdi").mkdir()
            (n.dir / "cdi" / "rigsmith-test-node.json").write_text(_cdi_spec(n))
            inner, n.port = f"{tag}v{i}", f"{tag}p{i}"
            _run("ip", "link", "add", inner, "type", "veth", "peer", "name", n.port)
            _run("ip", "link", "set", n.port, "netns", ctl)
            _run("ip", "-n", ctl, "link", "set", n.port, "master", "rsbr", "up")
            _run("ip", "link", "set", inner, "netns", n.ns)
            _run("ip", "-n", n.ns, "link", "set", inner, "name", IFACE)
            _run("ip", "-n", n.ns, "addr", "add", f"{n.address}/24", "dev", IFACE)
            _run("ip", "-n", n.ns, "link", "set", IFACE, "up")
            _run("ip", "-n", n.ns, "link", "set", "lo", "up")
            _run("ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(n.dir / "host_key"))
            shutil.copy(f"{key}.pub", n.dir / "authorized_keys")
            (n.dir / "sshd_config").write_text(_sshd_config(n))
            _storage(n, image_stores)
            _start_sshd(n)
            known.append(f"{n.address} {n.host_key_pub}\n")
        c.known_hosts.write_text("".join(known))
        yield c
    finally:
        _teardown(c, made)


def _teardown(c: SshCluster, made: list[str]) -> None:
    problems = []
    for n in c.nodes:
        if n.sshd is not None and n.sshd.poll() is None:
            n.podman("rm", "--all", "--force", "--time", "0", check=False)
        if n.sshd is not None:
            n.sshd.terminate()
            n.sshd.wait(timeout=30)
        unmount_under(n.dir)  # its mounts lived in its own mount namespace, gone with sshd; belt and braces
        unmount_under(n.runroot)
        shutil.rmtree(n.runroot, ignore_errors=True)
        shutil.rmtree(n.dir / "storage", ignore_errors=True)  # the image's layers: no mount holds them now
    for ns in made:
        left = c.ns_pids(ns)
        if left:
            problems.append(f"{ns}: pids {left} left behind")
        for pid in left:  # processes the test's nodes started; named above as a failure
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, 9)
        subprocess.run(["ip", "netns", "del", ns], capture_output=True, check=False, timeout=30)
    listed = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True, check=False).stdout
    problems += [f"namespace {ns} still exists" for ns in made if ns in listed.split()]
    if problems:
        raise AssertionError("teardown: " + "; ".join(problems))
