"""up / down / status / logs / wait against real podman, the fake CDI vendor and vLLM-like stand-ins."""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from rigsmith.errors import ConsentError, PreflightError, RigsmithError
from rigsmith.operating.host import LocalHost
from rigsmith.operating.lifecycle import lifecycle, wait
from rigsmith.operating.lifecycle import status as statusmod
from rigsmith.operating.lifecycle.lifecycle import Ops
from rigsmith.spec import Deployment, loads
from tests.support.common import HOST_MEMLOCK, standin_deployment, write_project
from tests.support.ops import OPS_IMAGE, ops_data
from tests.support.podman import Podman

UUID = "GPU-0a7d3e52-19c4-4b8f-a2e6-7f3c91d05b28"


@pytest.fixture
def deployed(
    tmp_path: Path, podman: Podman, fake_cdi: Path, ops_image: str
) -> Iterator[tuple[Ops, dict[str, Any]]]:
    data = ops_data(tmp_path, "ops-up")
    lines: list[str] = []
    ops = Ops(write_project(tmp_path, data), out=tmp_path / "out", env=podman.env, echo=lines.append)
    ops.lines = lines  # type: ignore[attr-defined]
    try:
        yield ops, data
    finally:
        podman.run("rm", "--force", "--time", "0", "ops-up", check=False)


def test_up_renders_starts_and_verifies_devices_and_env_then_is_idempotent(deployed, podman: Podman) -> None:
    ops, _data = deployed
    plan = lifecycle.up(ops, memlock=HOST_MEMLOCK)
    assert (ops.out / "podman" / "ops-up" / "run.sh").is_file()
    assert any(line.startswith("verified ops-up: running; 4 CDI device(s)") for line in ops.lines)
    info = podman.inspect("ops-up")
    env = dict(e.split("=", 1) for e in info["Config"]["Env"])  # type: ignore[index]
    assert all(env[k] == v for k, v in plan.env)
    assert {f"/dev/fakegpu{i}" for i in range(4)} <= {
        d["PathInContainer"] for d in info["HostConfig"]["Devices"]
    }  # type: ignore[index]
    cid = info["Id"]
    ops.lines.clear()
    lifecycle.up(ops, memlock=HOST_MEMLOCK)
    assert ops.lines[0] == "up ops-up (podman): already running, up to date"
    assert podman.inspect("ops-up")["Id"] == cid, "a converged up must not restart the container"


def test_up_fails_loudly_when_the_cdi_devices_were_dropped(deployed, podman: Podman) -> None:
    """seeds/000 pitfall 1: a front-end started the container without its devices and said nothing."""
    ops, _data = deployed
    plan = lifecycle.plan_for(ops.project, "ops-up", memlock=HOST_MEMLOCK)
    opts = plan.podman_options()
    dropped = [o for i, o in enumerate(opts) if o != "--device" and (i == 0 or opts[i - 1] != "--device")]
    podman.run("run", "--detach", *dropped, plan.image, *plan.command)
    with pytest.raises(PreflightError) as err:
        lifecycle.up(ops, memlock=HOST_MEMLOCK)
    msg = str(err.value)
    assert "NO devices reached the container" in msg and "example.com/gpu=0" in msg
    assert "invoke down" in msg


def test_up_names_env_that_did_not_arrive(deployed, podman: Podman) -> None:
    ops, _data = deployed
    plan = lifecycle.plan_for(ops.project, "ops-up", memlock=HOST_MEMLOCK)
    opts = plan.podman_options()
    i = opts.index("--env")
    opts[i + 1] = opts[i + 1].split("=", 1)[0] + "=tampered"
    podman.run("run", "--detach", *opts, plan.image, *plan.command)
    with pytest.raises(PreflightError, match=f"env not as planned: {plan.env[0][0]}"):
        lifecycle.up(ops, memlock=HOST_MEMLOCK)


def test_up_will_not_overwrite_an_edited_script_without_consent(deployed, podman: Podman) -> None:
    ops, _data = deployed
    lifecycle.up(ops, memlock=HOST_MEMLOCK, dry_run=True)
    assert podman.run("container", "exists", "ops-up", check=False).returncode == 1, "dry run started it"
    lifecycle.up(ops, memlock=HOST_MEMLOCK)
    lifecycle.down(ops)
    run_sh = ops.out / "podman" / "ops-up" / "run.sh"
    run_sh.write_text(run_sh.read_text() + "# my local tweak\n")
    with pytest.raises(ConsentError):
        lifecycle.up(ops, memlock=HOST_MEMLOCK)
    assert "# my local tweak" in run_sh.read_text()
    assert podman.run("container", "exists", "ops-up", check=False).returncode == 1


