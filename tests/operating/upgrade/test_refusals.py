"""What upgrade and rollback refuse before they change anything: a rollback whose image is gone or whose
model files are neither in the model dir nor kept; an upgrade with no disk room for two snapshots."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from rigsmith.resolving.lock import lock as lockmod
from rigsmith.resolving.lock import lockhistory
from tests.support.bundle import invoke, must
from tests.support.common import prepare_host_dirs, write_project
from tests.support.hubserver import HubServer, random_bytes
from tests.support.ops import ops_data
from tests.support.podman import Podman, busybox_rootfs_tar, import_tar
from tests.support.upgrade import snapshot

pytestmark = pytest.mark.engine


def _image(podman: Podman, tar: bytes, rev: str) -> str:
    ref = import_tar(podman, tar, f"localhost/rigsmith-rollback-test:{rev}", f"ENV=REV={rev}")
    return "sha256:" + podman.run("image", "inspect", "--format", "{{.Id}}", ref).stdout.strip()


def test_rollback_is_refused_naming_the_removed_image_and_the_missing_model_file(
    tmp_path: Path, podman: Podman, fake_cdi: object
) -> None:
    tar = busybox_rootfs_tar(tmp_path / "rootfs", ("sh",), {"vllm": "#!/bin/sh\n"})
    old_id, new_id = _image(podman, tar, f"a{os.getpid()}"), _image(podman, tar, f"b{os.getpid()}")
    data = ops_data(tmp_path, "rb")
    del data["engine"]["image"]  # type: ignore[attr-defined]
    data["engine"]["build"] = "serving"  # type: ignore[index]
    data["model"]["config_patches"] = []  # type: ignore[index]
    prepare_host_dirs(data)
    project = write_project(tmp_path, data)
    repo = data["model"]["repo"]  # type: ignore[index]

    def build(image_id: str, commit: str, size: int = 1234) -> None:
        with lockmod.locked(project.lock_path) as lock:
            lock.builds["serving"] = lockmod.LockedBuild(ref="localhost/serving", image_id=image_id, base="x")
            lock.models["rb"] = lockmod.LockedModel(
                repo=repo,
                commit=commit,
                files={"weights.bin": lockmod.LockedFile(size=size, sha256="e" * 64)},
            )

    build(old_id, "1" * 40)
    build(new_id, "2" * 40, 999)
    # the file lock 2 pins is in the model dir: lock 2 could be rolled back to (a refusal names it)
    (Path(str(data["model"]["local_dir"])) / "weights.bin").write_bytes(b"w" * 999)  # type: ignore[index]
    build(new_id, "3" * 40, 999)
    podman.run("rmi", "--force", old_id)
    before = project.lock_path.read_bytes()
    out = invoke(project, podman, "rollback", "--to", "1", "--memlock", "host")
    assert out.returncode == 1, out.stdout + out.stderr
    assert "cannot roll rb back to lock 1; nothing was changed" in out.stderr
    assert f"image {old_id} is not in local storage" in out.stderr
    assert (
        "model file model: " in out.stderr
        and "weights.bin (1.2 KiB) is neither in the model dir" in out.stderr
    )
    assert "Traceback" not in out.stderr
    assert "lock 2 has everything it needs here: `invoke rollback --to 2`" in out.stderr, out.stderr
    assert project.lock_path.read_bytes() == before and len(lockhistory.entries(project.lock_path)) == 3
    podman.run("rmi", "--force", new_id, check=False)


@pytest.fixture
def small_disk(tmp_path: Path) -> Path:
    """A 1 MiB tmpfs: room for one small snapshot, not for a second beside it."""
    d = tmp_path / "small-disk"
    d.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", str(d)], check=True)
    try:
        yield d
    finally:
        subprocess.run(["umount", "-l", str(d)], check=False)


def test_an_upgrade_without_room_for_two_snapshots_is_refused_before_anything_changes(
    tmp_path: Path, podman: Podman, hub_server: HubServer, small_disk: Path
) -> None:
    hub_server.reset()
    repo = "acme/upgrade-small-disk"
    hub_server.repo(repo).add_commit(snapshot(repo, "model-v1", 200.0))
    data = ops_data(tmp_path, "small")
    data["model"] = {**data["model"], "repo": repo, "local_dir": str(small_disk / "model")}  # type: ignore[dict-item]
    prepare_host_dirs(data)
    project = write_project(tmp_path, data)
    online = {"HF_ENDPOINT": hub_server.url}
    must(invoke(project, podman, "pin", **online))
    must(invoke(project, podman, "fetch-model", **online))
    bigger = {**snapshot(repo, "model-v2", 200.0), "extra.safetensors": random_bytes("extra", 900 * 1024)}
    hub_server.repo(repo).add_commit(bigger)
    before = project.lock_path.read_bytes()
    entries = len(lockhistory.entries(project.lock_path))

    out = invoke(project, podman, "upgrade", "--memlock", "host", **online)
    assert out.returncode == 1, out.stdout + out.stderr
    assert (
        "not enough disk to keep the last-known-good model beside the new one; nothing was changed"
        in out.stderr
    )
    assert f"{small_disk / 'model'}: the new snapshot needs 900.0 KiB" in out.stderr
    assert project.lock_path.read_bytes() == before
    assert len(lockhistory.entries(project.lock_path)) == entries
    assert not (small_disk / "model/.rigsmith/kept").exists()
    assert not (small_disk / "model/extra.safetensors").exists()
    assert not (project.root / ".rigsmith/locks/staged.lock").exists()
