"""quadlet units under a real systemd: `invoke up --target quadlet` / `down` (operating.lifecycle) drive
systemd 257 + podman 5.4.2 in a booted guest (tests/support/systemd_guest.py): the unit rendered for the
guest's own podman is installed in /etc/containers/systemd, turned into a service by podman's generator at
daemon-reload, started, verified with the podman target's post-start check, and stopped by systemd.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from rigsmith.errors import RigsmithError
from rigsmith.operating.lifecycle import lifecycle
from rigsmith.project import Project
from rigsmith.rendering import deploy
from rigsmith.rendering.plan import RunPlan
from rigsmith.rendering.targets.timing import timings
from rigsmith.spec import loads
from tests.support.common import HOST_MEMLOCK, standin_deployment, write_project
from tests.support.podman import parse_recording
from tests.support.systemd_guest import Guest, GuestHost
from tests.support.targets import SEEDS

#: Where the stand-in deployments' host paths live inside the guest.
GUEST_BASE = Path("/srv/rigsmith")
UNIT_DIR = "/etc/containers/systemd"


def _guest_deployment(guest: Guest, tmp_path: Path, seed: str, name: str, **changes: object) -> Project:
    """A stand-in of ``seed`` whose model dir and mounts exist in the guest; its project on the host."""
    data = standin_deployment(GUEST_BASE, seed=seed, name=name, **changes)
    guest.path(str(data["model"]["local_dir"])).mkdir(parents=True, exist_ok=True)  # type: ignore[index]
    for m in data["mounts"]:  # type: ignore[attr-defined]
        p = guest.path(m["host"])
        if m.get("kind", "dir") == "dir":
            p.mkdir(parents=True, exist_ok=True)
        else:
            p.parent.mkdir(parents=True, exist_ok=True)
            with p.open("wb") as f:
                f.truncate(int(m.get("sparse_size") or 0))
    return write_project(tmp_path, data)


def _ops(guest: Guest, project: Project, tmp_path: Path, said: list[str]) -> lifecycle.Ops:
    return lifecycle.Ops(
        project,
        target="quadlet",
        out=tmp_path / "out",
        env=guest.env(),
        echo=said.append,
        host=GuestHost(guest),
        quadlet_dir=guest.path(UNIT_DIR),
    )


@pytest.fixture
def units(systemd_guest: Guest) -> Iterator[list[str]]:
    """Units a test installs: stopped, reset and removed afterwards, so the next test starts clean."""
    names: list[str] = []
    yield names
    for name in names:
        systemd_guest.run("systemctl", "stop", f"{name}.service", check=False)
        systemd_guest.run("systemctl", "reset-failed", f"{name}.service", check=False)
        systemd_guest.path(f"{UNIT_DIR}/{name}.container").unlink(missing_ok=True)
        systemd_guest.run("podman", "rm", "--force", "--time", "0", name, check=False)
    if names:
        systemd_guest.run("systemctl", "daemon-reload")


class HealthKick:
    """Runs the container's health check (``podman healthcheck run``) until it passes.

    podman schedules the first check one HealthInterval (30 s) after start through a systemd timer;
    this runs exactly that command sooner, so a unit with Notify=healthy is released in seconds. The unit
    itself is unchanged: systemctl start still returns only once podman reports the container healthy.
    """

    def __init__(self, guest: Guest, name: str, timeout: float = 240) -> None:
        self.runs: list[tuple[float, int]] = []
        self._stop = threading.Event()
        self._t0 = time.monotonic()

        def loop() -> None:
            deadline = time.monotonic() + timeout
            while not self._stop.is_set() and time.monotonic() < deadline:
                proc = guest.run("podman", "healthcheck", "run", name, check=False)
                self.runs.append((time.monotonic() - self._t0, proc.returncode))
                if proc.returncode == 0:
                    return
                self._stop.wait(0.3)

        self._thread = threading.Thread(target=loop, daemon=True)

    def __enter__(self) -> HealthKick:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(timeout=30)


def _check_recording(guest: Guest, plan: RunPlan, data_json: str) -> None:
    rec = parse_recording(guest.run("podman", "logs", plan.name).stdout)
    spec = loads(data_json)
    assert rec.argv == ["serve", spec.model.container_path, *spec.engine.args[1:]]
    for dev in plan.devices:
        n = dev.split("=", 1)[1]
        assert f"fakegpu{n}" in rec.devices and rec.env[f"FAKE_GPU_{n}"] == "present"
    assert {k: rec.env.get(k) for k, _ in plan.env} == dict(plan.env)
    assert rec.shm_kib * 1024 == plan.shm_bytes


VERSIONS = ("5.4.2", "4.6.0")


@pytest.mark.parametrize("version", VERSIONS, ids=[f"podman-{v}" for v in VERSIONS])
@pytest.mark.parametrize("seed", SEEDS)
def test_up_and_down_run_the_unit_under_systemd_with_what_the_plan_asks(
    systemd_guest: Guest, units: list[str], tmp_path: Path, seed: str, version: str
) -> None:
    guest = systemd_guest
    name = f"sd-{seed.split('-')[2]}-{version.replace('.', '')}"
    units.append(name)
    project = _guest_deployment(guest, tmp_path, seed, name, podman_version=version)
    said: list[str] = []
    ops = _ops(guest, project, tmp_path, said)
    with HealthKick(guest, name):
        plan = lifecycle.up(ops, deployment=name, memlock=HOST_MEMLOCK, yes=True)
    unit = (guest.path(f"{UNIT_DIR}/{name}.container")).read_text()
    # up renders for the podman of the host it runs on (the guest's 5.4.2), whatever the spec's
    # podman_version says (issue 27: `deploy --podman-version` is for another host), and says so
    assert "\nNotify=healthy\n" in unit and "\nPodmanArgs=" not in unit, unit
    assert any(m.startswith("quadlet units for this host's podman 5.4.2 (`podman --version`") for m in said)
    assert any(f"the spec says {version}" in m for m in said) == (version != "5.4.2"), said
    svc = guest.show(f"{name}.service", "ActiveState", "SubState", "SourcePath", "TimeoutStopUSec", "Type")
    t = timings(plan)
    assert svc["ActiveState"] == "active" and svc["SubState"] == "running", svc
    assert svc["SourcePath"] == f"{UNIT_DIR}/{name}.container" and svc["Type"] == "notify"
    assert svc["TimeoutStopUSec"] == _usec(t.systemd_stop)
    assert any(m.startswith(f"verified {name}: running; {len(plan.devices)} CDI device(s)") for m in said), (
        said
    )
    info = json.loads(guest.run("podman", "inspect", name).stdout)[0]
    assert info["Config"]["StopTimeout"] == plan.stop_timeout
    assert info["Config"]["Labels"]["PODMAN_SYSTEMD_UNIT"] == f"{name}.service"
    assert [d["PathInContainer"] for d in info["HostConfig"]["Devices"]] == [
        f"/dev/fakegpu{d.split('=')[1]}" for d in plan.devices
    ]
    data = json.dumps(standin_deployment(GUEST_BASE, seed=seed, name=name, podman_version=version))
    _check_recording(guest, plan, data)
    lifecycle.down(ops, deployment=name)
    # Stopped by SIGTERM, not killed after the timeout: systemd's result and the engine's own log say so
    # (no wall-clock bound, which a loaded machine breaks).
    end = guest.show(f"{name}.service", "ActiveState", "Result", "ExecMainStatus")
    assert end == {"ActiveState": "inactive", "Result": "success", "ExecMainStatus": "0"}, end
    assert "SIGTERM received" in guest.journal(f"{name}.service")
    assert guest.run("podman", "container", "exists", name, check=False).returncode == 1


def _usec(seconds: int) -> str:
    """systemctl show's rendering of a whole number of seconds (``1min 40s``)."""
    m, s = divmod(seconds, 60)
    return " ".join(p for p in (f"{m}min" if m else "", f"{s}s" if s else "") if p)


