"""Real services for the image-build tests and bench: a registry, Podman's API service, a private dockerd.

Plain context managers (no pytest), so bench/bench_build.py starts the very same services. Machine
quirks (runc, cgroupfs, nofile limits) stay here, per shared/ENVIRONMENT.md. Everything binds 127.0.0.1
or a unix socket under the given directory.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler
from pathlib import Path

import httpx

from tests.support.podman import Podman, containers_conf

BASE_TAG = "tinybase:1"


class QuietHandler(BaseHTTPRequestHandler):
    """An HTTP handler for scripted registry fronts: no access log, one call per whole answer."""

    def log_message(self, *args: object) -> None:
        pass

    def _send(self, code: int, headers: dict[str, str], body: bytes = b"") -> None:
        self.send_response(code)
        for k, v in headers.items():
            self.send_header(k, v)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(body)


def missing_binaries(names: Sequence[str]) -> list[str]:
    """The binaries of ``names`` not on PATH."""
    return [n for n in names if shutil.which(n) is None]


def free_port() -> int:
    """A TCP port free on 127.0.0.1 right now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _wait(what: str, ready: object, proc: subprocess.Popen[bytes], log: Path, timeout: float = 30) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(
                f"{what} exited ({proc.returncode}):\n{log.read_text(errors='replace')[-3000:]}"
            )
        with contextlib.suppress(Exception):
            if ready():  # type: ignore[operator]
                return
        time.sleep(0.1)
    raise RuntimeError(f"{what} not ready after {timeout}s:\n{log.read_text(errors='replace')[-3000:]}")


def _stop(proc: subprocess.Popen[bytes], timeout: float = 20) -> None:
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(5)


@dataclass(frozen=True)
class LocalRegistry:
    """docker-registry (distribution) on 127.0.0.1, no auth, storage in a temp dir."""

    host: str  # 127.0.0.1:PORT
    storage: Path


@contextlib.contextmanager
def registry(base: Path) -> Iterator[LocalRegistry]:
    """Start ``docker-registry serve`` with a generated config; stop it on exit."""
    port = free_port()
    storage = base / "storage"
    storage.mkdir(parents=True)
    conf = base / "config.yml"
    conf.write_text(
        "version: 0.1\n"
        "log:\n  level: warn\n"
        f"storage:\n  filesystem:\n    rootdirectory: {storage}\n  delete:\n    enabled: true\n"
        f"http:\n  addr: 127.0.0.1:{port}\n"
    )
    log = base / "registry.log"
    with log.open("wb") as out:
        proc = subprocess.Popen(["docker-registry", "serve", str(conf)], stdout=out, stderr=subprocess.STDOUT)
    try:
        _wait(
            "docker-registry", lambda: httpx.get(f"http://127.0.0.1:{port}/v2/").status_code == 200, proc, log
        )
        yield LocalRegistry(f"127.0.0.1:{port}", storage)
    finally:
        _stop(proc)


@dataclass(frozen=True)
class PodmanService:
    """Podman's API service on a private socket, over private storage; ``cli`` runs podman on the same."""

    url: str  # unix://…/podman.sock
    root: Path
    runroot: Path
    env: dict[str, str]  # CONTAINERS_CONF + CONTAINERS_REGISTRIES_CONF for CLI calls on the same storage

    def cli(
        self, *args: str, input: bytes | None = None, check: bool = True
    ) -> subprocess.CompletedProcess[bytes]:
        """Run ``podman --root … --runroot … ARGS``."""
        proc = subprocess.run(
            ["podman", "--root", str(self.root), "--runroot", str(self.runroot), *args],
            input=input,
            capture_output=True,
            env=self.env,
            timeout=300,
            check=False,
        )
        if check and proc.returncode != 0:
            raise AssertionError(
                f"podman {' '.join(args)} failed ({proc.returncode}): {proc.stderr.decode()}"
            )
        return proc


def podman_env(base: Path, runroot: Path, insecure: Sequence[str]) -> dict[str, str]:
    """Test-only containers.conf and registries.conf (plain-http loopback registries marked insecure).

    podman's tmp_dir (its "alive" file, locks) goes under ``runroot``: the default /run/libpod is shared by
    every podman on the machine, and one service's ``system reset`` removes it from under the others.
    """
    conf = base / "containers.conf"
    conf.write_text(containers_conf(runroot))
    regs = base / "registries.conf"
    regs.write_text("".join(f'[[registry]]\nlocation = "{h}"\ninsecure = true\n' for h in insecure))
    return {**os.environ, "CONTAINERS_CONF": str(conf), "CONTAINERS_REGISTRIES_CONF": str(regs)}


