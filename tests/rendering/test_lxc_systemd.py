"""The LXC target's venv path under a real systemd: provision.sh (``deploy --target lxc`` of seed 003 with
``engine.runtime: venv``) runs as root inside the booted guest (tests/support/systemd_guest.py) against a
fake venv, installs and enables the service for real, and systemd starts and stops it."""

from __future__ import annotations

import os
import stat
import time
from pathlib import Path

import pytest

from rigsmith.rendering import deploy
from rigsmith.rendering.targets.lxcservice import venv_workdir
from rigsmith.rendering.targets.timing import timings
from tests.support.common import HOST_MEMLOCK, standin_deployment, write_project
from tests.support.facts import split_systemd
from tests.support.podman import RECORDER, parse_recording
from tests.support.systemd_guest import Guest, recorder_ending
from tests.support.targets import CT_VENV

GUEST_BASE = Path("/srv/rigsmith")
#: Where the fake CT's GPU facts live in the guest (provision.sh's RIGSMITH_* overrides).
CT = "/srv/fake-ct"
DRIVER = "550.54.14"
#: The venv's vllm: the recorder, then its working directory, then vLLM's shutdown: on SIGTERM it drains
#: for its --shutdown-timeout before exiting 0.
VENV_VLLM = recorder_ending(
    RECORDER,
    """\
echo "CWD $(pwd)"
[ -f "$TREE/README" ] && echo "TREE $TREE resolves"
shutdown=0; prev=
for a in "$@"; do [ "$prev" = --shutdown-timeout ] && shutdown=$a; prev=$a; done
trap 'echo "SIGTERM received, draining ${shutdown}s"; sleep "$shutdown"; echo drained; exit 0' TERM
""",
)


@pytest.mark.parametrize(
    ("venv", "exe", "workdir"),
    [
        (CT_VENV, "./venv-v2.5/bin/vllm", "/opt/vllm-merlin"),
        ("/opt/x/envs/v2", "envs/v2/bin/vllm", "/opt/x"),
        ("/opt/x/venv", "vllm", "/opt/x"),
        ("/opt/x/other", "./venv/bin/vllm", "/opt/x"),
        ("/venv", "./venv/bin/vllm", "/"),
    ],
)
def test_the_venv_unit_runs_where_the_recipes_relative_paths_resolve(
    venv: str, exe: str, workdir: str
) -> None:
    assert venv_workdir(venv, exe) == workdir


def _fake_ct(guest: Guest) -> dict[str, str]:
    """GPU nodes, the host module's version and the CT's NVIDIA lib, as provision.sh checks them."""
    dev = guest.path(f"{CT}/dev")
    dev.mkdir(parents=True, exist_ok=True)
    for node in ("nvidia0", "nvidia1", "nvidia2", "nvidia3", "nvidiactl", "nvidia-uvm"):
        if not (dev / node).exists():
            os.mknod(dev / node, 0o666 | stat.S_IFCHR, os.makedev(1, 3))
    guest.path(f"{CT}/version").write_text(
        f"NVRM version: NVIDIA UNIX x86_64 Kernel Module  {DRIVER}  Thu Feb 22 01:44:30 UTC 2024\n"
    )
    guest.path(f"{CT}/lib").mkdir(exist_ok=True)
    guest.path(f"{CT}/lib/libnvidia-ml.so.{DRIVER}").touch()
    return {
        "RIGSMITH_DEV": f"{CT}/dev",
        "RIGSMITH_NVIDIA_VERSION": f"{CT}/version",
        "RIGSMITH_LIB_DIRS": f"{CT}/lib",
    }


