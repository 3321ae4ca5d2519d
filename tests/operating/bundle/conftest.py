"""Fixtures for the bundle tests. `source` is the connected side, built once: Hub stand-in + registry up,
pin, fetch-model, bundle; then both services stopped, so every test runs the offline side with the network
really gone.

The engine image is the vLLM-like stand-in (`ops_image`), pushed to a local registry and pinned by its
registry digest, exactly as a user's `invoke pin` pins a Docker Hub tag.
"""

from __future__ import annotations

import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from rigsmith.resolving.lock import lock as lockmod
from tests.support import services
from tests.support.bundle import MODEL_REPO, NAME, Source, invoke, model_files, must
from tests.support.common import prepare_host_dirs, require, write_project
from tests.support.hubserver import HubServer
from tests.support.ops import ops_data
from tests.support.podman import Podman, containers_conf, unmount_under


@pytest.fixture(scope="session")
def source(podman: Podman, ops_image: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Source]:
    """Fetch + pin + bundle on a connected "machine"; Hub stand-in and registry are gone afterwards."""
    require("skopeo")
    require("docker-registry")
    base = tmp_path_factory.mktemp("connected")
    files = model_files()
    with HubServer() as hub, services.registry(base / "registry") as reg:
        sha = hub.repo(MODEL_REPO).add_commit(files)
        ref = f"{reg.host}/bundle-standin:1"
        podman.run("tag", ops_image, ref)
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
    p.conf.write_text(containers_conf(runroot))
    p.bin.mkdir()
    (p.bin / "podman").write_text(
        f"#!/bin/sh\nCONTAINERS_CONF={p.conf}; export CONTAINERS_CONF\n"
        f'exec /usr/bin/podman --root {p.root} --runroot {p.runroot} "$@"\n'
    )
    (p.bin / "podman").chmod(0o755)
    yield p
    p.run("rm", "--all", "--force", "--time", "0", check=False)
    p.run("system", "reset", "--force", check=False)
    unmount_under(tmp_path)
    unmount_under(runroot)
    shutil.rmtree(runroot, ignore_errors=True)


@contextmanager
def _tmpfs(where: Path, size: str) -> Iterator[Path]:
    require("mount")
    where.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(where)], check=True)
    try:
        yield where
    finally:
        subprocess.run(["umount", "-l", str(where)], check=False)


@pytest.fixture
def small_disk(tmp_path: Path) -> Iterator[Path]:
    """A 4 MiB tmpfs mounted for this test (and unmounted after it): too small for the bundle."""
    with _tmpfs(tmp_path / "small-disk", "4m") as where:
        yield where


@pytest.fixture
def other_disk(tmp_path: Path) -> Iterator[Path]:
    """A 96 MiB tmpfs mounted for this test: another filesystem, so nothing can be hard-linked there."""
    with _tmpfs(tmp_path / "other-disk", "96m") as where:
        yield where