def _short_grace(
    guest: Guest, units: list[str], tmp_path: Path, name: str, grace: int, **env: str
) -> Project:
    """Seed 003 as unit ``name`` with a short stop grace (vLLM --shutdown-timeout 1 inside) and extra env."""
    units.append(name)
    base = standin_deployment(GUEST_BASE, name=name)
    args = list(base["engine"]["args"])  # type: ignore[index]
    args[args.index("--shutdown-timeout") + 1] = "1"
    extra = [{"name": k, "value": v} for k, v in env.items()]
    return _guest_deployment(
        guest,
        tmp_path,
        SEEDS[1],
        name,
        podman_version="5.4.2",
        engine={"args": args},
        resources={"stop_grace_seconds": grace},
        env=[*base["env"], *extra],  # type: ignore[list-item]
    )


def test_an_engine_ignoring_sigterm_is_killed_after_the_stop_timeout_and_the_unit_fails(
    systemd_guest: Guest, units: list[str], tmp_path: Path
) -> None:
    """The kill comes at the container's stop timeout, well inside TimeoutStopSec; the unit ends failed."""
    guest, name = systemd_guest, "sd-sigkill"
    project = _short_grace(guest, units, tmp_path, name, 3, STANDIN_IGNORE_TERM="1")
    ops = _ops(guest, project, tmp_path, [])
    with HealthKick(guest, name):
        plan = lifecycle.up(ops, deployment=name, memlock=HOST_MEMLOCK, yes=True)
    t = timings(plan)
    assert (t.shutdown, t.container_stop, t.systemd_stop) == (1, 3, 33)
    t0 = time.monotonic()
    guest.run("systemctl", "stop", f"{name}.service", timeout=60)
    took = time.monotonic() - t0
    assert t.container_stop <= took < t.container_stop + 5 < t.systemd_stop, took
    journal = guest.journal(f"{name}.service")
    assert "SIGTERM ignored" in journal
    assert f"failed to stop container {name} in {t.container_stop} seconds, resorting to SIGKILL" in journal
    assert "timed out" not in journal  # systemd never had to step in
    end = guest.show(f"{name}.service", "ActiveState", "Result", "ExecMainStatus")
    # What the unit declares (its header): a kill after the grace is a failure, not a clean exit.
    assert end == {"ActiveState": "failed", "Result": "exit-code", "ExecMainStatus": "137"}, end
    assert "SuccessExitStatus" not in guest.run("systemctl", "cat", f"{name}.service").stdout
    unit = guest.path(f"{UNIT_DIR}/{name}.container").read_text()
    assert f"still running {t.container_stop}s after SIGTERM gets SIGKILL and the unit ends failed" in unit
    assert guest.run("podman", "container", "exists", name, check=False).returncode == 1


