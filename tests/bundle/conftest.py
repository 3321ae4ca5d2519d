"""The connected side of a bundle, built once: Hub stand-in + registry up, pin, fetch-model, bundle; then
both services stopped, so every test here runs the offline side with the network really gone.

The engine image is the vLLM-like stand-in (tests/ops), pushed to a local registry and pinned by its
registry digest, exactly as a user's `invoke pin` pins a Docker Hub tag.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from rigsmith import lock as lockmod
from rigsmith.project import Project
from tests.conftest import (
    CONTAINERS_CONF,
    Podman,
    _unmount_under,
    import_busybox_image,
    prepare_host_dirs,
    require,
    write_project,
)
from tests.images import services
from tests.models.conftest import MiB, tiny_files
from tests.models.hubserver import HubServer, random_bytes
from tests.ops.conftest import ENGINE, free_port, ops_data

REPO = Path(__file__).resolve().parents[2]
NAME = "airgap"
MODEL_REPO = "acme/airgapped"
LOCAL_IMAGE = "localhost/rigsmith-bundle-standin:1"
BIG = "model-00003-of-00003.safetensors"


@dataclass(frozen=True)
class Source:
    """The connected machine after `invoke bundle`: project, bundle and what the lock pins."""

    base: Path
    project: Project
    bundle: Path
    data: dict[str, Any]
    files: dict[str, bytes]
    image_ref: str  # REGISTRY/NAME:1 as the spec writes it
    digest: str  # the registry digest the lock holds
    bundle_stdout: str

    @property
    def model_dir(self) -> Path:
        return Path(self.data["model"]["local_dir"])

    @property
    def pinned(self) -> str:
        return f"{self.image_ref.rsplit(':', 1)[0]}@{self.digest}"


def cli_env(project: Project, podman: Podman, **extra: str) -> dict[str, str]:
    """`invoke` acting on ``project`` with ``podman``'s storage first on PATH; no Hub unless given."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("HF_", "HUGGING", "DOCKER_"))}
    env.update(
        HF_HOME=str(project.root / ".hf-home"),
        HF_HUB_DISABLE_TELEMETRY="1",
        HF_HUB_DISABLE_XET="1",
        # A closed port: an offline step that reached for the Hub would fail loudly, not quietly succeed.
        HF_ENDPOINT=f"http://127.0.0.1:{free_port()}",
        RIGSMITH_ROOT=str(project.root),
        PYTHONPATH=os.pathsep.join([str(REPO / "src"), str(REPO)]),
        PATH=f"{podman.bin}:{os.environ['PATH']}",
        CONTAINERS_CONF=str(podman.conf),
    )
    env.update(extra)
    return env


def invoke(project: Project, podman: Podman, *args: str, **env: str) -> subprocess.CompletedProcess[str]:
    inv = shutil.which("invoke")
    assert inv, "invoke is not installed"
    return subprocess.run(
        [inv, "-r", str(REPO), *args],
        env=cli_env(project, podman, **env),
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )


def must(proc: subprocess.CompletedProcess[str]) -> str:
    assert proc.returncode == 0, f"{proc.args} failed ({proc.returncode}):\n{proc.stdout}\n{proc.stderr}"
    return proc.stdout


def model_files() -> dict[str, bytes]:
    files = tiny_files(MODEL_REPO, shards=2, shard_size=2 * MiB)
    files[BIG] = random_bytes("big", 24 * MiB + 7)  # the file the kill -9 test interrupts
    return files


@pytest.fixture(scope="session")
def source(podman: Podman, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Source]:
    """Fetch + pin + bundle on a connected "machine"; Hub stand-in and registry are gone afterwards."""
    require("skopeo")
    require("docker-registry")
    base = tmp_path_factory.mktemp("connected")
    import_busybox_image(podman, base / "rootfs", LOCAL_IMAGE, ("sh", "sleep", "echo"), ENGINE)
    files = model_files()
    with HubServer() as hub, services.registry(base / "registry") as reg:
        sha = hub.repo(MODEL_REPO).add_commit(files)
        ref = f"{reg.host}/bundle-standin:1"
        podman.run("tag", LOCAL_IMAGE, ref)
        podman.run("push", "--tls-verify=false", ref)
        data = ops_data(base, NAME)
        data["engine"]["image"] = ref
        data["model"] = {
            "repo": MODEL_REPO,
            "revision": sha,
            "local_dir": str(base / "models" / NAME),
            "config_patches": [
                {"file": "config.json", "key": "text_config.ple_embedding_dtype", "value": "float16"}
            ],
        }
        prepare_host_dirs(data)
        project = write_project(base, data)
        online = {"HF_ENDPOINT": hub.url}
        must(invoke(project, podman, "pin", **online))
        must(invoke(project, podman, "fetch-model", **online))
        out = must(
            invoke(project, podman, "bundle", "--out", str(base / "bundle"), "--targets", "podman,quadlet")
        )
    digest = lockmod.read(project.lock_path).images[ref].digest
    yield Source(base, project, base / "bundle", data, files, ref, digest, out)


@pytest.fixture
def offline_podman(tmp_path: Path) -> Iterator[Podman]:
    """Podman over fresh, empty storage: the offline machine's engine."""
    runroot = Path(tempfile.mkdtemp(prefix="rsob-", dir="/tmp"))
    p = Podman(tmp_path / "podman-root", runroot, tmp_path / "containers.conf", tmp_path / "podman-bin")
    p.conf.write_text(CONTAINERS_CONF + f'tmp_dir = "{runroot}/libpod"\n')
    p.bin.mkdir()
    (p.bin / "podman").write_text(
        f"#!/bin/sh\nCONTAINERS_CONF={p.conf}; export CONTAINERS_CONF\n"
        f'exec /usr/bin/podman --root {p.root} --runroot {p.runroot} "$@"\n'
    )
    (p.bin / "podman").chmod(0o755)
    yield p
    p.run("rm", "--all", "--force", "--time", "0", check=False)
    p.run("system", "reset", "--force", check=False)
    _unmount_under(tmp_path)
    _unmount_under(runroot)
    shutil.rmtree(runroot, ignore_errors=True)


@pytest.fixture
def small_disk(tmp_path: Path) -> Iterator[Path]:
    """A 4 MiB tmpfs mounted for this test (and unmounted after it)."""
    require("mount")
    where = tmp_path / "small-disk"
    where.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=4m", "tmpfs", str(where)], check=True)
    try:
        yield where
    finally:
        subprocess.run(["umount", "-l", str(where)], check=False)


def offline_project(base: Path) -> Project:
    """A fresh, empty checkout on the offline machine."""
    root = base / "offline-project"
    (root / "deployments").mkdir(parents=True)
    return Project(root)
