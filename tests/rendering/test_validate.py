"""The one validation pass: spec, plan and target problems reported together, each by field path."""

from __future__ import annotations

from pathlib import Path

import pytest

from rigsmith.errors import SpecError
from rigsmith.rendering import deploy, targets
from tests.support.common import standin_deployment, write_project


def test_one_error_names_spec_plan_and_target_problems_at_once(tmp_path: Path) -> None:
    data = standin_deployment(
        tmp_path,
        name="broken",
        placeholders={},
        # spec level: a relative host path; plan level: an image reference that is none; target level:
        # a byte memlock, which Kubernetes cannot set per pod.
        mounts=[{"host": "./cache", "container": "/workspace"}],
        engine={"image": "BAD REF"},
        resources={"memlock": 1024},
    )
    project = write_project(tmp_path, data)
    with pytest.raises(SpecError) as err:
        deploy.artifacts(project, "kube", out=tmp_path / "out")
    fields = [f for f, _ in err.value.problems]
    assert fields == ["mounts[0].host", "engine.image", "resources.memlock"]
    text = str(err.value)
    assert text.startswith("deployments/broken.yaml: 3 problem(s) in the deployment spec")
    assert "the kube target cannot express this" in text


def test_every_target_lists_its_checks_as_data() -> None:
    assert sorted(targets.checks()) == sorted(targets.renderers())
    assert all(targets.checks().values())


def test_a_venv_spec_and_a_bad_podman_version_are_one_quadlet_error(tmp_path: Path) -> None:
    data = standin_deployment(
        tmp_path,
        name="venvq",
        placeholders={},
        engine={"runtime": "venv", "venv": "relative/venv", "image": None},
        podman_version="4.3.1",
    )
    project = write_project(tmp_path, data)
    with pytest.raises(SpecError) as err:
        deploy.artifacts(project, "quadlet", out=tmp_path / "out")
    fields = [f for f, _ in err.value.problems]
    assert fields == ["engine.venv", "engine.runtime", "podman_version"]
