"""Fixtures of the targets area: the real consumers of each artifact.

- quadlet: podman's own generator from Debian trixie's podman 5.4.2 package (Debian 12 has none), fetched once
  per machine into /var/cache/rigsmith-test/quadlet exactly as shared/ENVIRONMENT.md says.
- podman-compose: 1.6.0 is installed; 1.0.6 lives in its own venv under /var/cache/rigsmith-test/pc106.
- liblxc: lxc-execute on a busybox rootfs.
- systemd: a Debian trixie guest booted with systemd-nspawn (tests/support/systemd_guest.py), the stand-in
  engine image in its podman storage and the fake CDI vendor in its /etc/cdi.
A missing tool is a failure, never a skip.
"""

from __future__ import annotations

import json
import os
import shlex
import shutil
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from filelock import FileLock

from rigsmith import deploy
from rigsmith.project import Project
from rigsmith.targets import LxcOptions
from tests.conftest import (
    BUSYBOX_IMAGE_ENV,
    FAKE_CDI_SPEC,
    RECORDER,
    STANDIN_IMAGE,
    busybox_rootfs_tar,
    require,
)
from tests.support.systemd_guest import (
    GUEST_TOOLS,
    PYTHON3_HEALTH,
    Guest,
    booted,
    guest_engine,
    import_image,
    install_cdi,
)

CACHE = Path(os.environ.get("RIGSMITH_TEST_CACHE", "/var/cache/rigsmith-test"))
QUADLET_DIR = CACHE / "quadlet"
QUADLET = QUADLET_DIR / "x/usr/libexec/podman/quadlet"
PC106_DIR = CACHE / "pc106"
SEEDS = ("flash-next-int4-3x3090", "flash-next-merlin-4x3090")


def _run(argv: list[str], **kw: object) -> subprocess.CompletedProcess[str]:
    return subprocess.run(argv, capture_output=True, text=True, check=False, **kw)  # type: ignore[call-overload]


def fetch_quadlet(dest: Path = QUADLET_DIR) -> Path:
    """podman's quadlet generator from Debian trixie (apt-get download with a private sources.list)."""
    binary = dest / "x/usr/libexec/podman/quadlet"
    dest.mkdir(parents=True, exist_ok=True)
    with FileLock(str(dest) + ".lock"):
        if binary.is_file():
            return binary
        (dest / "lists/partial").mkdir(parents=True, exist_ok=True)
        (dest / "sources.list").write_text("deb http://deb.debian.org/debian trixie main\n")
        o = [
            "-o",
            f"Dir::Etc::SourceList={dest}/sources.list",
            "-o",
            "Dir::Etc::SourceParts=/dev/null",
            "-o",
            f"Dir::State::Lists={dest}/lists",
        ]
        for argv, cwd in ((["apt-get", *o, "update"], None), (["apt-get", *o, "download", "podman"], dest)):
            proc = _run(argv, cwd=cwd, timeout=600)
            if proc.returncode != 0:
                pytest.fail(f"{shlex.join(argv)} failed: {proc.stderr[-2000:]}", pytrace=False)
        deb = sorted(dest.glob("podman_*.deb"))[-1]
        proc = _run(["dpkg", "-x", str(deb), str(dest / "x")])
        assert proc.returncode == 0, proc.stderr
    return binary


@pytest.fixture(scope="session")
def quadlet_bin() -> Path:
    """The quadlet generator (fails when it cannot be fetched: run `bash .ci/run`)."""
    return fetch_quadlet()


@dataclass(frozen=True)
class Quadlet:
    """What podman's generator made of one unit file."""

    service: str
    stderr: str


def run_quadlet(binary: Path, unit: Path, workdir: Path) -> subprocess.CompletedProcess[str]:
    """quadlet -dryrun on a directory holding just this unit."""
    units = workdir / "units"
    if units.exists():
        shutil.rmtree(units)
    units.mkdir(parents=True)
    shutil.copy(unit, units / unit.name)
    return _run([str(binary), "-dryrun"], env={**os.environ, "QUADLET_UNIT_DIRS": str(units)}, timeout=60)


