"""The host adapter runs commands and reads files; ``gather`` turns probe output into facts.

``LocalHost`` is the real machine and the one way rigsmith's ops run a command: captured (``run``), streamed
line by line (``stream``) or attached to the terminal (``call``). Tests pass a host that replays captured
outputs, so ``gather`` and every parser run exactly as on a rig.
"""

from __future__ import annotations

import os
import subprocess
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Protocol

from rigsmith.operating import probes
from rigsmith.operating.probes import CmdResult, DiskFacts, HostFacts, ImageFacts, ModelFacts
from rigsmith.rendering.targets import quadlet


class Host(Protocol):
    """What probes need from a machine."""

    def run(self, argv: Sequence[str]) -> CmdResult:
        """Run argv; a missing binary is exit code 127."""
        ...

    def read(self, path: str) -> str | None:
        """A file's text, or None when it cannot be read."""
        ...

    def listdir(self, path: str) -> list[str]:
        """Names in a directory (empty when it does not exist)."""
        ...

    def statvfs(self, path: str) -> tuple[int, int] | None:
        """(total, free-for-unprivileged) bytes of the filesystem holding path, None if unknown."""
        ...

    def tree_bytes(self, path: str) -> int:
        """Bytes already stored under path (apparent sizes; 0 when it does not exist)."""
        ...

    def size(self, path: str) -> int | None:
        """Apparent size of the file at path (symlinks followed), None when there is none."""
        ...


class LocalHost:
    """The machine rigsmith runs on. ``env`` selects e.g. a test podman wrapper through PATH."""

    def __init__(self, env: Mapping[str, str] | None = None, timeout: float = 30) -> None:
        self.env = dict(env) if env is not None else None
        self.timeout = timeout

    def run(self, argv: Sequence[str]) -> CmdResult:
        """Run argv to the end, capturing its output; missing binary: 127, past the timeout: 124."""
        try:
            proc = subprocess.run(
                list(argv), capture_output=True, text=True, timeout=self.timeout, env=self.env, check=False
            )
        except FileNotFoundError:
            return CmdResult(127, "", f"{argv[0]}: command not found")
        except subprocess.TimeoutExpired:
            return CmdResult(124, "", f"{argv[0]}: timed out after {self.timeout}s")
        return CmdResult(proc.returncode, proc.stdout, proc.stderr)

    def stream(self, argv: Sequence[str]) -> subprocess.Popen[str]:
        """Start argv with stdout and stderr merged into one text pipe, read as it comes (``podman logs -f``).

        Raises:
            FileNotFoundError: the binary is not installed.
        """
        return subprocess.Popen(
            list(argv),
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            env=self.env,
            errors="replace",
        )

    def call(self, argv: Sequence[str]) -> int:
        """Run argv on the user's terminal (its output is theirs to read); the exit code.

        Raises:
            FileNotFoundError: the binary is not installed.
        """
        return subprocess.run(list(argv), env=self.env, check=False).returncode

    def read(self, path: str) -> str | None:
        try:
            return Path(path).read_text(encoding="utf-8", errors="replace")
        except OSError:
            return None

    def listdir(self, path: str) -> list[str]:
        try:
            return sorted(p.name for p in Path(path).iterdir())
        except OSError:
            return []

    def statvfs(self, path: str) -> tuple[int, int] | None:
        p = Path(path).expanduser()
        while not p.exists() and p != p.parent:
            p = p.parent
        try:
            st = os.statvfs(p)
        except OSError:
            return None
        return st.f_blocks * st.f_frsize, st.f_bavail * st.f_frsize

    def size(self, path: str) -> int | None:
        try:
            st = Path(path).expanduser().stat()
        except OSError:
            return None
        return st.st_size if Path(path).expanduser().is_file() else None

    def tree_bytes(self, path: str) -> int:
        total = 0
        for dirpath, _dirs, files in os.walk(Path(path).expanduser()):
            for f in files:
                try:
                    total += (Path(dirpath) / f).lstat().st_size
                except OSError:
                    continue
        return total


