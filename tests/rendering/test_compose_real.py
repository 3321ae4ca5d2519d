"""compose: podman-compose 1.0.6 and 1.6.0 start the rendered file on real podman with fake CDI GPUs.

The container must get every device; the `deploy.resources.reservations.devices` (driver: cdi) form — which
both versions drop silently — and a missing stop timeout must be caught by the post-start check.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml

from rigsmith.errors import PreflightError
from rigsmith.operating import probes
from rigsmith.operating.host import LocalHost
from rigsmith.operating.lifecycle import verify
from rigsmith.operating.probes import CmdResult
from rigsmith.rendering import deploy
from rigsmith.rendering.plan import RunPlan
from tests.support.common import HOST_MEMLOCK, prepare_host_dirs, standin_deployment, write_project
from tests.support.podman import FAKE_CDI_SPEC, Podman, parse_recording
from tests.support.targets import HOSTILE, assert_standin_ran_the_plan, compose_up

VERSIONS = ("1.0.6", "1.6.0")


def _render(tmp_path: Path, name: str) -> tuple[dict[str, Any], RunPlan, Path]:
    data = standin_deployment(tmp_path, name=name)
    # Recipe text with shell and compose metacharacters must reach the engine literally.
    data["engine"]["args"] = [*data["engine"]["args"], "--literal", *HOSTILE]
    data["env"] = [*data["env"], *({"name": f"HOSTILE_{i}", "value": v} for i, v in enumerate(HOSTILE))]
    prepare_host_dirs(data)
    project = write_project(tmp_path, data)
    out = tmp_path / "out"
    deploy.deploy(project, "compose", deployment=name, out=out, memlock=HOST_MEMLOCK, echo=lambda _m: None)
    plan, _ = deploy.artifacts(project, "compose", deployment=name, out=out, memlock=HOST_MEMLOCK)
    return data, plan, out / "compose" / name / "compose.yaml"


def _cleanup(podman: Podman, name: str) -> None:
    podman.run("rm", "--force", "--time", "0", name, check=False)
    podman.run("pod", "rm", "--force", f"pod_{name}", check=False)


def _running(podman: Podman, name: str, timeout: float = 15) -> dict[str, Any]:
    """Inspect once the container reports Running (podman may briefly show "created" after `run -d`)."""
    deadline = time.monotonic() + timeout
    info = podman.inspect(name)
    while not info["State"]["Running"] and time.monotonic() < deadline:  # type: ignore[index]
        time.sleep(0.3)
        info = podman.inspect(name)
    return info


def _cdi() -> verify.CdiEdits:
    return verify.cdi_from_specs([probes.parse_cdi("fake.json", json.dumps(FAKE_CDI_SPEC))])


@pytest.fixture(params=VERSIONS)
def version(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@dataclass(frozen=True)
class Rig:
    """Real podman with the fake CDI vendor and the stand-in image, and one compose front-end."""

    podman: Podman
    bins: list[str]
    version: str

    def name(self, what: str) -> str:
        return f"standin-{what}-{self.version.replace('.', '')}"


@pytest.fixture
def rig(
    podman: Podman, fake_cdi: Path, standin_image: str, compose_bins: dict[str, list[str]], version: str
) -> Rig:
    return Rig(podman, compose_bins[version], version)


@pytest.fixture
def started(tmp_path: Path, rig: Rig) -> Iterator[tuple[dict[str, Any], RunPlan, Path]]:
    podman, name = rig.podman, rig.name("compose")
    data, plan, compose_file = _render(tmp_path, name)
    up = [f"--podman-run-args=--stop-timeout={plan.stop_timeout}"]
    try:
        proc = compose_up(rig.bins, compose_file, podman, up)
        assert proc.returncode == 0, proc.stdout + proc.stderr
        yield data, plan, compose_file
    finally:
        _cleanup(podman, name)


def test_container_gets_every_cdi_device_env_argv_shm_and_stop_timeout(started, podman: Podman) -> None:
    data, plan, _file = started
    assert_standin_ran_the_plan(podman.logs_until(plan.name, "Application startup complete"), data, plan)
    info = _running(podman, plan.name)
    assert verify.container_problems(info, plan, _cdi()) == []
    assert info["Config"]["StopTimeout"] == plan.stop_timeout  # type: ignore[index]


def test_deploy_resources_cdi_form_is_caught_by_the_post_start_check(tmp_path: Path, rig: Rig) -> None:
    podman, name = rig.podman, rig.name("dropped")
    _data, plan, compose_file = _render(tmp_path, name)
    doc = yaml.safe_load(compose_file.read_text())
    svc = doc["services"][name]
    devices = svc.pop("devices")
    svc["deploy"] = {"resources": {"reservations": {"devices": [{"driver": "cdi", "device_ids": devices}]}}}
    compose_file.write_text(yaml.safe_dump(doc, sort_keys=False))
    try:
        proc = compose_up(rig.bins, compose_file, podman, ["--podman-run-args=--stop-timeout=70"])
        assert proc.returncode == 0, proc.stderr  # the front-end says nothing …
        rec = parse_recording(podman.logs_until(name, "Application startup complete"))
        assert not any(d.startswith("fakegpu") for d in rec.devices)  # … and the GPUs are really missing
        problems = verify.container_problems(_running(podman, name), plan, _cdi())
        assert len(problems) == 1 and "NO devices reached" in problems[0] and "driver: cdi" in problems[0]

        class TestPodman(LocalHost):
            def run(self, argv: Sequence[str]) -> CmdResult:
                return super().run(podman.argv(*argv[1:]))

        with pytest.raises(PreflightError, match="NO devices"):
            verify.check_container(plan, host=TestPodman(podman.env))  # reads the fake spec from /etc/cdi
    finally:
        _cleanup(podman, name)


def test_without_the_run_args_compensation_the_stop_timeout_is_caught(tmp_path: Path, rig: Rig) -> None:
    podman, name = rig.podman, rig.name("grace")
    _data, plan, compose_file = _render(tmp_path, name)
    try:
        proc = compose_up(rig.bins, compose_file, podman, [])
        assert proc.returncode == 0, proc.stderr
        podman.logs_until(name, "Application startup complete")
        info = _running(podman, name)
        assert info["Config"]["StopTimeout"] == 10  # type: ignore[index]  # stop_grace_period was ignored
        problems = verify.container_problems(info, plan, _cdi())
        assert problems == [p for p in problems if "stop timeout is 10s, not 70s" in p] and problems
    finally:
        _cleanup(podman, name)
