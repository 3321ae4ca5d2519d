"""A real systemd for the tests: a Debian trixie rootfs (systemd 257, podman 5.4, runc) booted with the host's
``systemd-nspawn -b``, so generated units are installed, started and stopped by systemd itself.

The rootfs is built once per machine by ``.ci/build-systemd-guest`` from the machine's own Debian mirror and
cached as ``CACHE/systemd-guest/GUEST_VERSION.tar.zst``; each test session extracts it, boots it, and powers
it off again, leaving no process, cgroup, mount or directory behind. Every setting below is what this kind
of machine needs (shared/research/systemd-quadlet-here.md: the recipe and its eight pitfalls); none of it
goes into what rigsmith generates.
"""

from __future__ import annotations

import os
import re
import shlex
import shutil
import signal
import subprocess
import time
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager, suppress
from dataclasses import dataclass, field
from pathlib import Path

from filelock import FileLock

from rigsmith.operating.probes import CmdResult
from tests.support.common import REPO
from tests.support.podman import RECORDER_TOOLS

CACHE = Path(os.environ.get("RIGSMITH_TEST_CACHE", "/var/cache/rigsmith-test"))
#: Bump when .ci/build-systemd-guest changes what goes into the rootfs: a new name makes a new build.
GUEST_VERSION = "trixie-1"
GUEST_TAR = CACHE / "systemd-guest" / f"{GUEST_VERSION}.tar.zst"
BUILD_SCRIPT = REPO / ".ci" / "build-systemd-guest"
#: The guest's own PATH: commands run in it never see the host's environment (CONTAINERS_CONF, PATH…).
#: The guest's rootfs lives in a tmpfs of this size (rootfs ~300 MiB + the guest's podman storage).
TMPFS_SIZE = "2g"
GUEST_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"

#: Files written into the extracted rootfs before each boot (guest path → text).
GUEST_FILES: dict[str, str] = {
    # Pitfall 4: the host's hard RLIMIT_NOFILE is 20000 and nspawn has no CAP_SYS_RESOURCE to raise it;
    # systemd's default 1024:524288 would fail every service.
    "/etc/systemd/system.conf.d/rigsmith-test-limits.conf": "[Manager]\nDefaultLimitNOFILE=1024:20000\n",
    "/etc/containers/containers.conf": (
        "[containers]\n"
        'default_ulimits = ["nofile=1024:1024", "nproc=4096:4096"]\n'
        # Pitfall 3: the host binds every controller to cgroup v1, so the guest's cgroup2 has no pids.max.
        "pids_limit = 0\n"
        "[engine]\n"
        'runtime = "runc"\n'
    ),
    # No network in the guest (--private-network): nothing may try to reach it at boot.
    "/etc/hostname": "rigsmith-guest\n",
}


class GuestError(AssertionError):
    """The guest could not be built, booted or cleaned up (a test failure, never a skip)."""


def _need(binary: str) -> str:
    path = shutil.which(binary)
    if path is None:
        raise GuestError(f"{binary} is not installed; run `bash scripts/setup.sh` (it installs it with apt)")
    return path


def ensure_rootfs(tar: Path = GUEST_TAR, *, timeout: float = 1800) -> Path:
    """The cached rootfs tarball, built under a lock by .ci/build-systemd-guest when missing."""
    tar.parent.mkdir(parents=True, exist_ok=True)
    with FileLock(str(tar) + ".lock"):
        if tar.is_file():
            return tar
        proc = subprocess.run(
            ["bash", str(BUILD_SCRIPT), str(tar)],
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
        )
        if proc.returncode != 0 or not tar.is_file():
            raise GuestError(f"{BUILD_SCRIPT.name} {tar} failed ({proc.returncode}):\n{proc.stderr[-3000:]}")
    return tar


def _cgroup_roots() -> list[Path]:
    """Where each guest gets a cgroup of its own: both hierarchies of a hybrid host, else the cgroup2 root."""
    base = Path("/sys/fs/cgroup")
    hybrid = [base / h for h in ("unified", "systemd") if (base / h / "cgroup.procs").exists()]
    return hybrid or [base]