def test_provision_installs_enables_and_systemd_runs_the_venv_service(
    systemd_guest: Guest, tmp_path: Path
) -> None:
    guest = systemd_guest
    name = "sd-venv"
    base = standin_deployment(GUEST_BASE, name=name)
    args = list(base["engine"]["args"])  # type: ignore[index]
    args[args.index("--shutdown-timeout") + 1] = "1"
    data = standin_deployment(
        GUEST_BASE,
        name=name,
        engine={"runtime": "venv", "venv": CT_VENV, "image": None, "args": args},
        resources={"stop_grace_seconds": 3},
        env=[
            *base["env"],  # type: ignore[list-item]
            {"name": "HF_TOKEN", "value": "", "secret": True},
        ],
    )
    data["resources"]["gpus"]["cdi_devices"] = [f"nvidia.com/gpu={i}" for i in range(4)]  # type: ignore[index]
    project = write_project(tmp_path, data)
    plan, _ = deploy.artifacts(project, "lxc", deployment=name, out=tmp_path / "out", memlock=HOST_MEMLOCK)
    deploy.deploy(
        project, "lxc", deployment=name, out=tmp_path / "out", memlock=HOST_MEMLOCK, echo=lambda _m: None
    )
    t = timings(plan)
    assert t.shutdown == 1 < t.container_stop == 3 < t.systemd_stop == 33 < t.pve_down == 63
    # The CT: the venv (its vllm), the recipe's tree beside it, the model dir and the mounts.
    exe = guest.path(f"{CT_VENV}/bin/vllm")
    exe.parent.mkdir(parents=True, exist_ok=True)
    exe.write_text(VENV_VLLM)
    exe.chmod(0o755)
    workdir = venv_workdir(CT_VENV, "./venv-v2.5/bin/vllm")
    guest.path(f"{workdir}/vllm-v2.5").mkdir(parents=True, exist_ok=True)
    guest.path(f"{workdir}/vllm-v2.5/README").write_text("the recipe's vLLM tree\n")
    for m in plan.mounts:
        guest.path(m.host).mkdir(parents=True, exist_ok=True)
    script = guest.path("/root/provision.sh")
    script.write_text((tmp_path / "out/lxc" / name / "provision.sh").read_text())
    env = [f"{k}={v}" for k, v in _fake_ct(guest).items()]
    try:
        proc = guest.run("env", *env, "HF_TOKEN=hf_guest_secret", "bash", "/root/provision.sh", check=False)
        assert proc.returncode == 0, proc.stderr + proc.stdout
        assert guest.run("systemctl", "is-enabled", f"{name}.service").stdout.strip() == "enabled"
        svc = guest.show(
            f"{name}.service",
            "ActiveState",
            "SubState",
            "FragmentPath",
            "WorkingDirectory",
            "TimeoutStopUSec",
            "EnvironmentFiles",
            "KillSignal",
            "KillMode",
        )
        assert (svc["ActiveState"], svc["SubState"]) == ("active", "running"), svc
        assert svc["FragmentPath"] == f"/etc/systemd/system/{name}.service"
        assert svc["WorkingDirectory"] == workdir == "/opt/vllm-merlin"
        assert svc["TimeoutStopUSec"] == "33s" and svc["KillSignal"] == "15" and svc["KillMode"] == "mixed"
        assert svc["EnvironmentFiles"].startswith(f"/etc/rigsmith/{name}.env ")
        secret = guest.path(f"/etc/rigsmith/{name}.env")
        assert stat.S_IMODE(secret.stat().st_mode) == 0o600 and secret.stat().st_uid == 0
        assert secret.read_text() == "HF_TOKEN='hf_guest_secret'\n"
        assert "hf_guest_secret" not in guest.path(f"/etc/systemd/system/{name}.service").read_text()
        # the venv's vllm says where it runs after its readiness line: wait for that last line
        logs = _journal_until(guest, name, "TREE ./vllm-v2.5 resolves")
        rec = parse_recording(logs)
        unit = guest.run("systemctl", "cat", f"{name}.service").stdout
        exec_start = next(ln for ln in unit.splitlines() if ln.startswith("ExecStart="))
        assert split_systemd(exec_start.split("=", 1)[1]) == [f"{CT_VENV}/bin/vllm", *plan.command]
        assert rec.argv == list(plan.command)
        assert {k: rec.env.get(k) for k, _ in plan.env} == dict(plan.env)
        assert rec.env["HF_TOKEN"] == "hf_guest_secret"  # from the 0600 EnvironmentFile
        assert f"CWD {workdir}" in logs and "TREE ./vllm-v2.5 resolves" in logs
        t0 = time.monotonic()
        guest.run("systemctl", "stop", f"{name}.service", timeout=60)
        took = time.monotonic() - t0
        end = guest.show(f"{name}.service", "ActiveState", "Result", "ExecMainStatus")
        assert end == {"ActiveState": "inactive", "Result": "success", "ExecMainStatus": "0"}, end
        # vLLM drained for its --shutdown-timeout (its child undisturbed: only the main process got
        # SIGTERM); systemd waited, well inside TimeoutStopSec.
        assert t.shutdown <= took < t.systemd_stop, took
        assert "SIGTERM received, draining 1s" in (out := _journal(guest, name)) and "drained" in out
    finally:
        guest.run("systemctl", "disable", "--now", f"{name}.service", check=False)
        guest.run("systemctl", "reset-failed", f"{name}.service", check=False)


def _journal(guest: Guest, name: str) -> str:
    """What the service's vllm wrote (its stdout; systemd's own lines about the unit left out)."""
    argv = [
        "journalctl",
        "--unit",
        f"{name}.service",
        "--identifier",
        "vllm",
        "--no-pager",
        "--output",
        "cat",
    ]
    return guest.run(*argv).stdout


def _journal_until(guest: Guest, name: str, marker: str, timeout: float = 20) -> str:
    deadline = time.monotonic() + timeout
    out = ""
    while time.monotonic() < deadline:
        out = _journal(guest, name)
        if marker in out:
            return out
        time.sleep(0.1)
    raise AssertionError(f"{marker!r} not in the journal of {name} after {timeout}s:\n{out}")