def test_notify_healthy_holds_systemctl_start_until_the_health_check_passes(
    systemd_guest: Guest, units: list[str], tmp_path: Path
) -> None:
    delay = 2.0  # /health answers this long after the container starts
    guest, name = systemd_guest, "sd-healthy"
    project = _short_grace(guest, units, tmp_path, name, 3, STANDIN_HEALTH_DELAY=str(int(delay)))
    _plan, files = deploy.artifacts(project, "quadlet", deployment=name, out=tmp_path / "out", memlock="host")
    guest.path(f"{UNIT_DIR}/{name}.container").write_text(files[0].content)
    guest.run("systemctl", "daemon-reload")
    t0 = time.monotonic()
    guest.run("systemctl", "start", "--no-block", f"{name}.service")
    # The container runs while the unit is still activating: systemd waits for podman's READY.
    running_while_activating = False
    while time.monotonic() - t0 < 180 and not running_while_activating:  # bounds for a loaded machine
        svc = guest.show(f"{name}.service", "ActiveState")["ActiveState"]
        ctr = guest.run("podman", "inspect", name, "--format", "{{.State.Running}}", check=False).stdout
        running_while_activating = svc == "activating" and ctr.strip() == "true"
    assert running_while_activating
    state = {}
    with HealthKick(guest, name) as kick:
        while time.monotonic() - t0 < 240:
            state = guest.show(f"{name}.service", "ActiveState")
            if state["ActiveState"] != "activating":
                break
            time.sleep(0.1)
    active_after = time.monotonic() - t0
    assert state == {"ActiveState": "active"}, state
    assert any(rc != 0 for _at, rc in kick.runs), (
        "the health check never failed first: the gate was not tested"
    )
    assert kick.runs[-1][1] == 0 and active_after >= delay
    health = guest.run("podman", "inspect", name, "--format", "{{.State.Health.Status}}").stdout.strip()
    assert health == "healthy"
    guest.run("systemctl", "stop", f"{name}.service")


@pytest.mark.parametrize("version", VERSIONS, ids=[f"podman-{v}" for v in VERSIONS])
def test_an_engine_crashing_at_startup_is_restarted_after_restartsec_not_in_a_tight_loop(
    systemd_guest: Guest, units: list[str], tmp_path: Path, version: str
) -> None:
    """systemd's 100 ms default restarted it 4 times in 4 s and hit the start limit (unit failed for good)."""
    guest, name = systemd_guest, f"sd-crash-{version.replace('.', '')}"
    units.append(name)
    base = standin_deployment(GUEST_BASE, name=name)
    crash = [*base["env"], {"name": "STANDIN_EXIT", "value": "1"}]  # type: ignore[list-item]
    project = _guest_deployment(guest, tmp_path, SEEDS[1], name, podman_version=version, env=crash)
    _plan, files = deploy.artifacts(project, "quadlet", deployment=name, out=tmp_path / "out", memlock="host")
    guest.path(f"{UNIT_DIR}/{name}.container").write_text(files[0].content)
    guest.run("systemctl", "daemon-reload")
    guest.run("systemctl", "start", "--no-block", f"{name}.service")
    # One `systemctl show` per look, so the state, the restart count and the crash time are one snapshot:
    # on a loaded machine a second look may already see the next run.
    when = ("ExecMainExitTimestampMonotonic", "ExecMainStartTimestampMonotonic")
    props = ("ActiveState", "SubState", "Result", "NRestarts", "RestartUSec", "ExecMainStatus", *when)
    t0 = time.monotonic()
    svc = guest.show(f"{name}.service", *props)
    while svc["SubState"] != "auto-restart" and time.monotonic() - t0 < 180:
        time.sleep(0.1)
        svc = guest.show(f"{name}.service", *props)
    assert svc["SubState"] == "auto-restart" and svc["Result"] == "exit-code", svc
    assert svc["ExecMainStatus"] == "1" and svc["RestartUSec"] == "10s"
    # The next start, as an event: systemd's own monotonic clock says how long after the crash it came
    # (with the 100 ms default, 2 to 3 more restarts came within 2 s).
    crashed, restarts = int(svc[when[0]]), int(svc["NRestarts"])
    deadline = time.monotonic() + 120
    again = guest.show(f"{name}.service", "NRestarts", *when)
    # NRestarts counts the restart before the new main process is forked and its start time set: wait for
    # both (a look in between saw the count up and the previous run's start time).
    while (
        int(again["NRestarts"]) == restarts or int(again[when[1]]) <= crashed
    ) and time.monotonic() < deadline:
        time.sleep(0.5)
        again = guest.show(f"{name}.service", "NRestarts", *when)
    assert int(again["NRestarts"]) == restarts + 1, (svc, again)
    assert int(again[when[1]]) - crashed >= 10_000_000, (crashed, again)
    assert "exiting with 1" in guest.journal(f"{name}.service")