def probe(host: Host, argv: Sequence[str]) -> CmdResult:
    """Run one probe command; its output without terminal escapes (the one place they are stripped)."""
    res = host.run(argv)
    return CmdResult(res.code, probes.strip_ansi(res.stdout), probes.strip_ansi(res.stderr))


def read(host: Host, path: str) -> str | None:
    """Read one probe file, without terminal escapes."""
    text = host.read(path)
    return None if text is None else probes.strip_ansi(text)


def cdi_specs(host: Host) -> list[probes.CdiSpec]:
    """Every CDI spec file in podman's CDI directories on ``host``, parsed, in podman's reading order."""
    specs = []
    for d in probes.CDI_DIRS:
        for name in host.listdir(d):
            if name.endswith((".yaml", ".json")):
                text = read(host, f"{d}/{name}")
                if text is not None:
                    specs.append(probes.parse_cdi(f"{d}/{name}", text))
    return specs


def gather(
    host: Host,
    *,
    model_dir: str | None = None,
    target: str = "podman",
    image: tuple[str, bool] | None = None,
    sparse: Sequence[tuple[str, int]] = (),
    model: ModelFacts | None = None,
) -> HostFacts:
    """Run every probe on ``host`` and parse the outputs into HostFacts. Never raises for a missing tool.

    ``image`` is (reference, pinned by the lock) of the image the plan runs; ``sparse`` the plan's sparse
    bind files (host path, size); ``model`` the model dir compared with the lock (operating.doctor.drift).
    """
    facts = HostFacts(model=model)
    cmd = probes.COMMANDS
    try:
        # `nvidia-smi -L` first: the cheapest "is the driver there" answer, and the index/UUID list the
        # detailed query must agree with.
        listed = probe(host, cmd["gpu_list"])
        probes.check_nvsmi(listed.code, listed.stdout, listed.stderr)
        res = probe(host, cmd["gpus"])
        probes.check_nvsmi(res.code, res.stdout, res.stderr)
        facts.gpus = probes.parse_gpus(res.stdout)
        by_list = {(i, u) for i, _n, u in probes.parse_gpu_list(listed.stdout)}
        if by_list != {(g.index, g.uuid) for g in facts.gpus}:
            raise probes.NoDriver("nvidia-smi -L and --query-gpu disagree about the GPUs (driver in flux?)")
        apps = probe(host, cmd["apps"])
        probes.check_nvsmi(apps.code, apps.stdout, apps.stderr)
        facts.apps = probes.parse_apps(apps.stdout)
        topo = probe(host, cmd["topo"])
        if topo.code == 0:
            facts.topo = probes.parse_topo(topo.stdout)
        p2p = probe(host, cmd["p2p"])
        if p2p.code == 0:
            facts.p2p = probes.parse_p2p(p2p.stdout)
    except probes.NoDriver as err:
        facts.gpu_error = str(err)
    driver = read(host, probes.FILES["driver"])
    facts.driver_version = probes.parse_driver_version(driver) if driver else None
    if facts.driver_version is None and facts.gpus:
        facts.driver_version = facts.gpus[0].driver_version
    meminfo = read(host, probes.FILES["meminfo"])
    facts.meminfo = probes.parse_meminfo(meminfo) if meminfo else {}
    ml = probe(host, cmd["memlock"])
    if ml.stdout.strip():
        facts.memlock = probes.parse_memlock(ml.stdout)
    shm = host.statvfs("/dev/shm")
    facts.shm_bytes = shm[0] if shm else None
    if model_dir:
        st = host.statvfs(model_dir)
        if st:
            facts.disk = DiskFacts(model_dir, st[1], host.tree_bytes(model_dir))
    facts.podman_version = podman_version(host)
    if facts.podman_version and target != "lxc":
        _gather_podman(host, facts, image)
    facts.cdi.extend(cdi_specs(host))
    for path, size in sparse:
        facts.sparse[path] = (size, host.size(path))
    if facts.apps:
        ps = probe(host, cmd["containers"])
        names = probes.parse_containers(ps.stdout) if ps.code == 0 else {}
        for app in facts.apps:
            cg = read(host, f"/proc/{app.pid}/cgroup")
            cid = probes.parse_cgroup(cg) if cg else None
            if cid:
                facts.containers[app.pid] = names.get(cid, cid[:12])
    return facts


