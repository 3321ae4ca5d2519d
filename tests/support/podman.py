"""Real podman confined to test storage, the fake CDI vendor spec and the recording stand-in engine."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import textwrap
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.support.common import FAKE_GPUS, FAKE_VENDOR


@dataclass(frozen=True)
class Podman:
    """Rootful podman confined to test storage; ``bin`` holds a `podman` wrapper for generated scripts."""

    root: Path
    runroot: Path
    conf: Path
    bin: Path

    @property
    def env(self) -> dict[str, str]:
        """Environment for a generated script: wrapper first in PATH."""
        env = dict(os.environ)
        env["PATH"] = f"{self.bin}:{env['PATH']}"
        env["CONTAINERS_CONF"] = str(self.conf)
        return env

    def argv(self, *args: str) -> list[str]:
        return ["podman", "--root", str(self.root), "--runroot", str(self.runroot), *args]

    def run(self, *args: str, check: bool = True, timeout: float = 120) -> subprocess.CompletedProcess[str]:
        proc = subprocess.run(
            self.argv(*args),
            env={**os.environ, "CONTAINERS_CONF": str(self.conf)},
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
        )
        if check and proc.returncode != 0:
            raise AssertionError(f"podman {' '.join(args)} failed ({proc.returncode}): {proc.stderr}")
        return proc

    def inspect(self, name: str) -> dict[str, object]:
        data = json.loads(self.run("inspect", name).stdout)
        assert isinstance(data, list) and data
        return dict(data[0])

    def logs_until(self, name: str, marker: str, timeout: float = 60) -> str:
        """Container logs once ``marker`` shows up (fails with the logs on timeout)."""
        deadline = time.monotonic() + timeout
        out = ""
        while time.monotonic() < deadline:
            out = self.run("logs", name, check=False).stdout
            if marker in out:
                return out
            time.sleep(0.2)
        raise AssertionError(f"{marker!r} not in logs of {name} after {timeout}s:\n{out}")


CONTAINERS_CONF = """\
[containers]
default_ulimits = ["nofile=1024:1024", "nproc=4096:4096"]
[engine]
runtime = "runc"
cgroup_manager = "cgroupfs"
"""


def containers_conf(runroot: Path) -> str:
    """The test containers.conf for a podman whose runroot is ``runroot``: its tmp_dir (the "alive" file,
    locks) goes there too. The default /run/libpod is shared by every podman on the machine, and one
    podman's ``system reset`` (a fixture's teardown) removes it from under the others."""
    return CONTAINERS_CONF + f'tmp_dir = "{runroot}/libpod"\n'


def unmount_under(base: Path) -> None:
    """podman leaves its overlay dir bind-mounted; unmount so pytest can prune old temp dirs."""
    mounts = [ln.split()[1] for ln in Path("/proc/mounts").read_text().splitlines()]
    for m in sorted((m for m in mounts if m.startswith(str(base))), key=len, reverse=True):
        subprocess.run(["umount", "-l", m], capture_output=True, check=False)


FAKE_CDI_SPEC = {
    "cdiVersion": "0.5.0",
    "kind": FAKE_VENDOR,
    "devices": [
        {
            "name": n,
            "containerEdits": {
                "env": [f"FAKE_GPU_{n.upper()}=present"],
                "deviceNodes": [{"path": f"/dev/fakegpu{n}", "hostPath": "/dev/null"}],
            },
        }
        for n in (*FAKE_GPUS, "all")
    ],
}
#: The busybox applets of a stand-in image: what RECORDER runs, and cat for tests reading a mounted file.
RECORDER_TOOLS = ("sh", "od", "tr", "env", "printf", "echo", "stat", "ls", "sleep", "cat")
#: The stand-in engine: records argv (hex, one per line), env (hex of `env -0`), /dev/shm, memlock and
#: devices, logs vLLM's readiness line, then idles until SIGTERM.
RECORDER = textwrap.dedent(
    """\
    #!/bin/sh
    hex() { od -An -v -tx1 | tr -d ' \\n'; }
    echo ARGV-BEGIN
    for a in "$@"; do printf '%s' "$a" | hex; echo; done
    echo ARGV-END
    echo "ENV $(env -0 | hex)"
    # statfs(2) of /dev/shm itself, in KiB: df reads the mount table, whose sources hold a recipe's words
    echo "SHM $(($(stat -f -c '%b * %S' /dev/shm) / 1024))"
    echo "MEMLOCK $(ulimit -l)"
    echo "DEVICES $(ls /dev | tr '\\n' ' ')"
    echo "INFO: Application startup complete."
    trap 'echo "SIGTERM received"; exit 0' TERM
    while :; do sleep 1; done
    """
)


@dataclass(frozen=True)
class Recording:
    """What the stand-in engine saw."""

    argv: list[str]
    env: dict[str, str]
    shm_kib: int
    memlock: str
    devices: list[str]


def parse_recording(logs: str) -> Recording:
    lines = logs.splitlines()
    start, end = lines.index("ARGV-BEGIN"), lines.index("ARGV-END")
    argv = [bytes.fromhex(h).decode() for h in lines[start + 1 : end]]
    fields = {ln.split(" ", 1)[0]: [*ln.split(" ", 1), ""][1] for ln in lines[end + 1 :] if " " in ln}
    env: dict[str, str] = {}
    for item in bytes.fromhex(fields["ENV"]).decode().split("\0"):
        if "=" in item:
            k, v = item.split("=", 1)
            env[k] = v
    return Recording(argv, env, int(fields["SHM"]), fields["MEMLOCK"], fields["DEVICES"].split())


#: The stand-in images' PATH (podman import --change).
BUSYBOX_IMAGE_ENV = "ENV=PATH=/usr/local/bin:/bin"


def busybox_rootfs_tar(root: Path, tools: Sequence[str], scripts: dict[str, str]) -> bytes:
    """A busybox rootfs built under ``root``, as a tar: ``tools`` linked in /bin, ``scripts`` (name → text)
    as executables in /usr/local/bin."""
    busybox = Path("/bin/busybox")
    if not busybox.exists():
        pytest.fail("busybox-static is not installed; run `bash scripts/setup.sh` first", pytrace=False)
    for d in ("bin", "usr/local/bin", "tmp", "proc", "sys", "dev", "etc"):
        (root / d).mkdir(parents=True)
    shutil.copy2(busybox, root / "bin/busybox")
    for tool in tools:
        (root / "bin" / tool).symlink_to("busybox")
    for name, text in scripts.items():
        exe = root / "usr/local/bin" / name
        exe.write_text(text)
        exe.chmod(0o755)
    return subprocess.run(["tar", "-C", str(root), "-c", "."], capture_output=True, check=True).stdout


def import_tar(podman: Podman, tar: bytes, ref: str, *changes: str) -> str:
    """``podman import`` a rootfs tar as ``ref`` with Dockerfile-style ``changes``; returns ``ref``."""
    argv = ["import", *(w for ch in changes for w in ("--change", ch)), "-", ref]
    proc = subprocess.run(
        podman.argv(*argv),
        input=tar,
        capture_output=True,
        env={**os.environ, "CONTAINERS_CONF": str(podman.conf)},
        check=False,
    )
    assert proc.returncode == 0, proc.stderr.decode()
    return ref


def import_busybox_image(podman: Podman, root: Path, ref: str, tools: Sequence[str], vllm: str) -> str:
    """Import a busybox rootfs under ``ref`` whose ``/usr/local/bin/vllm`` is the script ``vllm``."""
    return import_tar(podman, busybox_rootfs_tar(root, tools, {"vllm": vllm}), ref, BUSYBOX_IMAGE_ENV)
