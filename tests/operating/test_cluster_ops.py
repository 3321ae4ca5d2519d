"""Operations on a multi-node deployment (issue 15): refused until they drive every node."""

from __future__ import annotations

from pathlib import Path

import pytest

from rigsmith.errors import RigsmithError
from rigsmith.operating import lifecycle
from tests.support import cluster as fixtures
from tests.support.common import write_project


def test_up_refuses_a_multi_node_deployment_instead_of_starting_one_node(tmp_path: Path) -> None:
    project = write_project(tmp_path, fixtures.ray_data())
    ops = lifecycle.Ops(project, target="podman", out=None, env={}, echo=lambda _m: None)
    with pytest.raises(RigsmithError) as err:
        lifecycle.up(ops, deployment=fixtures.RAY_NAME, yes=True)
    assert "spans 2 nodes" in err.value.message and "stop the head first" in (err.value.hint or "")
