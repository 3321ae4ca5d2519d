"""A multi-node deploy points at commands that work: a node's container is no deployment of its own, so
neither the printed next steps nor the compose header may say `--deployment <node container>` (issue 27:
"invoke check-container --deployment mn-box-a" answered "no deployment 'mn-box-a'")."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from rigsmith.rendering import deploy
from rigsmith.rendering.targets import nodes
from tests.support import cluster as fixtures
from tests.support.common import write_project
from tests.support.targets import render_seed

_DEPLOYMENT = re.compile(r"invoke [a-z-]+ --deployment ([a-z0-9][a-z0-9._-]*)")


@pytest.mark.parametrize("name", [fixtures.RAY_NAME, fixtures.DP_NAME])
@pytest.mark.parametrize("target", ["podman", "quadlet", "compose", "lxc"])
def test_every_deployment_a_multi_node_deploy_names_exists(tmp_path: Path, name: str, target: str) -> None:
    project = write_project(tmp_path, fixtures.ray_data(), fixtures.dp_data())
    spec = project.load(name)
    plan, _files = deploy.artifacts(project, target, deployment=name, out=tmp_path / "out")
    printed = "\n".join(nodes.next_steps(target, spec, plan, tmp_path / "out"))
    printed += "\n".join(render_seed(project, target, name, tmp_path / "out").values())
    named = set(_DEPLOYMENT.findall(printed))
    assert named <= {name}, f"{named - {name}} are node containers, not deployments"
    for n in named:
        project.resolve_name(n)
    if target in ("compose", "quadlet"):  # where a single host is told to check-container, a node is not
        assert f"invoke status --deployment {name}" in printed
