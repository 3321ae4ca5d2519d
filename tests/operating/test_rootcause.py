"""Root cause first (issue 27): up / wait / logs / down lead with doctor's first failing row, and claim
only what they checked. Real podman, real generated scripts, this machine's real (driverless) host."""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import pytest

from rigsmith.errors import RigsmithError
from rigsmith.operating.lifecycle import lifecycle, wait
from rigsmith.operating.lifecycle.lifecycle import Ops
from tests.support.common import HOST_MEMLOCK, invoke_cli, write_project
from tests.support.ops import memlock_fixed, ops_data
from tests.support.podman import Podman

driverless = pytest.mark.skipif(
    shutil.which("nvidia-smi") is not None, reason="needs a host without the NVIDIA driver"
)


def _nvidia(tmp_path: Path, name: str) -> dict[str, Any]:
    data = ops_data(tmp_path, name)
    data["resources"]["gpus"].update(count=1, cdi_devices=["nvidia.com/gpu=all"])
    return data


@driverless
def test_up_without_a_driver_leads_with_the_driver_not_the_cdi_spec(tmp_path: Path, podman: Podman) -> None:
    ops = Ops(write_project(tmp_path, _nvidia(tmp_path, "nodrv")), out=tmp_path / "out", env=podman.env)
    with pytest.raises(RigsmithError) as err:
        lifecycle.up(ops, memlock=HOST_MEMLOCK)
    msg = str(err.value)
    assert msg.startswith("nodrv: GPUs: no driver"), msg
    symptom = "no CDI spec provides nvidia.com/gpu=all"
    assert msg.index("no driver") < msg.index(symptom), "the cause, then the symptom"
    assert "invoke doctor --deployment nodrv --target podman" in (err.value.hint or "")
    assert podman.run("container", "exists", "nodrv", check=False).returncode == 1


@driverless
@pytest.mark.parametrize("argv", [("wait", "--timeout", "600"), ("logs",)], ids=["wait", "logs"])
def test_wait_and_logs_on_a_deployment_that_never_started_say_it_is_not_running(
    tmp_path: Path, podman: Podman, argv: tuple[str, ...]
) -> None:
    project = write_project(tmp_path, _nvidia(tmp_path, "never"))
    out = invoke_cli(project.root, *argv, env=podman.env)
    assert out.returncode == 1, out.stdout
    err = out.stderr
    assert "never is not running (there is no container of that name)" in err, err
    assert "--timeout" not in err and "exited 125" not in err and "Error: " not in err
    assert "`invoke up --deployment never` starts it" in err
    assert "doctor expects the start to fail on GPUs: no driver" in err
    assert "Traceback" not in err


def test_down_with_nothing_running_claims_nothing_it_did_not_check(tmp_path: Path, podman: Podman) -> None:
    lines: list[str] = []
    ops = Ops(write_project(tmp_path, ops_data(tmp_path, "idle")), env=podman.env, echo=lines.append)
    lifecycle.down(ops)
    text = "\n".join(lines)
    assert lines[-1].startswith("down idle: nothing was running")
    if shutil.which("nvidia-smi") is None:
        assert "no process of this deployment is left" not in text, text
        assert "the GPUs were not checked" in lines[-1]


def test_a_log_that_ends_is_not_helped_by_a_longer_timeout(tmp_path: Path) -> None:
    follower = wait.LogFollower(argv=["sh", "-c", "echo 'INFO starting'; echo 'boom'; exit 3"])
    gates = wait.Gates(log_lines=("Application startup complete.",))
    with pytest.raises(RigsmithError) as err:
        wait.wait(gates, follower, lambda: False, timeout=3600, echo=lambda _l: None, poll=0.05)
    assert "the log ended" in err.value.message and "boom" in err.value.message
    assert err.value.hint is not None and "--timeout" not in err.value.hint
    assert "more time will not help" in err.value.hint


@pytest.mark.skipif(not memlock_fixed(), reason="needs a host whose memlock limit cannot be raised")
def test_a_start_podman_refuses_shows_its_words_leaves_nothing_and_its_hint_keeps_working(
    tmp_path: Path, podman: Podman, fake_cdi: Path, ops_image: str
) -> None:
    """The OCI runtime refuses `--ulimit memlock=-1:-1` (exit 126): up shows podman's own words under
    doctor's memlock row, removes the container podman created, and names the command that works; that
    command keeps `--memlock host` in the spec, so next, deploy --check and a later up agree with it."""
    data = ops_data(tmp_path, "pinned")
    data["model"]["repo"] = None  # a local checkpoint: nothing to pin or fetch
    data["model"].pop("revision", None)
    data["model"].pop("config_patches", None)
    project = write_project(tmp_path, data)
    (Path(str(data["model"]["local_dir"])) / "config.json").write_text("{}")
    env = {**podman.env, "COLUMNS": "300"}
    try:
        up = invoke_cli(project.root, "up", env=env)
        assert up.returncode == 1 and "Traceback" not in up.stderr
        assert "memlock: spec wants unlimited" in up.stderr
        assert "error setting rlimit" in up.stderr  # podman's (runc's) own words, through errors.shown
        assert "undone: removed the created container pinned" in up.stdout
        assert podman.run("container", "exists", "pinned", check=False).returncode == 1
        hint = "invoke up --memlock host --yes --deployment pinned"
        assert f"`{hint}`" in up.stderr
        again = invoke_cli(project.root, *hint.split()[1:], env=env)
        assert again.returncode == 0, again.stderr + again.stdout
        assert "resources.memlock: host (--memlock) written into deployments/pinned.yaml" in again.stdout
        assert "verified pinned: running" in again.stdout
        nxt = invoke_cli(project.root, "next", env=env)
        assert "done  deployed" in nxt.stdout and "done  up" in nxt.stdout, nxt.stdout
        check = invoke_cli(project.root, "deploy", "--check", "--target", "podman", env=env)
        assert check.returncode == 0, check.stderr
        steady = invoke_cli(project.root, "up", env=env)  # bare: the spec says host now
        assert steady.returncode == 0 and "already running, up to date" in steady.stdout, steady.stderr
    finally:
        podman.run("rm", "--force", "--time", "0", "pinned", check=False)
