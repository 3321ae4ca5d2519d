"""The systemd guest harness itself: a guest leaves nothing behind, and one whose test session was killed is
reaped by the next session (tests/support/systemd_guest.py)."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path

import pytest

from tests.support.common import REPO
from tests.support.systemd_guest import (
    GuestError,
    _cgroup_roots,
    _mounts_under,
    _pids_in,
    booted,
    reap_stale,
)

# Every boot reaps the guests of dead sessions machine-wide: this file's guests and the systemd_guest
# fixture's run on one xdist worker, one at a time (tests/conftest.py SHARED_GROUPS).
pytestmark = [pytest.mark.engine, pytest.mark.xdist_group("systemd-guest")]


def _guest_processes(name: str) -> list[int]:
    """Host PIDs of processes whose cgroup names the guest."""
    out = []
    for p in Path("/proc").iterdir():
        if p.name.isdigit():
            try:
                if f"/{name}" in (p / "cgroup").read_text():
                    out.append(int(p.name))
            except OSError:
                continue
    return out


def _assert_gone(name: str, root: Path, cgroups: Sequence[Path]) -> None:
    assert not [cg for cg in cgroups if cg.exists()]
    assert not _mounts_under(root) and not root.exists()
    assert not _guest_processes(name)
    assert not (Path("/run/systemd/nspawn/propagate") / name).exists()


def test_a_guest_with_services_running_leaves_nothing_behind(tmp_path: Path) -> None:
    with booted(tmp_path) as guest:
        guest.run("systemd-run", "--unit", "busy", "sleep", "1000")
        assert guest.run("systemctl", "is-active", "busy.service").stdout.strip() == "active"
        name, root, cgroups = guest.name, guest.root, guest.cgroups
        assert len(_pids_in(cgroups)) >= 3 and _mounts_under(root) == [str(root)]
    _assert_gone(name, root, cgroups)


def test_the_guest_of_a_killed_session_is_reaped_by_the_next(tmp_path: Path) -> None:
    code = (
        "import sys, time\n"
        "from pathlib import Path\n"
        "from tests.support.systemd_guest import booted\n"
        "with booted(Path(sys.argv[1])) as g:\n"
        "    print(g.name, g.root, *g.cgroups, flush=True)\n"
        "    time.sleep(600)\n"
    )
    session = subprocess.Popen(
        [sys.executable, "-c", code, str(tmp_path)], cwd=REPO, stdout=subprocess.PIPE, text=True
    )
    try:
        assert session.stdout is not None
        name, root, *cgs = session.stdout.readline().split()
    finally:
        session.kill()  # no teardown runs: the guest outlives its session
        session.wait()
    cgroups = [Path(c) for c in cgs]
    time.sleep(0.2)
    assert _guest_processes(name), "the guest died with its session: nothing to reap"
    assert name in reap_stale()
    _assert_gone(name, Path(root), cgroups)


def test_a_guest_that_cannot_boot_is_an_error_and_leaves_nothing(tmp_path: Path) -> None:
    def ours() -> set[Path]:  # this session's guests (the session's own systemd_guest may be up)
        return {cg for base in _cgroup_roots() for cg in base.glob(f"rs-guest-{os.getpid()}-*")}

    before = ours()
    with pytest.raises(GuestError) as err, booted(tmp_path, tar=tmp_path / "missing.tar.zst"):
        pytest.fail("the guest booted without a rootfs")
    assert "missing.tar.zst" in str(err.value)
    assert not _mounts_under(tmp_path) and not list(tmp_path.glob("rs-guest-*/"))
    assert ours() == before