def _engine_api(
    what: str, argv: list[str], sock: Path, log: Path, env: dict[str, str] | None = None, timeout: float = 30
) -> subprocess.Popen[bytes]:
    """Start an engine's API server (output to ``log``) and wait until ``/_ping`` on ``sock`` answers 200."""
    with log.open("wb") as out:
        proc = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, env=env)
    transport = httpx.HTTPTransport(uds=str(sock))
    try:
        _wait(
            what,
            lambda: httpx.Client(transport=transport).get("http://d/_ping").status_code == 200,
            proc,
            log,
            timeout=timeout,
        )
    except BaseException:
        _stop(proc)
        raise
    return proc


@contextlib.contextmanager
def podman_service(base: Path, insecure: Sequence[str] = ()) -> Iterator[PodmanService]:
    """``podman system service --time=0`` on base/podman.sock with storage under base; reset on exit."""
    base.mkdir(parents=True, exist_ok=True)
    # podman refuses a runroot path longer than 50 characters, and a socket path is at most 107 bytes:
    # pytest's temp paths (an xdist worker's one level deeper) are longer.
    runroot = Path(tempfile.mkdtemp(prefix="rs-runroot-", dir="/tmp"))
    env = podman_env(base, runroot, insecure)
    sock = runroot / "podman.sock"
    svc = PodmanService(f"unix://{sock}", base / "root", runroot, env)
    argv = [
        "podman",
        "--root",
        str(svc.root),
        "--runroot",
        str(svc.runroot),
        "system",
        "service",
        "--time=0",
        svc.url,
    ]
    try:
        proc = _engine_api("podman system service", argv, sock, base / "service.log", env=env)
        try:
            yield svc
        finally:
            _stop(proc)
    finally:
        svc.cli("system", "reset", "--force", check=False)
        shutil.rmtree(runroot, ignore_errors=True)


@contextlib.contextmanager
def podman_api_on(podman: Podman, registry: str, base: Path) -> Iterator[str]:
    """Podman's API service over ``podman``'s own storage (so a run.sh with that podman sees what an
    ``invoke build`` through the API made), ``registry`` marked insecure; yields its unix:// URL."""
    regs = base / "registries.conf"
    regs.write_text(f'[[registry]]\nlocation = "{registry}"\ninsecure = true\n')
    sock = Path(tempfile.mkdtemp(prefix="rs-api-", dir="/tmp")) / "podman.sock"
    env = {**podman.env, "CONTAINERS_REGISTRIES_CONF": str(regs)}
    argv = podman.argv("system", "service", "--time=0", f"unix://{sock}")
    try:
        proc = _engine_api("podman system service", argv, sock, base / "api.log", env=env)
        try:
            yield f"unix://{sock}"
        finally:
            _stop(proc)
    finally:
        shutil.rmtree(sock.parent, ignore_errors=True)


@dataclass(frozen=True)
class Dockerd:
    """A private dockerd: own data root, exec root and socket; no bridge, no iptables."""

    url: str
    root: Path


@contextlib.contextmanager
def dockerd(base: Path) -> Iterator[Dockerd]:
    """Start dockerd per shared/ENVIRONMENT.md; stop it by its pid on exit."""
    base.mkdir(parents=True, exist_ok=True)
    (base / "daemon.json").write_text("{}")
    # Unix socket paths are at most 107 bytes (containerd's own limit is 104) and pytest's temp paths are
    # long: the socket and the exec root (containerd's sockets) live in a short directory of their own.
    short = Path(tempfile.mkdtemp(prefix="rs-dockerd-", dir="/tmp"))
    sock = short / "docker.sock"
    exec_root = short / "exec"
    argv = [
        "dockerd",
        "--config-file",
        str(base / "daemon.json"),
        "--data-root",
        str(base / "data"),
        "--exec-root",
        str(exec_root),
        "-H",
        f"unix://{sock}",
        "--pidfile",
        str(base / "docker.pid"),
        "--bridge",
        "none",
        "--iptables=false",
        "--ip6tables=false",
        "--default-ulimit",
        "nofile=1024:1024",
    ]
    try:
        proc = _engine_api("dockerd", argv, sock, base / "dockerd.log", timeout=60)
        try:
            yield Dockerd(f"unix://{sock}", base)
        finally:
            _stop(proc, timeout=30)
    finally:
        _unmount_under(base)
        _unmount_under(short)
        shutil.rmtree(short, ignore_errors=True)


def _unmount_under(base: Path) -> None:
    """dockerd leaves its netns bind mount behind; unmount whatever is still mounted below ``base``."""
    prefix = str(base.resolve()) + "/"
    with Path("/proc/self/mountinfo").open(encoding="utf-8") as fh:
        points = [line.split()[4] for line in fh]
    for point in sorted((p for p in points if p.startswith(prefix)), reverse=True):
        subprocess.run(["umount", "-l", point], capture_output=True, check=False)