@pytest.fixture(scope="session")
def compose_bins() -> dict[str, list[str]]:
    """podman-compose 1.0.6 (own venv, made once per machine) and the installed release, as argv prefixes."""
    current = require("podman-compose")
    py = PC106_DIR / "bin/python"
    with FileLock(str(PC106_DIR) + ".lock"):
        if not (PC106_DIR / "bin/podman-compose").exists():
            for argv in (
                ["python3", "-m", "venv", str(PC106_DIR)],
                [str(py), "-m", "pip", "install", "-q", "podman-compose==1.0.6"],
            ):
                proc = _run(argv, timeout=600)
                if proc.returncode != 0:
                    pytest.fail(f"{shlex.join(argv)} failed: {proc.stderr[-2000:]}", pytrace=False)
    version = _run([str(PC106_DIR / "bin/podman-compose"), "version"]).stdout
    assert "1.0.6" in version, version
    return {"1.0.6": [str(PC106_DIR / "bin/podman-compose")], "1.6.0": [current]}


def render_seed(project: Project, target: str, name: str, out: Path, **options: object) -> dict[str, str]:
    """Render a target into memory: path relative to out/<target> → text."""
    _plan, files = deploy.artifacts(project, target, deployment=name, out=out, **options)  # type: ignore[arg-type]
    base = out.resolve() / target
    return {
        str(a.path.relative_to(base)) if a.path.is_relative_to(base) else str(a.path): a.content
        for a in files
    }


@pytest.fixture(scope="session")
def busybox_rootfs(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """A busybox rootfs for liblxc containers (lxc-execute)."""
    require("lxc-execute")
    busybox = Path("/bin/busybox")
    if not busybox.exists():
        pytest.fail("busybox-static is not installed; run `bash .ci/run`", pytrace=False)
    root = tmp_path_factory.mktemp("lxc-rootfs")
    for d in ("bin", "dev", "proc", "sys", "tmp", "etc", "srv", "root"):
        (root / d).mkdir()
    shutil.copy2(busybox, root / "bin/busybox")
    for tool in ("sh", "df", "env", "ls", "cat", "stat", "grep", "tail", "tr", "cut", "echo", "test"):
        (root / "bin" / tool).symlink_to("busybox")
    yield root


def lxc_options(**kw: object) -> LxcOptions:
    """LxcOptions with overrides."""
    return LxcOptions(**kw)  # type: ignore[arg-type]


#: Where the venv variants put the venv inside the CT (seed 003's recipe ran ./venv-v2.5 of a patched tree).
CT_VENV = "/opt/vllm-merlin/venv-v2.5"


def as_venv(project: Project, name: str, venv: str = CT_VENV) -> Project:
    """Turn a deployment of ``project`` into its venv variant: ``engine.runtime: venv``, no image."""
    import yaml

    path = project.root / "deployments" / f"{name}.yaml"
    data = yaml.safe_load(path.read_text())
    data["engine"] = {
        **{k: v for k, v in data["engine"].items() if k not in ("image", "build")},
        "runtime": "venv",
        "venv": venv,
    }
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return project


@pytest.fixture(scope="session")
def systemd_guest(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Guest]:
    """A booted systemd guest (session-wide) holding the stand-in image and the fake CDI vendor.

    Its teardown powers it off and fails if any process, cgroup, mount or file of it is left behind.
    """
    work = tmp_path_factory.mktemp("guest")
    with booted(work) as guest:
        tar = busybox_rootfs_tar(
            work / "standin-rootfs",
            GUEST_TOOLS,
            {"vllm": guest_engine(RECORDER), "python3": PYTHON3_HEALTH},
        )
        import_image(guest, tar, STANDIN_IMAGE, BUSYBOX_IMAGE_ENV)
        install_cdi(guest, json.dumps(FAKE_CDI_SPEC, indent=1))
        yield guest