@dataclass
class Guest:
    """A booted guest. ``root`` is its rootfs on the host; ``run`` executes a command inside it."""

    name: str
    root: Path
    leader: int  # the guest's PID 1, as the host sees it
    nspawn: subprocess.Popen[bytes]
    cgroups: list[Path]
    log: Path
    bin: Path = field(init=False)  # host dir of wrappers: systemctl/journalctl/podman → the guest's

    def __post_init__(self) -> None:
        self.bin = self.root.parent / f"{self.name}-bin"

    def argv(self, *argv: str) -> list[str]:
        """argv run in every namespace of the guest's PID 1, with the guest's PATH and nothing of ours.

        Pitfall 6: such a process sits outside the guest's cgroup namespace; fine for systemctl, journalctl
        and podman inspect/import/logs; anything needing the guest's cgroups runs as a unit.
        """
        return ["nsenter", "-t", str(self.leader), "-a", "/usr/bin/env", "-i", f"PATH={GUEST_PATH}", *argv]

    def run(
        self, *argv: str, check: bool = True, timeout: float = 60, stdin: bytes | None = None
    ) -> subprocess.CompletedProcess[str]:
        proc = subprocess.run(
            self.argv(*argv), input=stdin, capture_output=True, timeout=timeout, check=False
        )
        out = subprocess.CompletedProcess(
            proc.args,
            proc.returncode,
            proc.stdout.decode(errors="replace"),
            proc.stderr.decode(errors="replace"),
        )
        if check and out.returncode != 0:
            raise GuestError(
                f"in the guest: {shlex.join(argv)} failed ({out.returncode}):\n"
                f"{out.stderr[-2000:]}{out.stdout[-1000:]}"
            )
        return out

    def path(self, guest_path: str) -> Path:
        """The host path of a file in the guest's rootfs."""
        return self.root / guest_path.lstrip("/")

    def show(self, unit: str, *props: str) -> dict[str, str]:
        """``systemctl show UNIT -p …`` as a dict."""
        out = self.run("systemctl", "show", unit, *(f"--property={p}" for p in props)).stdout
        return dict(ln.split("=", 1) for ln in out.splitlines() if "=" in ln)

    def journal(self, unit: str) -> str:
        return self.run("journalctl", "--unit", unit, "--no-pager", "--output", "short-precise").stdout

    def env(self) -> dict[str, str]:
        """Environment whose PATH puts the guest's systemctl, journalctl and podman first (lifecycle.Ops)."""
        return {**os.environ, "PATH": f"{self.bin}:{os.environ['PATH']}"}

    def _write_wrappers(self) -> None:
        self.bin.mkdir(exist_ok=True)
        for tool in ("systemctl", "journalctl", "podman"):
            w = self.bin / tool
            w.write_text(f'#!/bin/sh\nexec {shlex.join(self.argv(tool))} "$@"\n')
            w.chmod(0o755)


@dataclass
class GuestHost:
    """rigsmith's Host protocol (operating.host) for the guest: probes run and files are read inside it."""

    guest: Guest

    def run(self, argv: Sequence[str]) -> CmdResult:
        proc = self.guest.run(*argv, check=False)
        return CmdResult(127 if proc.returncode == 127 else proc.returncode, proc.stdout, proc.stderr)

    def read(self, path: str) -> str | None:
        proc = self.guest.run("cat", path, check=False)
        return proc.stdout if proc.returncode == 0 else None

    def listdir(self, path: str) -> list[str]:
        proc = self.guest.run("ls", "-1A", path, check=False)
        return sorted(proc.stdout.split()) if proc.returncode == 0 else []

    def statvfs(self, path: str) -> tuple[int, int] | None:
        st = os.statvfs(self.guest.path(path))
        return st.f_blocks * st.f_frsize, st.f_bavail * st.f_frsize

    def tree_bytes(self, path: str) -> int:
        return sum(p.lstat().st_size for p in self.guest.path(path).rglob("*") if p.is_file())

    def size(self, path: str) -> int | None:
        proc = self.guest.run("stat", "-L", "-c", "%s", path, check=False)
        return int(proc.stdout) if proc.returncode == 0 and proc.stdout.strip().isdigit() else None


def _pids_in(cgroups: Sequence[Path]) -> set[int]:
    pids: set[int] = set()
    for cg in cgroups:
        if cg.is_dir():
            for procs in cg.rglob("cgroup.procs"):
                try:
                    pids |= {int(p) for p in procs.read_text().split()}
                except OSError:
                    continue
    return pids


