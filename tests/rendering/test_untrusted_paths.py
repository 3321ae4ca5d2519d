"""Mount paths, the image and the entrypoint reach the engine literally in every target, or are refused
naming the target and the field — checked against the real consumers (quadlet's generator, podman)."""

from __future__ import annotations

from pathlib import Path

import pytest

from rigsmith.errors import SpecError
from rigsmith.rendering import deploy
from rigsmith.rendering.targets import LxcOptions
from tests.support.common import standin_deployment, write_project
from tests.support.facts import exec_start, podman_facts, split_systemd
from tests.support.targets import quadlet_service

#: A mount path that, written raw into a unit, would add a root ExecStartPre= (seen with podman 5.4.2).
INJECT = "/srv/a\n[Service]\nExecStartPre=/bin/touch /tmp/rigsmith-pwned-q\n[Container]\nVolume=/srv/b"


def _project(tmp_path: Path, name: str, **changes: object):
    data = standin_deployment(tmp_path, name=name, placeholders={}, **changes)
    if "mounts" in changes:  # the seed's <repo> mount stays after the test's: its env names paths there
        data["mounts"] = [*changes["mounts"], *standin_deployment(tmp_path)["mounts"]]  # type: ignore[misc]
    return write_project(tmp_path, data)


@pytest.mark.parametrize(
    ("changes", "field"),
    [
        ({"mounts": [{"host": INJECT, "container": "/data"}]}, "mounts[0].host"),
        ({"mounts": [{"host": "/srv/a", "container": "/data\\"}]}, "mounts[0].container"),
        ({"engine": {"executable": "vllm\\"}}, "engine.executable"),
        ({"engine": {"executable": " vllm"}}, "engine.executable"),
    ],
    ids=["newline-host", "backslash-container", "backslash-entrypoint", "space-entrypoint"],
)
def test_quadlet_refuses_raw_values_that_would_not_stay_one_literal_line(
    tmp_path: Path, changes: dict[str, object], field: str
) -> None:
    project = _project(tmp_path, "raw-q", **changes)
    with pytest.raises(SpecError) as err:
        deploy.artifacts(project, "quadlet", deployment="raw-q", out=tmp_path / "out", podman_version="5.4.2")
    msg = str(err.value)
    assert field in msg and "quadlet target cannot express" in msg, msg
    deploy.artifacts(project, "podman", deployment="raw-q", out=tmp_path / "out")  # shell-quoted there


def test_quadlet_mount_paths_with_spaces_commas_percent_and_dollar_reach_podman_literally(
    tmp_path: Path, quadlet_bin: Path
) -> None:
    host = "/srv/my models, v2/%h $HOME ${X} %%"
    cont = "/data/x y,%n$P"
    project = _project(tmp_path, "paths-q", mounts=[{"host": host, "container": cont, "readonly": True}])
    _plan, files = deploy.artifacts(
        project, "quadlet", deployment="paths-q", out=tmp_path / "out", podman_version="5.4.2"
    )
    proc = quadlet_service(quadlet_bin, files[0].content, "paths-q", tmp_path)
    got = podman_facts(split_systemd(exec_start(proc.stdout)))
    assert (host, cont, True) in got.mounts


COLON = [
    ({"mounts": [{"host": "/srv/a:b", "container": "/data"}]}, "mounts[0].host"),
    ({"mounts": [{"host": "/srv/a", "container": "/data:x"}]}, "mounts[0].container"),
    ({"model": {"container_path": "/models/m:1"}}, "model.container_path"),
]


@pytest.mark.parametrize("target", ["podman", "quadlet", "compose", "lxc"])
@pytest.mark.parametrize(("changes", "field"), COLON, ids=["host", "container", "model"])
def test_a_colon_in_a_mount_path_is_refused_by_every_volume_syntax_target(
    tmp_path: Path, target: str, changes: dict[str, object], field: str
) -> None:
    data = standin_deployment(tmp_path, name="colon", placeholders={})
    for key, value in changes.items():
        data[key] = {**data[key], **value} if isinstance(data.get(key), dict) else value  # type: ignore[dict-item]
    data["resources"]["host_ram_gib"] = 64  # type: ignore[index]
    project = write_project(tmp_path, data)
    lxc = LxcOptions()
    with pytest.raises(SpecError) as err:
        deploy.artifacts(project, target, deployment="colon", out=tmp_path / "out", lxc=lxc)  # type: ignore[arg-type]
    msg = str(err.value)
    assert field in msg and f"the {target} target cannot express" in msg and "splits on ':'" in msg, msg


@pytest.mark.parametrize("target", ["podman", "quadlet", "lxc"])
def test_an_executable_podman_would_read_as_a_json_argv_is_refused(tmp_path: Path, target: str) -> None:
    data = standin_deployment(tmp_path, name="ep", placeholders={})
    data["engine"] = {**data["engine"], "executable": '["/bin/sh", "-c", "id"]'}  # type: ignore[dict-item]
    data["resources"]["host_ram_gib"] = 64  # type: ignore[index]
    project = write_project(tmp_path, data)
    with pytest.raises(SpecError) as err:
        deploy.artifacts(project, target, deployment="ep", out=tmp_path / "out")  # type: ignore[arg-type]
    msg = str(err.value)
    assert "engine.executable" in msg and f"the {target} target cannot express" in msg and "JSON" in msg, msg
    deploy.artifacts(project, "compose", deployment="ep", out=tmp_path / "out")  # a list there: literal