def test_an_engine_that_fails_to_start_is_named_and_leaves_no_service_behind(
    systemd_guest: Guest, units: list[str], tmp_path: Path
) -> None:
    """`up --target quadlet` whose engine exits at start: the error carries the engine's own words (its
    journal), not a guess from doctor; the unit file is taken back and the service with it (stopped, its
    failed state reset, not loaded: no restart loop); a following `down` says so and finds nothing."""
    guest, name = systemd_guest, "sd-fails"
    units.append(name)
    base = standin_deployment(GUEST_BASE, name=name)
    crash = [*base["env"], {"name": "STANDIN_EXIT", "value": "3"}]  # type: ignore[list-item]
    project = _guest_deployment(guest, tmp_path, SEEDS[1], name, env=crash)
    said: list[str] = []
    ops = _ops(guest, project, tmp_path, said)
    with pytest.raises(RigsmithError) as err:
        lifecycle.up(ops, deployment=name, memlock=HOST_MEMLOCK, yes=True)
    assert "exiting with 3" in str(err.value), str(err.value)
    assert "nvidia-smi" not in str(err.value)
    assert not guest.path(f"{UNIT_DIR}/{name}.container").exists()
    svc = guest.show(f"{name}.service", "LoadState", "ActiveState", "SubState")
    assert svc["LoadState"] == "not-found" and svc["ActiveState"] == "inactive", svc
    assert guest.run("podman", "container", "exists", name, check=False).returncode == 1
    said.clear()
    lifecycle.down(ops, deployment=name)
    assert said[-1].startswith(f"down {name}: nothing was running"), said


def test_down_stops_a_service_restarting_between_runs_with_no_container(
    systemd_guest: Guest, units: list[str], tmp_path: Path
) -> None:
    """A unit whose engine crashes sits in auto-restart with no container between runs: `down` still
    stops it (it used to say "nothing was running" and leave it restarting)."""
    guest, name = systemd_guest, "sd-loop"
    units.append(name)
    base = standin_deployment(GUEST_BASE, name=name)
    crash = [*base["env"], {"name": "STANDIN_EXIT", "value": "1"}]  # type: ignore[list-item]
    project = _guest_deployment(guest, tmp_path, SEEDS[1], name, env=crash)
    _plan, files = deploy.artifacts(project, "quadlet", deployment=name, out=tmp_path / "out", memlock="host")
    guest.path(f"{UNIT_DIR}/{name}.container").write_text(files[0].content)
    guest.run("systemctl", "daemon-reload")
    guest.run("systemctl", "start", "--no-block", f"{name}.service")
    svc = guest.show(f"{name}.service", "SubState")
    t0 = time.monotonic()
    while svc["SubState"] != "auto-restart" and time.monotonic() - t0 < 180:
        time.sleep(0.1)
        svc = guest.show(f"{name}.service", "SubState")
    assert svc["SubState"] == "auto-restart", svc
    said: list[str] = []
    lifecycle.down(_ops(guest, project, tmp_path, said), deployment=name)
    assert any(m.startswith(f"down {name}: stopped {name}.service (it was ") for m in said), said
    assert not said[-1].startswith(f"down {name}: nothing was running"), said
    end = guest.show(f"{name}.service", "ActiveState", "SubState")
    assert end["ActiveState"] == "inactive", end