def test_down_stops_removes_and_reports_the_gpu_check_honestly(deployed, podman: Podman) -> None:
    ops, _data = deployed
    lifecycle.up(ops, memlock=HOST_MEMLOCK)
    ops.lines.clear()
    holders = lifecycle.down(ops)
    assert podman.run("container", "exists", "ops-up", check=False).returncode == 1
    assert holders == []
    assert "ops-up: container stopped and removed" in " ".join(ops.lines)
    # this machine has no NVIDIA driver: down says it could not check, it does not claim the GPUs are free
    assert any("cannot check the GPUs" in line for line in ops.lines)
    logs = podman.run("logs", "ops-up", check=False)
    assert logs.returncode != 0  # removed


def test_down_lists_orphan_engine_worker_and_the_reap_command_works(
    deployed, podman: Podman, tmp_path: Path
) -> None:
    """anchors pain point 5: a vLLM worker outlives its server and keeps the GPU."""
    ops, _data = deployed
    worker = subprocess.Popen(["bash", "-c", "exec -a VLLM::Worker_TP0 sleep 300"])
    foreign = subprocess.Popen(["sleep", "300"])
    try:
        fake = tmp_path / "fakebin"
        fake.mkdir()
        (fake / "nvidia-smi").write_text(
            "#!/bin/sh\n"
            f"echo '{worker.pid}, VLLM::Worker_TP0, {UUID}, 21550'\n"
            f"echo '{foreign.pid}, /opt/ComfyUI/venv/bin/python, {UUID}, 256'\n"
        )
        (fake / "nvidia-smi").chmod(0o755)
        lifecycle.up(ops, memlock=HOST_MEMLOCK)  # before the worker "holds" a GPU (run.sh would refuse)
        env = {**(ops.env or {}), "PATH": f"{fake}:{(ops.env or os.environ)['PATH']}"}
        ops = Ops(ops.project, out=ops.out, env=env, echo=ops.echo)
        with pytest.raises(RigsmithError) as err:
            lifecycle.down(ops)
        msg = str(err.value)
        assert f"PID {worker.pid} (VLLM::Worker_TP0, vLLM engine process)" in msg
        assert str(foreign.pid) not in msg.split("hint:")[1], "a foreign process is not ours to reap"
        reap = msg.split("reap them: ", 1)[1].strip()
        assert reap.startswith(f"kill -TERM {worker.pid};")
        subprocess.run(["bash", "-c", reap.replace("sleep 10", "sleep 1")], check=False)
        assert worker.wait(5) is not None
        assert foreign.poll() is None
    finally:
        worker.kill()
        foreign.kill()


def test_status_reports_state_spec_and_health(deployed, podman: Podman) -> None:
    ops, _data = deployed
    assert statusmod.status(ops).state == "absent"
    plan = lifecycle.up(ops, memlock=HOST_MEMLOCK)
    st = statusmod.status(ops, health=wait.http_health_url)
    assert (st.state, st.spec_current, st.image) == ("running", True, OPS_IMAGE)
    # the container carries the lock it runs (no lock history here: no entry label)
    assert st.lock_sha256 == plan.lock_sha256[:16] and st.lock_current is True and st.lock_entry is None
    assert st.healthy is False  # nothing serves the deployment's port
    assert st.service is None


def test_logs_command_shows_the_engine_log(deployed, podman: Podman) -> None:
    ops, _data = deployed
    lifecycle.up(ops, memlock=HOST_MEMLOCK)
    argv = lifecycle.logs_argv(ops, tail=50)
    assert argv == ["podman", "logs", "--tail", "50", "ops-up"]
    deadline = time.monotonic() + 30
    out = ""
    while "Application startup complete" not in out and time.monotonic() < deadline:
        out = subprocess.run(argv, env=ops.env, capture_output=True, text=True, check=False).stdout
        time.sleep(0.2)
    assert "GPU KV cache size: 924,993 tokens" in out


# -- wait ---------------------------------------------------------------------------------------------


def test_wait_passes_on_the_container_log_and_health_of_the_server(
    tmp_path: Path, podman: Podman, fake_cdi: Path, ops_image: str
) -> None:
    from tests.support.standin import Standin, StandinConfig

    data = ops_data(tmp_path, "ops-wait", env={"STANDIN_DELAY": "1.5"})
    spec = loads(json.dumps(data))
    lines: list[str] = []
    ops = Ops(write_project(tmp_path, data), out=tmp_path / "out", env=podman.env, echo=lines.append)
    try:
        lifecycle.up(ops, memlock=HOST_MEMLOCK)
        with Standin(StandinConfig(model_names=("flash-next-v2",)), port=spec.network.port):
            follower = wait.LogFollower(argv=lifecycle.logs_argv(ops, follow=True), env=podman.env)
            res = wait.wait(
                wait.Gates.from_spec(spec),
                follower,
                wait.http_health(f"http://127.0.0.1:{spec.network.port}/health"),
                timeout=wait.timeout_for(spec),
                echo=lines.append,
                poll=0.2,
            )
        assert res.kv_seen == 924_993
        assert res.seconds >= 1.0, "must wait for the gates, not return early"
        assert any("KV cache not yet" in ln for ln in lines) and any("924,993 ok" in ln for ln in lines)
    finally:
        podman.run("rm", "--force", "--time", "0", "ops-wait", check=False)


