"""quadlet: podman's own generator (dry-run) reads every unit rigsmith writes; ExecStart = podman argv."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from rigsmith.errors import SpecError
from rigsmith.project import Project
from rigsmith.rendering import deploy
from rigsmith.rendering.targets import quadlet
from tests.support.common import (
    HOST_MEMLOCK,
    golden_files,
    prepare_host_dirs,
    standin_deployment,
    write_project,
)
from tests.support.facts import exec_start, ini_values, plan_facts, podman_facts, split_systemd
from tests.support.podman import Podman
from tests.support.targets import (
    GOLDEN_HOME,
    SEEDS,
    assert_standin_ran_the_plan,
    hostile_deployment,
    quadlet_service,
    run_quadlet,
)

UNITS = golden_files("*/quadlet*/*.container")


def test_golden_units_exist_for_every_seed() -> None:
    assert {u.parts[-3] for u in UNITS} == set(SEEDS)
    assert len(UNITS) >= 6


@pytest.mark.parametrize("unit", UNITS, ids=[f"{u.parts[-3]}/{u.parts[-2]}" for u in UNITS])
def test_generator_accepts_golden_unit_and_execstart_is_the_podman_argv(
    unit: Path, quadlet_bin: Path, seed_project: Project, tmp_path: Path
) -> None:
    proc = run_quadlet(quadlet_bin, unit, tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert "unsupported key" not in proc.stderr
    service = proc.stdout
    argv = split_systemd(exec_start(service))
    plan, _ = deploy.artifacts(seed_project, "quadlet", deployment=unit.parts[-3], home=GOLDEN_HOME)
    got, want = podman_facts(argv), plan_facts(plan)
    # Everything podman_options() says, as podman will receive it; quadlet only reorders options.
    assert sorted(got.devices) == sorted(want.devices)
    assert got.shm == want.shm and got.memlock == want.memlock and got.stop_timeout == want.stop_timeout
    assert got.env == want.env
    assert sorted(got.mounts) == sorted(want.mounts)
    assert (got.entrypoint, got.image, got.command) == (want.entrypoint, want.image, want.command)
    assert got.init and got.network == want.network
    assert "--health-cmd" in argv
    health = argv[argv.index("--health-cmd") + 1]
    assert json.loads(health)[0] == "python3" and str(plan.port) in health
    start_period = argv[argv.index("--health-start-period") + 1]
    assert start_period == f"{plan.startup_seconds * 2}s"
    # Timeouts nest: shutdown < podman stop timeout < systemd TimeoutStopSec; start covers the start period.
    stop_sec = int(ini_values(service, "Service", "TimeoutStopSec")[0])
    start_sec = int(ini_values(service, "Service", "TimeoutStartSec")[0])
    assert (plan.shutdown_timeout or 0) < got.stop_timeout < stop_sec  # type: ignore[operator]
    assert start_sec > plan.startup_seconds * 2
    assert "nvidia-cdi-refresh.service" in " ".join(ini_values(service, "Unit", "After"))


def test_keys_follow_the_target_podman_version(seed_project: Project, tmp_path: Path) -> None:
    def container_keys(version: str) -> dict[str, list[str]]:
        _plan, files = deploy.artifacts(
            seed_project, "quadlet", deployment=SEEDS[1], out=tmp_path, podman_version=version
        )
        text = files[0].content
        keys: dict[str, list[str]] = {}
        for k in (
            "ShmSize",
            "Ulimit",
            "StopTimeout",
            "Notify",
            "Entrypoint",
            "PodmanArgs",
            "HealthCmd",
            "Pull",
        ):
            keys[k] = ini_values(text, "Container", k)
        return keys

    old = container_keys("4.4.0")
    assert not old["ShmSize"] and not old["Ulimit"] and not old["StopTimeout"] and not old["HealthCmd"]
    assert "--shm-size 8g" in old["PodmanArgs"][0] and "--stop-timeout 70" in old["PodmanArgs"][0]
    assert "--health-cmd" in old["PodmanArgs"][0] and "--pull never" in old["PodmanArgs"][0]
    seed_host = container_keys("4.9.3")
    assert seed_host["ShmSize"] == ["8g"] and seed_host["Ulimit"] == ["memlock=-1:-1"]
    assert not seed_host["StopTimeout"] and not seed_host["Notify"]
    assert seed_host["PodmanArgs"] == ["--entrypoint vllm --stop-timeout 70"]
    new = container_keys("5.0.0")
    assert new["StopTimeout"] == ["70"] and new["Notify"] == ["healthy"] and new["Entrypoint"] == ["vllm"]
    assert not new["PodmanArgs"]
    for k, since in quadlet.KEY_SINCE.items():
        assert since >= quadlet.QUADLET_SINCE, k


def test_cdi_devices_are_never_prefixed_with_dash(seed_project: Project, tmp_path: Path) -> None:
    for seed in SEEDS:
        for v in ("4.4.0", "4.9.3", "5.4.2"):
            _p, files = deploy.artifacts(
                seed_project, "quadlet", deployment=seed, out=tmp_path, podman_version=v
            )
            devices = ini_values(files[0].content, "Container", "AddDevice")
            assert devices and all(not d.startswith("-") for d in devices)


def test_podman_without_quadlet_or_a_bad_version_is_refused_naming_the_field(
    seed_project: Project, tmp_path: Path
) -> None:
    with pytest.raises(SpecError) as err:
        deploy.artifacts(seed_project, "quadlet", deployment=SEEDS[0], out=tmp_path, podman_version="4.3.1")
    assert (
        "podman_version" in str(err.value)
        and "quadlet target" in str(err.value)
        and "4.4.0" in str(err.value)
    )
    with pytest.raises(SpecError) as err:
        deploy.artifacts(seed_project, "quadlet", deployment=SEEDS[0], out=tmp_path, podman_version="latest")
    assert "podman_version" in str(err.value) and "not a podman version" in str(err.value)


def test_generator_rejects_an_unknown_key(quadlet_bin: Path, tmp_path: Path) -> None:
    unit = tmp_path / "bogus.container"
    unit.write_text("[Container]\nImage=localhost/x:1\nBogusKey=1\n")
    proc = run_quadlet(quadlet_bin, unit, tmp_path / "w")
    assert "unsupported key 'BogusKey'" in proc.stderr


HOSTILE = [
    "$(touch /tmp/rigsmith-pwned-q)",
    "`id`",
    "'; id; echo '",
    'a "double" and \\back\\slash',
    "line one\nline two",
    "${HOME} $PATH %h %n %% *.json ~",
    "a;b",
    "tab\tand ünïcødé ✓",
    " lead and trail ",
    # A trailing newline on a word of only "safe" characters once came out bare, so the words after it
    # became new unit lines: this trio gave the container --privileged and the host's / (podman 5.4.2).
    "y\n",
    "PodmanArgs=--privileged\n",
    "Volume=/:/host",
]


def test_hostile_values_survive_quadlet_and_systemd_quoting(quadlet_bin: Path, tmp_path: Path) -> None:
    project = write_project(tmp_path, hostile_deployment(tmp_path, "hostile-q", HOSTILE))
    plan, files = deploy.artifacts(
        project, "quadlet", deployment="hostile-q", out=tmp_path / "out", podman_version="5.4.2"
    )
    proc = quadlet_service(quadlet_bin, files[0].content, "hostile-q", tmp_path)
    got = podman_facts(split_systemd(exec_start(proc.stdout)))
    assert got.command == list(plan.command)
    assert got.env == dict(plan.env)


@pytest.mark.parametrize(("word", "why"), [("", "drops an empty argument"), (";", "command separator")])
def test_words_quadlet_cannot_carry_are_refused_naming_the_arg(tmp_path: Path, word: str, why: str) -> None:
    data = standin_deployment(
        tmp_path,
        name="refuse-q",
        placeholders={},
        engine={"args": ["/models/x", "--flag", word], "model_arg": 0},
    )
    project = write_project(tmp_path, data)
    with pytest.raises(SpecError) as err:
        deploy.artifacts(project, "quadlet", deployment="refuse-q", out=tmp_path / "out")
    msg = str(err.value)
    assert "engine.args[2]" in msg and "quadlet target cannot express" in msg and why in msg
    deploy.artifacts(project, "podman", deployment="refuse-q", out=tmp_path / "out")  # the podman target can


def test_generated_execstart_really_starts_the_standin(
    quadlet_bin: Path, tmp_path: Path, podman: Podman, fake_cdi: Path, standin_image: str
) -> None:
    """Run the ExecStart quadlet generated (minus the options that need a systemd unit around it)."""
    data = standin_deployment(tmp_path, name="standin-quadlet")
    prepare_host_dirs(data)
    project = write_project(tmp_path, data)
    plan, files = deploy.artifacts(
        project, "quadlet", deployment="standin-quadlet", out=tmp_path / "out", memlock=HOST_MEMLOCK
    )
    proc = quadlet_service(quadlet_bin, files[0].content, "standin-quadlet", tmp_path)
    argv = split_systemd(exec_start(proc.stdout))
    systemd_only = ("--cidfile=", "--cgroups=", "--sdnotify=")
    argv = [a for a in argv[1:] if not a.startswith(systemd_only)]
    try:
        run = subprocess.run(
            ["podman", *argv], env=podman.env, capture_output=True, text=True, timeout=120, check=False
        )
        assert run.returncode == 0, run.stderr
        log = podman.logs_until("standin-quadlet", "Application startup complete")
        assert_standin_ran_the_plan(log, data, plan)
        info = podman.inspect("standin-quadlet")
        assert info["Config"]["StopTimeout"] == plan.stop_timeout  # type: ignore[index]
    finally:
        podman.run("rm", "--force", "--time", "0", "standin-quadlet", check=False)


def test_a_podman_version_with_a_line_break_still_makes_a_unit_quadlet_reads(
    quadlet_bin: Path, tmp_path: Path
) -> None:
    data = standin_deployment(tmp_path, name="pv-q", placeholders={}, podman_version="5.4.2\n")
    project = write_project(tmp_path, data)
    _plan, files = deploy.artifacts(project, "quadlet", deployment="pv-q", out=tmp_path / "out")
    unit = tmp_path / "pv-q.container"
    unit.write_text(files[0].content)
    proc = run_quadlet(quadlet_bin, unit, tmp_path / "w")
    assert proc.returncode == 0, proc.stderr
    assert "# For podman 5.4.2 (spec podman_version" in files[0].content
