"""Pure parts of ops: quadlet/podman command builders, inspect comparison, orphan classification, gates."""

from __future__ import annotations

from pathlib import Path

import pytest

from rigsmith.errors import RigsmithError
from rigsmith.operating import probes
from rigsmith.operating.lifecycle import gpuholders, lifecycle, wait
from rigsmith.operating.lifecycle.lifecycle import Controller
from rigsmith.project import Project
from rigsmith.rendering.plan import make
from rigsmith.resolving.lock.lock import Lock
from tests.support.common import REPO


def test_quadlet_controller_argv() -> None:
    q = Controller("quadlet", "flash-next-merlin-4x3090", Path("/x/quadlet"))
    assert q.start() == [
        ["systemctl", "daemon-reload"],
        ["systemctl", "start", "flash-next-merlin-4x3090.service"],
    ]
    assert q.stop(70) == [["systemctl", "stop", "flash-next-merlin-4x3090.service"]]
    assert q.state() == [
        "systemctl",
        "show",
        "flash-next-merlin-4x3090.service",
        "--property=ActiveState,SubState,MainPID",
    ]
    assert q.logs(follow=True, tail=100) == [
        "journalctl",
        "--unit",
        "flash-next-merlin-4x3090.service",
        "--no-pager",
        "--output",
        "cat",
        "--lines",
        "100",
        "--follow",
    ]
    assert lifecycle.parse_systemctl_show("ActiveState=active\nSubState=running\nMainPID=4242\n") == {
        "ActiveState": "active",
        "SubState": "running",
        "MainPID": "4242",
    }


def test_quadlet_up_installs_the_rendered_units_where_systemd_reads_them(tmp_path: Path) -> None:
    from rigsmith.writer import Artifact

    files = [
        Artifact(tmp_path / "quadlet" / "x.container", "[Container]\n"),
        Artifact(tmp_path / "quadlet" / "other.container", "[Container]\n"),
    ]
    inst = lifecycle.quadlet_installs(files, "x", Path("/etc/containers/systemd"))
    assert inst == [Artifact(Path("/etc/containers/systemd/x.container"), "[Container]\n", 0o644)]


def test_podman_controller_argv_falls_back_without_stop_script(tmp_path: Path) -> None:
    p = Controller("podman", "x", tmp_path)
    assert p.start() == [["bash", str(tmp_path / "run.sh")]]
    assert p.stop(70) == [["podman", "stop", "--time", "70", "x"], ["podman", "rm", "--force", "x"]]
    (tmp_path / "stop.sh").write_text("#!/bin/sh\n")
    assert p.stop(70) == [["bash", str(tmp_path / "stop.sh")]]
    assert p.logs() == ["podman", "logs", "x"] and p.logs(True, 5) == [
        "podman",
        "logs",
        "--tail",
        "5",
        "--follow",
        "x",
    ]
    assert p.state() is None


def test_ops_refuse_targets_they_cannot_drive() -> None:
    with pytest.raises(RigsmithError, match="not 'compose'"):
        lifecycle.Ops(Project(REPO), target="compose")


def _plan():  # seed 003 planned with an explicit image
    spec = Project(REPO).load("flash-next-merlin-4x3090")
    return make(spec, Lock(), spec_path="deployments/flash-next-merlin-4x3090.yaml")


def _info(plan, devices, env=None, running=True, label=None):  # type: ignore[no-untyped-def]
    return {
        "State": {
            "Running": running,
            "Status": "running" if running else "exited",
            "ExitCode": 0 if running else 1,
        },
        "Config": {
            "Env": env if env is not None else [f"{k}={v}" for k, v in plan.env],
            "Labels": {lifecycle.SPEC_LABEL: label or dict(plan.labels)[lifecycle.SPEC_LABEL]},
            "StopTimeout": plan.stop_timeout,
        },
        "HostConfig": {"Devices": [{"PathInContainer": d} for d in devices], "ShmSize": plan.shm_bytes},
    }


CDI = {
    f"nvidia.com/gpu={i}": ((f"/dev/nvidia{i}", "/dev/nvidiactl"), ("NVIDIA_VISIBLE_DEVICES=void",))
    for i in range(4)
}


def test_container_problems_pass_when_everything_arrived() -> None:
    plan = _plan()
    devs = [f"/dev/nvidia{i}" for i in range(4)] + ["/dev/nvidiactl"]
    info = _info(plan, devs, env=[f"{k}={v}" for k, v in plan.env] + ["NVIDIA_VISIBLE_DEVICES=void"])
    assert lifecycle.container_problems(info, plan, CDI) == []


