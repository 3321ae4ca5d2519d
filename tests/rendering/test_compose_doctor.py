"""doctor --target compose asks the real podman-compose (1.0.6 and 1.6.0) for a dry run of the rendered
file and says whether the CDI devices reach podman (seeds/000 pitfall 1), instead of guessing."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import yaml

from rigsmith.operating.checkrow import Check
from rigsmith.operating.doctor import doctor
from rigsmith.operating.host import LocalHost
from rigsmith.project import Project
from rigsmith.rendering import deploy
from tests.support.common import HOST_MEMLOCK, prepare_host_dirs, standin_deployment, write_project
from tests.support.podman import Podman


def _row(project_root: Path, name: str, env: dict[str, str]) -> Check:
    _n, checks = doctor.diagnose(Project(project_root), name, target="compose", host=LocalHost(env))
    return next(c for c in checks if c.name == "podman-compose")


@pytest.mark.parametrize("version", ["1.0.6", "1.6.0"])
def test_compose_row_dry_runs_the_rendered_file_and_catches_dropped_devices(
    tmp_path: Path, podman: Podman, compose_bins: dict[str, list[str]], version: str
) -> None:
    bindir = tmp_path / "bin"
    bindir.mkdir()
    (bindir / "podman-compose").symlink_to(compose_bins[version][0])
    env = {**podman.env, "PATH": f"{bindir}{os.pathsep}{podman.env.get('PATH', os.environ['PATH'])}"}
    data = standin_deployment(tmp_path, name="cdoc")
    prepare_host_dirs(data)
    project = write_project(tmp_path, data)

    row = _row(project.root, "cdoc", env)
    assert (
        row.verdict == "warn"
        and "not rendered yet" in row.detail
        and f"podman-compose {version}" in row.detail
    )
    assert row.hint is not None and "invoke deploy --target compose --deployment cdoc" in row.hint

    deploy.deploy(project, "compose", deployment="cdoc", memlock=HOST_MEMLOCK, echo=lambda _m: None)
    want = data["resources"]["gpus"]["cdi_devices"]  # type: ignore[index]
    row = _row(project.root, "cdoc", env)
    assert row.verdict == "go", row
    assert f"podman-compose {version}; its dry run passes all {len(want)} CDI device(s)" == row.detail

    # the form both versions drop without a word: doctor must say so before anything starts
    f = project.root / "compose" / "cdoc" / "compose.yaml"
    doc = yaml.safe_load(f.read_text())
    svc = next(iter(doc["services"].values()))
    devices = svc.pop("devices")
    svc.setdefault("deploy", {})["resources"] = {
        "reservations": {"devices": [{"driver": "cdi", "device_ids": devices}]}
    }
    f.write_text(yaml.safe_dump(doc))
    row = _row(project.root, "cdoc", env)
    assert row.verdict == "no-go" and "drops CDI device(s)" in row.detail and want[0] in row.detail
    assert podman.run("container", "exists", "cdoc", check=False).returncode == 1, "a dry run started it"


def test_compose_row_without_podman_compose_is_no_go(tmp_path: Path, podman: Podman) -> None:
    data = standin_deployment(tmp_path, name="nocomp")
    prepare_host_dirs(data)
    project = write_project(tmp_path, data)
    env = {**podman.env, "PATH": "/nonexistent"}
    row = _row(project.root, "nocomp", env)
    assert row.verdict == "no-go" and "podman-compose not found" in row.detail
