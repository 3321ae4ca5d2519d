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
import shlex
import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest
from filelock import FileLock

from tests.support.common import STANDIN_IMAGE, require
from tests.support.podman import BUSYBOX_IMAGE_ENV, FAKE_CDI_SPEC, RECORDER, busybox_rootfs_tar
from tests.support.systemd_guest import (
    GUEST_TOOLS,
    PYTHON3_HEALTH,
    Guest,
    booted,
    guest_engine,
    import_image,
    install_cdi,
)
from tests.support.targets import PC106_DIR, capture, fetch_quadlet


@pytest.fixture(scope="session")
def quadlet_bin() -> Path:
    """The quadlet generator (fails when it cannot be fetched: run `bash .ci/run`)."""
    return fetch_quadlet()


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
                proc = capture(argv, timeout=600)
                if proc.returncode != 0:
                    pytest.fail(f"{shlex.join(argv)} failed: {proc.stderr[-2000:]}", pytrace=False)
    version = capture([str(PC106_DIR / "bin/podman-compose"), "version"]).stdout
    assert "1.0.6" in version, version
    return {"1.0.6": [str(PC106_DIR / "bin/podman-compose")], "1.6.0": [current]}


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
