"""Seed 000's pitfall 2 on the lxc target, under real liblxc: the CT's ``lxc.hook.pre-start`` holds the
rule the other targets hold before their container starts (one check, ``common.FILE_CHECK``): a file
mount's host file of exactly ``sparse_size`` bytes, created sparse when missing (owned by the CT's root
when the CT is unprivileged), a stale file of another size or a directory there refused before liblxc
mounts anything."""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from rigsmith.project import Project
from rigsmith.rendering import deploy
from rigsmith.rendering.targets import LxcOptions
from tests.support.common import require
from tests.support.liblxc import liblxc_config, lxc_execute
from tests.support.targets import SEEDS, render_seed

SEED = SEEDS[0]  # flash-next-int4-3x3090: the PLE table, 102400491520 bytes
#: PVE's default idmap for an unprivileged CT (what PVE writes into the config liblxc reads).
CT_ROOT = 100000
IDMAP = (f"lxc.idmap = u 0 {CT_ROOT} 65536", f"lxc.idmap = g 0 {CT_ROOT} 65536")


def _ct(project: Project, out: Path) -> tuple[str, str, int]:
    """The seed's pct.conf, the file mount's host path and its size."""
    files = render_seed(project, "lxc", SEED, out, lxc=LxcOptions())
    conf = next(text for rel, text in files.items() if rel.endswith(".conf"))
    plan, _ = deploy.artifacts(project, "lxc", deployment=SEED, out=out)
    (mount,) = [m for m in plan.mounts if m.kind == "file"]
    assert mount.sparse_size
    return conf, mount.host, mount.sparse_size


def test_the_ct_refuses_a_stale_file_or_a_directory_and_starts_with_the_sparse_file_it_creates(
    seed_project: Project, tmp_path: Path, busybox_rootfs: Path
) -> None:
    require("lxc-execute")
    conf, host, size = _ct(seed_project, tmp_path / "out")
    config, targets = liblxc_config(conf, busybox_rootfs, tmp_path / "fake", memlock="4096")
    table = targets[host]
    inside = "/" + host.lstrip("/")
    probe = f"echo STARTED; stat -c '%F %s' {inside}"
    log = tmp_path / "lxc.log"

    # The patched loader's stale file (pitfall 2: a 0-byte file): refused before the CT starts, left as is.
    table.write_bytes(b"")
    proc = lxc_execute(tmp_path / "lxcpath", "rs-stale", config, probe, log=log)
    assert proc.returncode != 0 and "STARTED" not in proc.stdout
    assert f"{table} has the wrong size; the engine needs exactly {size} bytes" in log.read_text()
    assert table.stat().st_size == 0

    # What podman makes for a missing path: a directory. Refused, naming it.
    table.unlink()
    table.mkdir()
    proc = lxc_execute(tmp_path / "lxcpath", "rs-dir", config, probe, log=log)
    assert proc.returncode != 0 and "STARTED" not in proc.stdout
    assert f"{table} is a directory, but the deployment mounts a file there" in log.read_text()

    # Missing: created sparse at its exact size on the host, and a file (not a directory) inside the CT.
    table.rmdir()
    proc = lxc_execute(tmp_path / "lxcpath", "rs-new", config, probe, log=log)
    assert proc.returncode == 0, proc.stderr
    assert f"STARTED\nregular file {size}\n" in proc.stdout
    assert table.stat().st_size == size and table.stat().st_blocks == 0
    assert f"created sparse file {table} ({size} bytes)" in log.read_text()

    # Present at its size: the CT starts with it, the file untouched.
    table.write_bytes(b"filled by the loader")
    os.truncate(table, size)
    proc = lxc_execute(tmp_path / "lxcpath", "rs-again", config, probe, log=log)
    assert proc.returncode == 0 and f"STARTED\nregular file {size}\n" in proc.stdout, proc.stderr
    with table.open("rb") as f:
        assert f.read(20) == b"filled by the loader"


@pytest.fixture
def unprivileged_root(busybox_rootfs: Path) -> Iterator[Path]:
    """A directory the CT's mapped root can traverse (pytest's tmp dirs are 0700), holding a busybox rootfs
    owned by that root; removed afterwards."""
    base = Path(tempfile.mkdtemp(prefix="rs-ct-", dir=os.environ["PYTEST_DEBUG_TEMPROOT"]))
    try:
        base.chmod(0o711)
        rootfs = base / "rootfs"
        shutil.copytree(busybox_rootfs, rootfs, symlinks=True)
        for p in [rootfs, *rootfs.rglob("*")]:
            os.lchown(p, CT_ROOT, CT_ROOT)
        yield base
    finally:
        shutil.rmtree(base)


def test_an_unprivileged_ct_can_write_the_file_its_hook_creates(
    seed_project: Project, tmp_path: Path, unprivileged_root: Path
) -> None:
    require("lxc-execute")
    conf, host, size = _ct(seed_project, tmp_path / "out")
    base = unprivileged_root
    config, targets = liblxc_config(conf, base / "rootfs", base / "fake", memlock="4096", extra=IDMAP)
    table = targets[host]
    inside = "/" + host.lstrip("/")
    write = f"echo loaded > {inside} && echo WROTE"

    # A file root made on the host (right size): the CT starts, but its root cannot write it (what
    # provision.sh's writability check names).
    table.touch()
    os.truncate(table, size)
    proc = lxc_execute(base / "lxcpath", "rs-rootowned", config, write)
    assert proc.returncode != 0 and "WROTE" not in proc.stdout

    # Created by the hook: owned by the CT's root as PVE maps it, so the engine inside can fill it.
    table.unlink()
    proc = lxc_execute(base / "lxcpath", "rs-unpriv", config, write)
    assert proc.returncode == 0 and "WROTE" in proc.stdout, proc.stderr
    assert (table.stat().st_uid, table.stat().st_gid) == (CT_ROOT, CT_ROOT)
    assert table.read_bytes() == b"loaded\n"