def test_wait_fails_fast_on_a_wrong_kv_cache_size_showing_the_log(
    tmp_path: Path, podman: Podman, fake_cdi: Path, ops_image: str
) -> None:
    data = ops_data(tmp_path, "ops-kv", env={"STANDIN_KV": "512,000"})
    spec = loads(json.dumps(data))
    ops = Ops(write_project(tmp_path, data), out=tmp_path / "out", env=podman.env, echo=lambda _m: None)
    try:
        lifecycle.up(ops, memlock=HOST_MEMLOCK)
        t0 = time.monotonic()
        err = _wait_failure(ops, spec, podman)
        assert time.monotonic() - t0 < 30
        msg = str(err)
        assert "GPU KV cache size is 512,000 tokens; the recipe says 924,993 (±2%)" in msg
        assert "| INFO 09-20 10:00:00 [api_server.py:1880] vLLM API server version" in msg
        assert err.hint and "the KV-cache gate failed" in err.hint
        assert "--timeout" not in err.hint and "readiness.kv_cache_tokens" in err.hint
    finally:
        podman.run("rm", "--force", "--time", "0", "ops-kv", check=False)


def _wait_failure(ops: Ops, spec: Deployment, podman: Podman) -> RigsmithError:
    """What ``wait`` raises following the container's log, with a health check that never passes."""
    follower = wait.LogFollower(argv=lifecycle.logs_argv(ops, follow=True), env=podman.env)
    with pytest.raises(RigsmithError) as err:
        never = lambda: False  # noqa: E731
        wait.wait(wait.Gates.from_spec(spec), follower, never, timeout=600, echo=lambda _m: None, poll=0.2)
    return err.value


def test_wait_fails_when_the_engine_dies_with_the_matching_hint(
    tmp_path: Path, podman: Podman, fake_cdi: Path, ops_image: str
) -> None:
    data = ops_data(
        tmp_path,
        "ops-dead",
        env={
            "STANDIN_FATAL": "RuntimeError: Failed to infer device type, please set VLLM_LOGGING_LEVEL=DEBUG"
        },
    )
    spec = loads(json.dumps(data))
    ops = Ops(write_project(tmp_path, data), out=tmp_path / "out", env=podman.env, echo=lambda _m: None)
    try:
        # It exits at once: up's re-check usually sees it, but on a loaded machine the exit can land just
        # after; wait must name the cause either way, which is what this test is about.
        with contextlib.suppress(PreflightError):
            lifecycle.up(ops, memlock=HOST_MEMLOCK)
        err = _wait_failure(ops, spec, podman)
        msg = str(err)
        assert "fatal error: RuntimeError: Failed to infer device type" in msg
        assert "CDI devices dropped" in msg
    finally:
        podman.run("rm", "--force", "--time", "0", "ops-dead", check=False)


def test_wait_on_a_log_file_times_out_with_the_last_lines(tmp_path: Path) -> None:
    from tests.support.standin import Standin, StandinConfig

    log = tmp_path / "s.log"
    spec = loads(json.dumps(standin_deployment(tmp_path, name="ops-file")))
    with Standin(StandinConfig(startup_seconds=30, log=log)) as s:
        follower = wait.LogFollower(path=log)
        with pytest.raises(RigsmithError) as err:
            wait.wait(
                wait.Gates.from_spec(spec),
                follower,
                wait.http_health(f"{s.url}/health"),
                timeout=1.0,
                echo=lambda _m: None,
                poll=0.2,
            )
    assert "not ready after 1s" in str(err.value) and "vLLM API server version" in str(err.value)
    assert err.value.hint and "raise --timeout if the first boot is just slow" in err.value.hint


def test_wait_on_a_log_file_passes_once_the_server_is_ready(tmp_path: Path) -> None:
    from tests.support.standin import Standin, StandinConfig

    log = tmp_path / "s.log"
    spec = loads(json.dumps(standin_deployment(tmp_path, name="ops-file")))
    with Standin(StandinConfig(startup_seconds=1.0, log=log)) as s:
        res = wait.wait(
            wait.Gates.from_spec(spec),
            wait.LogFollower(path=log),
            wait.http_health(f"{s.url}/health"),
            timeout=30,
            echo=lambda _m: None,
            poll=0.1,
        )
    assert res.kv_seen == 924_993 and 0.8 < res.seconds < 10


def test_local_host_probe_env_reaches_the_wrapper(podman: Podman) -> None:
    assert LocalHost(podman.env).run(["podman", "--version"]).stdout.startswith("podman version")