def busybox_rootfs(dest: Path) -> Path:
    """A busybox rootfs (every applet linked) with /opt/src, as a directory."""
    (dest / "bin").mkdir(parents=True)
    shutil.copy2("/bin/busybox", dest / "bin/busybox")
    applets = subprocess.run(["/bin/busybox", "--list"], capture_output=True, text=True, check=True).stdout
    for name in applets.split():
        if name != "busybox":
            (dest / "bin" / name).symlink_to("busybox")
    for d in ("tmp", "proc", "sys", "dev", "etc", "opt/src"):
        (dest / d).mkdir(parents=True, exist_ok=True)
    return dest


def push_base(svc: PodmanService, reg: LocalRegistry, work: Path) -> str:
    """Import a busybox rootfs into podman and push it to the registry; returns REGISTRY/tinybase:1."""
    root = busybox_rootfs(work / "rootfs")
    tar = subprocess.run(
        [
            "tar",
            "--sort=name",
            "--mtime=@0",
            "--owner=0",
            "--group=0",
            "--numeric-owner",
            "-C",
            str(root),
            "-c",
            ".",
        ],
        capture_output=True,
        check=True,
    ).stdout
    ref = f"{reg.host}/{BASE_TAG}"
    svc.cli("import", "--change", "ENV=PATH=/bin", "-", ref, input=tar)
    svc.cli("push", "--tls-verify=false", ref)
    return ref


def skopeo_digest(ref: str) -> str:
    """The manifest digest skopeo sees for ``ref`` (plain-http registry)."""
    out = subprocess.run(
        ["skopeo", "inspect", "--tls-verify=false", f"docker://{ref}"],
        capture_output=True,
        text=True,
        check=True,
        timeout=60,
    ).stdout
    return str(json.loads(out)["Digest"])


_PY = "python3.11"
#: Parts of the stdlib a build never needs (keeps the base near 30 MB).
_STDLIB_SKIP = {"test", "idlelib", "tkinter", "turtledemo", "ensurepip", "lib2to3", "EXTERNALLY-MANAGED",
                f"config-3.11-{os.uname().machine}-linux-gnu"}  # fmt: skip


def _libs(paths: Sequence[Path]) -> set[Path]:
    out: set[Path] = set()
    for p in paths:
        ldd = subprocess.run(["ldd", str(p)], capture_output=True, text=True, check=False).stdout
        for line in ldd.splitlines():
            parts = line.split()
            path = parts[2] if "=>" in parts and len(parts) > 2 else parts[0]
            if path.startswith("/"):
                out.add(Path(path))
    return out


def python_rootfs(dest: Path) -> Path:
    """busybox + the host's Debian python3.11 (stdlib, lib-dynload, their shared libs) + Debian's pip, and
    a stand-in package ``fakevllm`` in dist-packages for python-package patch tests."""
    binary = Path(f"/usr/bin/{_PY}")
    busybox_rootfs(dest)
    (dest / "usr/bin").mkdir(parents=True)
    shutil.copy2(binary, dest / "usr/bin" / _PY)
    (dest / "usr/bin/python3").symlink_to(_PY)
    stdlib = Path(f"/usr/lib/{_PY}")
    shutil.copytree(stdlib, dest / stdlib.relative_to("/"), symlinks=True,
                    ignore=lambda d, names: [n for n in names if n in _STDLIB_SKIP])  # fmt: skip
    dist = Path("/usr/lib/python3/dist-packages")
    pips = [dist / "pip", *sorted(dist.glob("pip-*.dist-info"))]
    if not binary.exists() or not pips[0].is_dir():
        raise RuntimeError(
            f"{binary} with Debian's pip is needed for the Python base: apt-get install python3-pip"
        )
    for src in pips:
        shutil.copytree(src, dest / src.relative_to("/"), symlinks=True)
    for lib in _libs([binary, *sorted((stdlib / "lib-dynload").glob("*.so"))]):
        target = dest / lib.relative_to("/")
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(lib.resolve(), target)
    pkg = dest / dist.relative_to("/") / "fakevllm"
    pkg.mkdir()
    (pkg / "__init__.py").write_text(FAKEVLLM)
    (dest / "root").mkdir()
    return dest


FAKEVLLM = '__version__ = "0.0.1"\n\n\ndef mode():\n    return "stock"\n'


def push_rootfs(svc: PodmanService, reg: LocalRegistry, root: Path, ref_name: str) -> str:
    """Import a rootfs directory as REGISTRY/<ref_name> and push it there."""
    tar = subprocess.run(
        ["tar", "--sort=name", "--mtime=@0", "--owner=0", "--group=0", "--numeric-owner", "-C", str(root),
         "-c", "."],
        capture_output=True, check=True,
    ).stdout  # fmt: skip
    ref = f"{reg.host}/{ref_name}"
    svc.cli("import", "--change", "ENV=PATH=/usr/bin:/bin", "--change", "ENV=HOME=/root", "-", ref, input=tar)
    svc.cli("push", "--tls-verify=false", ref)
    return ref
