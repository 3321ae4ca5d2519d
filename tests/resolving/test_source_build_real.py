"""A source-tree image built for real with Podman's API: the locked commit and assets end up in the image,
and a second build from clean storage with the git and asset servers gone gives the same image."""

from __future__ import annotations

from pathlib import Path

import pytest

from rigsmith.project import Project
from rigsmith.resolving.image import build as buildmod
from rigsmith.resolving.image import engine as enginemod
from rigsmith.resolving.image import registry as registrymod
from rigsmith.resolving.image import sources as sourcesmod
from rigsmith.resolving.lock import lock as lockmod
from tests.support import services
from tests.support.sources import OPS, SCALES, asset_server, git, git_daemon, serve_release, source_image

pytestmark = pytest.mark.engine


def _build(project: Project, svc: services.PodmanService, cache: Path) -> lockmod.LockedBuild:
    eng = enginemod.connect("podman", {"CONTAINER_HOST": svc.url})
    src = sourcesmod.Sources(cache)
    try:
        return buildmod.build_image(project, eng, image="merlin", echo=lambda _: None, sources=src)
    finally:
        src.close()
        eng.close()


def test_a_source_image_holds_the_locked_tree_and_rebuilds_offline_to_the_same_image(
    tmp_path: Path, base_ref: str, podman_api: services.PodmanService, registry: services.LocalRegistry
) -> None:
    cache = tmp_path / "cache"
    root = tmp_path / "project"
    with git_daemon(tmp_path / "git") as upstream, asset_server() as assets:
        source_image(root, base_ref, upstream.url, "v2.5.1", serve_release(assets))
        project = Project(root)
        reg = registrymod.Registry({})
        src = sourcesmod.Sources(cache)
        try:
            buildmod.pin_images(project, reg, echo=lambda _: None)
            sourcesmod.pin_sources(project, src, sourcesmod.check_filled(project), echo=lambda _: None)
        finally:
            reg.close()
            src.close()
        commit = git("rev-parse", "v2.5.1^{commit}", cwd=upstream.work)
        first = _build(project, podman_api, cache)

    # The image runs with the tree where image.yaml put it: the commit's files, the unpacked assets.
    run = podman_api.cli(
        "run", "--rm", "--network", "none", first.image_id, "/bin/sh", "-c",
        f"cat /opt/merlin/{SCALES}; ls /opt/merlin/{OPS}; test -x /opt/merlin/scripts/serve-v2.5.sh && "
        "readlink /opt/merlin/latest; echo PYTHONPATH=$PYTHONPATH; test -e /opt/merlin/.git || echo no-git; "
        "cd ./vllm-v2.5 && pwd",
    )  # fmt: skip
    out = run.stdout.decode()
    assert '"k_scale": 0.5' in out
    assert f"/opt/merlin/{OPS}" in out
    assert "scales\n" in out and "PYTHONPATH=/opt/merlin/vllm-v2.5" in out and "no-git" in out
    assert out.endswith("/opt/merlin/vllm-v2.5\n")  # TREE=./vllm-v2.5 resolves against the tree (WORKDIR)
    labels = podman_api.cli(
        "image", "inspect", "--format", "{{json .Labels}}", first.image_id
    ).stdout.decode()
    assert f'"io.rigsmith.tree.commit":"{commit}"' in labels

    # Servers gone, fresh storage: the cached, verified inputs give the very same image.
    with services.podman_service(tmp_path / "clean", [registry.host]) as clean:
        second = _build(project, clean, cache)
    assert second.image_id == first.image_id
    assert second.inputs_sha256 == first.inputs_sha256