def _gather_podman(host: Host, facts: HostFacts, image: tuple[str, bool] | None) -> None:
    """The helpers podman runs the rendered artifacts with, and the image in local storage."""
    info = probe(host, probes.COMMANDS["podman_info"])
    facts.podman_info = probes.parse_podman_info(info.code, info.stdout, info.stderr)
    conf = probe(host, probes.COMMANDS["containers_conf"])
    facts.init_path = probes.parse_containers_conf(conf.stdout) if conf.code == 0 else None
    paths = [facts.init_path or probes.DEFAULT_INIT_PATH]
    paths += [f"{d}/catatonit" for d in (*probes.HELPER_DIRS, *probes.PATH_DIRS)]
    paths += list(probes.QUADLET_GENERATORS)
    paths += [p for p in (facts.podman_info.runtime_path, facts.podman_info.conmon_path) if p]
    for p in dict.fromkeys(paths):
        facts.binaries[p] = host.size(p) is not None
    if image is not None:
        facts.image = image_facts(host, *image)


def image_facts(host: Host, ref: str, pinned: bool) -> ImageFacts:
    """Is ``ref`` (the plan's image: name@digest, an image ID, or a tag) in podman's local storage?"""
    res = probe(host, probes.image_inspect_argv(ref))
    image_id = probes.parse_image_inspect(res.code, res.stdout)
    err = None if image_id else next((ln.strip() for ln in res.stderr.splitlines() if ln.strip()), None)
    return ImageFacts(ref, pinned, image_id is not None, image_id, err)


def podman_version(host: Host) -> str | None:
    """This host's podman version (``podman --version``); None where podman does not answer."""
    pv = probe(host, probes.COMMANDS["podman_version"])
    return probes.parse_podman_version(pv.stdout) if pv.code == 0 else None


def quadlet_podman(host: Host, spec_version: str | None) -> tuple[str, str]:
    """The podman version to render quadlet units for when they run on ``host`` (``up``, not ``deploy``
    for another host): the host's own where it has quadlet, else the spec's (or the default), and the
    sentence that says which and why."""
    spec_says = spec_version or quadlet.DEFAULT_PODMAN_VERSION
    own = "the spec's podman_version" if spec_version else "the default; the spec sets no podman_version"
    here = podman_version(host)
    if here is None:
        return spec_says, f"quadlet units for podman {spec_says} ({own}): `podman --version` did not answer"
    parsed = quadlet.parse_version(here)
    if parsed is None or parsed < quadlet.QUADLET_SINCE:
        return (
            spec_says,
            f"quadlet units for podman {spec_says} ({own}): this host's podman {here} has no quadlet",
        )
    said = f"; the spec says {spec_version}" if spec_version and spec_version != here else ""
    return here, f"quadlet units for this host's podman {here} (`podman --version`{said})"


def quadlet_lacks(host: Host, unit: str) -> list[str]:
    """What keeps the quadlet unit ``unit`` from running on ``host`` (empty: nothing): systemd as PID 1
    (daemon-reload makes the unit a service) and podman's quadlet generator (podman >= 4.4)."""
    out = []
    init = (read(host, "/proc/1/comm") or "").strip()
    if init != "systemd":
        out.append(f"PID 1 is {init or 'unknown'}, not systemd: nothing would turn {unit} into a service")
    if not any(host.size(g) is not None for g in probes.QUADLET_GENERATORS):
        out.append(
            f"podman's quadlet generator is not installed ({' or '.join(probes.QUADLET_GENERATORS)}), so "
            "systemd would find no unit (podman < 4.4, or a package without it)"
        )
    return out
