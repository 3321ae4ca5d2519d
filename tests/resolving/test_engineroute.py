"""A deployment's proposed engine build (resolving.image.engineroute): which definition it is, what pin does
with it while it is still to fill, and the spec change a build for the deployment makes."""

from __future__ import annotations

import shutil
from pathlib import Path

import yaml

from rigsmith import spec as specmod
from rigsmith.project import Project
from rigsmith.resolving.image import build as buildmod
from rigsmith.resolving.image import engineroute
from tests.support.common import REPO

NAME = "flash-next-merlin-4x3090"


def _repo_copy(tmp_path: Path) -> Project:
    root = tmp_path / "rig"
    shutil.copytree(REPO / "deployments", root / "deployments")
    shutil.copytree(REPO / "images", root / "images", ignore=shutil.ignore_patterns("patches"))
    return Project(root)


def test_the_main_job_proposes_the_image_named_after_it_and_pin_waits_for_it(tmp_path: Path) -> None:
    project = _repo_copy(tmp_path)
    main, seed000 = project.load(NAME), project.load("flash-next-int4-3x3090")
    found = engineroute.proposed(project, main)
    assert found is not None and found.name == NAME and found.provides == ("/opt/merlin",)
    assert (
        found.to_fill == ("tree.repo", "tree.assets[0].url", "tree.assets[1].url") and found.ref == "v2.5.1"
    )
    assert engineroute.proposed(project, seed000) is None  # it builds its own (engine.build)
    # still to fill: a bare pin leaves it (and its base) alone, and the main job pins no image yet
    assert engineroute.pinnable(project) == ["vllm-3x3090"]
    assert ("vllm/vllm-openai:latest", f"images/{NAME}/image.yaml base") not in buildmod.floating_image_refs(
        project
    )
    assert engineroute.images_of(project, main) == []
    # filled: the main job's pin locks it
    path = project.images / NAME / "image.yaml"
    data = yaml.safe_load(path.read_text())
    data["tree"]["repo"] = "https://example.com/merlin.git"
    for a in data["tree"]["assets"]:
        a["url"] = f"https://example.com/{a['name']}.tar.gz"
    path.write_text(yaml.safe_dump(data))
    assert engineroute.images_of(project, main) == [NAME]
    assert ("vllm/vllm-openai:latest", f"images/{NAME}/image.yaml base") in buildmod.floating_image_refs(
        project, NAME
    )
    filled = engineroute.proposed(project, main)
    assert filled is not None and filled.to_fill == ()
    clone = engineroute.missing_checkout(main, main.mounts[0], filled)
    assert "git clone --branch v2.5.1 https://example.com/merlin.git ~/src/merlin" in clone


def test_a_build_for_the_deployment_runs_it_and_drops_only_the_mounts_it_replaces() -> None:
    main = specmod.load(REPO / "deployments" / f"{NAME}.yaml")
    data = specmod.to_data(main)
    data["mounts"] += [
        {"host": "/srv/cache", "container": "/opt/merlin/.cache"},  # under the tree: hidden by nothing now
        {"host": "/srv/scales", "container": "/opt/scales"},  # beside it: kept
    ]
    linked = engineroute.link(specmod.from_data(data), NAME, ("/opt/merlin",))
    assert linked.engine.build == NAME and linked.engine.image is None
    assert [m.container for m in linked.mounts] == ["/opt/scales"]
    assert linked.engine.args == main.engine.args and linked.env == main.env