def test_container_problems_name_each_loss() -> None:
    plan = _plan()
    assert any("NO devices reached" in p for p in lifecycle.container_problems(_info(plan, []), plan, CDI))
    some = _info(plan, ["/dev/nvidia0", "/dev/nvidiactl"], env=[f"{k}={v}" for k, v in plan.env[1:]])
    problems = lifecycle.container_problems(some, plan, CDI)
    assert "CDI device nvidia.com/gpu=1: /dev/nvidia1 not in the container" in problems
    assert any(p.startswith("CDI device nvidia.com/gpu=0: env NVIDIA_VISIBLE_DEVICES") for p in problems)
    assert f"env not as planned: {plan.env[0][0]}" in problems
    stale = lifecycle.container_problems(
        _info(plan, ["/dev/nvidia0"], running=False, label="0" * 16), plan, {}
    )
    assert any("is not running (status exited, exit code 1)" in p for p in stale)
    assert any("started from another spec" in p for p in stale)
    assert any("no CDI spec on this host describes nvidia.com/gpu=0" in p for p in stale)
    other = {**_info(plan, ["/dev/nvidia0"]), "ImageName": "localhost/vllm-merlin:old"}
    assert f"container runs image localhost/vllm-merlin:old, the plan says {plan.image}" in (
        lifecycle.container_problems(other, plan, {})
    )


def test_container_problems_name_wrong_limits_with_the_compose_fix() -> None:
    plan = _plan()
    devs = [f"/dev/nvidia{i}" for i in range(4)] + ["/dev/nvidiactl"]
    info = _info(plan, devs, env=[f"{k}={v}" for k, v in plan.env] + ["NVIDIA_VISIBLE_DEVICES=void"])
    info["HostConfig"]["ShmSize"] = 64 * 2**20
    info["Config"]["StopTimeout"] = 10
    problems = lifecycle.container_problems(info, plan, CDI)
    assert problems[0] == f"/dev/shm is 67108864 bytes, not {plan.shm_bytes} (8g)"
    assert problems[1].startswith("stop timeout is 10s, not 70s: vLLM would be killed mid-drain")
    assert "--podman-run-args=--stop-timeout=70" in problems[1]


def test_classify_holders_orphans_by_container_pid_or_engine_name() -> None:
    apps = [
        probes.GpuApp(10, "/usr/bin/python3", "GPU-a", 21000),
        probes.GpuApp(11, "VLLM::Worker_PP1", "GPU-b", 21000),
        probes.GpuApp(12, "python3", "GPU-c", 300),
        probes.GpuApp(13, "/opt/ComfyUI/venv/bin/python", "GPU-a", 256),
    ]
    held = gpuholders.classify_holders(
        apps, {10}, {12: "python3 -m vllm.entrypoints.openai.api_server --port 8000"}
    )
    assert [h.why for h in held] == [
        "was in the container",
        "vLLM engine process",
        "vLLM engine process",
        "foreign",
    ]
    assert gpuholders.reap_command(held[:2]) == "kill -TERM 10 11; sleep 10; kill -KILL 10 11 2>/dev/null"
    top = gpuholders.parse_top(
        "HPID        COMMAND\n4242        vllm serve /model --port 8000\n4250  VLLM::Worker_TP1\n"
    )
    assert top == {4242: "vllm serve /model --port 8000", 4250: "VLLM::Worker_TP1"}
    # 4242 is gone; 4250 lives on with the same command (an escaped worker); 4260's PID was reused
    now = {4242: None, 4250: "VLLM::Worker_TP1", 4260: "bash"}
    assert gpuholders.survivors({**top, 4260: "VLLM::Worker_TP2"}, now) == [(4250, "VLLM::Worker_TP1")]


def test_gates_need_every_line_kv_within_tolerance_and_health() -> None:
    g = wait.Gates(("Application startup complete",), 924_993, 0.02)
    g.feed("INFO ... GPU KV cache size: 910,000 tokens")
    assert g.kv_ok is True and not g.passed
    g.feed("INFO:     Application startup complete.")
    assert not g.passed
    g.healthy = True
    assert g.passed and g.failure() is None
    bad = wait.Gates((), 924_993, 0.02)
    bad.feed("GPU KV cache size: 512,000 tokens")
    assert bad.failure() == "GPU KV cache size is 512,000 tokens; the recipe says 924,993 (±2%)"
    dead = wait.Gates(("x",))
    dead.feed("torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB")
    assert dead.failure() and dead.fatal and "invoke doctor" in dead.fatal[1]
    assert wait.Gates(("x",)).kv_ok is True  # no published number: nothing to compare


def test_wait_timeout_derives_from_the_recipe_startup_note() -> None:
    p = Project(REPO)
    assert (
        wait.timeout_for(p.load("flash-next-merlin-4x3090")) == 720
    )  # "Startup ~5-6 min first boot" = 360 s
    assert wait.timeout_for(p.load("flash-next-int4-3x3090")) == 1200  # "first boot ~10 min"