def _mounts_under(path: Path) -> list[str]:
    mounts = [ln.split()[1] for ln in Path("/proc/mounts").read_text().splitlines()]
    return [m for m in mounts if m == str(path) or m.startswith(f"{path}/")]


def _must(argv: Sequence[str], what: str) -> None:
    proc = subprocess.run(list(argv), capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        raise GuestError(f"{what}: {shlex.join(argv)} failed ({proc.returncode}): {proc.stderr[-2000:]}")


def _leader(nspawn: int, timeout: float) -> int:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        proc = subprocess.run(["pgrep", "-P", str(nspawn), "-x", "systemd"], capture_output=True, text=True)
        if proc.stdout.split():
            return int(proc.stdout.split()[0])
        time.sleep(0.05)
    raise GuestError(f"no systemd child of systemd-nspawn (PID {nspawn}) after {timeout}s")


@contextmanager
def booted(
    workdir: Path,
    *,
    tar: Path | None = None,
    files: Mapping[str, str] = GUEST_FILES,
    boot_timeout: float = 60,
) -> Iterator[Guest]:
    """Extract the cached rootfs under ``workdir``, boot it, yield the guest; power it off and remove it all.

    On exit nothing may be left: no nspawn or guest process, no cgroup, no mount, no rootfs. A leftover
    is killed and removed, then reported as a GuestError (a failed teardown, not a quiet one).
    """
    nspawn_bin = _need("systemd-nspawn")
    _need("nsenter")
    _need("zstd")
    tarball = tar or ensure_rootfs()
    reap_stale()
    name = f"rs-guest-{os.getpid()}-{time.monotonic_ns() % 100000}"
    root = workdir / name
    root.mkdir(parents=True)
    cgroups = [base / name for base in _cgroup_roots()]
    log = workdir / f"{name}.log"
    guest: Guest | None = None
    nspawn: subprocess.Popen[bytes] | None = None
    try:
        # A tmpfs of its own: extracting and dropping 300 MiB of small files on the shared disk took 20 s.
        _must(["mount", "-t", "tmpfs", "-o", f"size={TMPFS_SIZE},mode=0755", "tmpfs", str(root)], "mount")
        extract = subprocess.run(
            f"zstd -dcq {shlex.quote(str(tarball))} | tar -C {shlex.quote(str(root))} --numeric-owner "
            "--xattrs --xattrs-include='*' -xf -",
            shell=True,
            capture_output=True,
            text=True,
            check=False,
        )
        if extract.returncode != 0:
            raise GuestError(f"extracting {tarball} failed: {extract.stderr[-2000:]}")
        for guest_path, text in files.items():
            p = root / guest_path.lstrip("/")
            p.parent.mkdir(parents=True, exist_ok=True)
            p.write_text(text)
        for cg in cgroups:
            cg.mkdir()
        # Pitfall 5: its own cgroup, else nspawn (--keep-unit) puts payload/ and supervisor/ in the host's
        # root cgroup. The shell joins it, then execs nspawn in place.
        join = "; ".join(f"echo $$ > {shlex.quote(str(cg / 'cgroup.procs'))}" for cg in cgroups)
        argv = [
            nspawn_bin,
            "-b",
            "-D",
            str(root),
            "-M",
            name,
            # Pitfall 5: no systemd/machined on this host to register with.
            "--register=no",
            "--keep-unit",
            # Pitfall 8: the guest's "host network" is its own loopback; nothing reaches the host's.
            "--private-network",
            "--console=passive",
            "--resolv-conf=off",
            "--timezone=off",
            "--link-journal=no",
            # Pitfalls 1 and 2: runc in the guest needs the session keyring and BPF device filters.
            "--system-call-filter=add_key keyctl request_key bpf",
        ]
        with log.open("wb") as out:
            nspawn = subprocess.Popen(
                ["bash", "-c", f"{join}; exec {shlex.join(argv)}"],
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                # The guest sees pure cgroup2, where podman's systemd cgroup manager works.
                env={**os.environ, "SYSTEMD_NSPAWN_UNIFIED_HIERARCHY": "1"},
                start_new_session=True,
            )
        leader = _leader(nspawn.pid, boot_timeout)
        guest = Guest(name, root, leader, nspawn, cgroups, log)
        deadline = time.monotonic() + boot_timeout
        state = ""
        while time.monotonic() < deadline:
            state = guest.run("systemctl", "is-system-running", check=False).stdout.strip()
            if state in ("running", "degraded"):
                break
            time.sleep(0.1)
        else:
            raise GuestError(f"guest {name} not up after {boot_timeout}s (state {state!r}):\n{_tail(log)}")
        guest._write_wrappers()
        yield guest
    except BaseException:
        _teardown(name, root, nspawn, guest, cgroups)  # the error in flight is the one to report
        raise
    leftovers = _teardown(name, root, nspawn, guest, cgroups)
    if leftovers:
        raise GuestError(f"guest {name} left things behind (now removed): {'; '.join(leftovers)}")


_NAME = re.compile(r"^rs-guest-(\d+)-\d+$")


def _owner_gone(name: str) -> bool:
    """A guest name of ours whose test session (the PID in its name) no longer runs."""
    m = _NAME.match(name)
    return bool(m) and not Path(f"/proc/{m.group(1)}").exists()


def reap_stale() -> list[str]:
    """Remove the guests of test sessions that died before their teardown (a killed pytest): their
    processes (by PID, from the guest's own cgroup), cgroups, tmpfs mounts and nspawn state. Returns the
    names reaped. Guests of live sessions (other checkouts running tests now) are left alone."""
    reaped: set[str] = set()
    for base in _cgroup_roots():
        for cg in base.glob("rs-guest-*"):
            if not _owner_gone(cg.name):
                continue
            pids = _pids_in([cg])
            for pid in pids:
                with suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
            # gone from the cgroup and from /proc (reaped by their new parent), not only signalled
            deadline = time.monotonic() + 10
            while time.monotonic() < deadline and (
                _pids_in([cg]) or any(Path(f"/proc/{p}").exists() for p in pids)
            ):
                time.sleep(0.1)
            _rmdir_tree(cg)
            reaped.add(cg.name)
    for line in Path("/proc/mounts").read_text().splitlines():
        fields = line.split()
        mnt = Path(fields[1])
        if fields[2] == "tmpfs" and _owner_gone(mnt.name):
            subprocess.run(["umount", "-l", str(mnt)], capture_output=True, check=False)
            with suppress(OSError):
                mnt.rmdir()
            reaped.add(mnt.name)
    for name in reaped:
        shutil.rmtree(Path("/run/systemd/nspawn/propagate") / name, ignore_errors=True)
    return sorted(reaped)


def _rmdir_tree(cg: Path) -> None:
    """Remove a cgroup and its children, deepest first (a concurrent reaper may remove some first)."""
    if cg.exists():
        for d in sorted((p for p in cg.rglob("*") if p.is_dir()), key=lambda p: len(p.parts), reverse=True):
            with suppress(FileNotFoundError):
                d.rmdir()
        with suppress(FileNotFoundError):
            cg.rmdir()


def _tail(log: Path) -> str:
    try:
        return log.read_text(errors="replace")[-3000:]
    except OSError:
        return ""


def _teardown(
    name: str,
    root: Path,
    nspawn: subprocess.Popen[bytes] | None,
    guest: Guest | None,
    cgroups: Sequence[Path],
) -> list[str]:
    """Power the guest off and remove every trace; returns what had to be forced."""
    leftovers: list[str] = []
    if nspawn is not None and nspawn.poll() is None:
        if guest is not None:
            guest.run("systemctl", "poweroff", "--no-block", check=False, timeout=10)
        else:
            nspawn.send_signal(signal.SIGTERM)  # nspawn -b asks the guest's systemd to halt
        try:
            nspawn.wait(timeout=30)
        except subprocess.TimeoutExpired:
            leftovers.append("systemd-nspawn did not exit 30 s after poweroff; killed")
            nspawn.kill()
            nspawn.wait(timeout=10)
    stray = _pids_in(cgroups)
    if stray:
        leftovers.append(f"processes {sorted(stray)} outlived the guest; killed")
        for pid in stray:
            with suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        time.sleep(0.2)
    for cg in cgroups:
        try:
            _rmdir_tree(cg)
        except OSError as err:
            leftovers.append(f"cgroup {cg} could not be removed: {err}")
    for d in (Path("/run/systemd/nspawn/propagate") / name, Path("/run/systemd/nspawn/locks") / name):
        shutil.rmtree(d, ignore_errors=True)
    mounts = sorted(_mounts_under(root), key=len, reverse=True)
    if mounts[:-1] or (mounts and mounts[-1] != str(root)):
        leftovers.append(f"mounts {mounts[:-1]} under the rootfs; unmounted")
    for m in mounts:
        subprocess.run(
            ["umount", "-l", m] if m != str(root) else ["umount", m], capture_output=True, check=False
        )
    if _mounts_under(root):
        leftovers.append(f"{root} is still mounted")
    else:
        shutil.rmtree(root, ignore_errors=True)
    if guest is not None:
        shutil.rmtree(guest.bin, ignore_errors=True)
    if root.exists():
        leftovers.append(f"{root} could not be removed")
    return leftovers


# -- the stand-in engine inside the guest -------------------------------------------------------------

#: The guest's stand-in engine: tests.support.podman's RECORDER, plus what a unit's health check and stop
#: need.
#: /health (busybox httpd on the --port of its argv) answers STANDIN_HEALTH_DELAY seconds after start;
#: with STANDIN_IGNORE_TERM set it ignores SIGTERM, like a vLLM that does not drain in time; with STANDIN_EXIT
#: it exits with that status right after its startup lines, like a vLLM that crashes while loading.
RECORDER_TRAP = "trap 'echo \"SIGTERM received\"; exit 0' TERM\n"
_HEALTH_AND_TRAP = """\
port=8000; prev=
for a in "$@"; do [ "$prev" = --port ] && port=$a; prev=$a; done
( sleep "${STANDIN_HEALTH_DELAY:-0}"; mkdir -p /tmp/www; echo ok > /tmp/www/health
  exec httpd -f -p "127.0.0.1:$port" -h /tmp/www ) &
if [ -n "${STANDIN_EXIT:-}" ]; then echo "exiting with $STANDIN_EXIT"; exit "$STANDIN_EXIT"; fi
if [ -n "${STANDIN_IGNORE_TERM:-}" ]; then
  trap 'echo "SIGTERM ignored"' TERM
else
  trap 'echo "SIGTERM received"; exit 0' TERM
fi
"""
#: The image's python3 runs only the unit's health probe (``python3 -c "…urlopen('URL', timeout=N)"``),
#: with busybox wget: exit 0 only when URL answers 2xx (its -T segfaults in busybox-static 1.35; podman
#: enforces HealthTimeout anyway).
PYTHON3_HEALTH = """\
#!/bin/sh
[ "$1" = -c ] || exit 2
url=$(printf '%s' "$2" | sed -n "s/.*urlopen('\\([^']*\\)'.*/\\1/p")
[ -n "$url" ] || exit 2
exec wget -q -O /dev/null "$url"
"""
GUEST_TOOLS = (
    *RECORDER_TOOLS,
    *("httpd", "wget", "sed", "mkdir"),
)


def guest_engine(recorder: str) -> str:
    """The recorder with the health server and the SIGTERM switch in place of its plain trap."""
    return recorder_ending(recorder, _HEALTH_AND_TRAP)


def recorder_ending(recorder: str, tail: str) -> str:
    """The recorder with ``tail`` (shell lines) in place of its SIGTERM trap."""
    if RECORDER_TRAP not in recorder:
        raise GuestError("tests.support.podman.RECORDER no longer ends with the trap this stand-in replaces")
    return recorder.replace(RECORDER_TRAP, tail)


def import_image(guest: Guest, tar: bytes, ref: str, change: str) -> str:
    """``podman import`` a rootfs tar into the guest's own storage under ``ref``."""
    guest.run("podman", "import", "--quiet", "--change", change, "-", ref, stdin=tar, timeout=120)
    return ref


def install_cdi(guest: Guest, spec_json: str, name: str = "rigsmith-test-example-gpu.json") -> Path:
    """A CDI spec in the guest's /etc/cdi (where its podman reads them)."""
    path = guest.path(f"/etc/cdi/{name}")
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(spec_json)
    return path
