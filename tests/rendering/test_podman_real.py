"""The podman target's run.sh/stop.sh executed for real: podman, fake CDI GPUs, a recording stand-in."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from rigsmith.rendering import deploy
from rigsmith.spec import loads
from tests.support.common import (
    HOST_MEMLOCK,
    prepare_host_dirs,
    run_script,
    standin_deployment,
    write_project,
)
from tests.support.podman import Podman, parse_recording
from tests.support.targets import HOSTILE, hostile_deployment


def _deploy(tmp_path: Path, data: dict[str, object]) -> Path:
    project = write_project(tmp_path, data)
    out = tmp_path / "out"
    deploy.deploy(
        project, "podman", deployment=str(data["name"]), out=out, memlock=HOST_MEMLOCK, echo=lambda _m: None
    )
    return out / "podman" / str(data["name"])


@pytest.fixture
def started(tmp_path: Path, podman: Podman, fake_cdi: Path, standin_image: str):
    """Deploy the seed 003 stand-in, run run.sh, yield (data, dir, recording); always clean up."""
    data = standin_deployment(tmp_path, name="standin-podman")
    prepare_host_dirs(data)
    d = _deploy(tmp_path, data)
    proc = run_script(d / "run.sh", podman.env)
    try:
        assert proc.returncode == 0, proc.stderr
        logs = podman.logs_until("standin-podman", "Application startup complete")
        yield data, d, parse_recording(logs)
    finally:
        podman.run("rm", "--force", "--time", "0", "standin-podman", check=False)


def test_container_receives_exact_recipe_argv_env_devices_and_shm(started, podman: Podman) -> None:
    data, _d, rec = started
    spec = loads(json.dumps(data))
    expected = ["serve", spec.model.container_path, *spec.engine.args[1:]]
    assert rec.argv == expected
    for e in spec.active_env():
        assert rec.env[e.name] == spec.fill(e.value), e.name
    for e in spec.env:
        if not e.active:
            assert e.name not in rec.env, f"opt-in {e.name} leaked into the container"
    assert rec.shm_kib == 8 * 1024 * 1024  # 8g
    assert rec.memlock == "8192"  # the runtime default, since memlock=host sets nothing
    for i in range(4):
        assert f"fakegpu{i}" in rec.devices
        assert rec.env[f"FAKE_GPU_{i}"] == "present"  # the CDI containerEdits really applied
    info = podman.inspect("standin-podman")
    assert info["HostConfig"]["ShmSize"] == 8 * 1024**3  # type: ignore[index]
    assert info["Config"]["StopTimeout"] == 70  # type: ignore[index]


def test_stop_script_terminates_gracefully_and_removes(started, podman: Podman) -> None:
    _data, d, _rec = started
    proc = run_script(d / "stop.sh", podman.env)
    assert proc.returncode == 0, proc.stderr
    assert "stopped and removed" in proc.stdout
    assert podman.run("container", "exists", "standin-podman", check=False).returncode == 1
    again = run_script(d / "stop.sh", podman.env)
    assert again.returncode == 0 and "is not running" in again.stdout


def test_hostile_values_reach_the_container_literally_and_nothing_runs_on_host(
    tmp_path: Path, podman: Podman, fake_cdi: Path, standin_image: str
) -> None:
    for i in (1, 2, 3):
        Path(f"/tmp/rigsmith-pwned-{i}").unlink(missing_ok=True)
    data = hostile_deployment(tmp_path, "standin-hostile", HOSTILE)
    prepare_host_dirs(data)
    d = _deploy(tmp_path, data)
    try:
        proc = run_script(d / "run.sh", podman.env)
        assert proc.returncode == 0, proc.stderr
        rec = parse_recording(podman.logs_until("standin-hostile", "Application startup complete"))
    finally:
        podman.run("rm", "--force", "--time", "0", "standin-hostile", check=False)
    args = data["engine"]["args"]  # type: ignore[index]
    # The model word /models/x is mapped to the container path, so the name it served is kept (issue 24).
    served = ["--served-model-name", args[0]]
    assert rec.argv == ["serve", data["model"]["container_path"], *args[1:], *served]  # type: ignore[index]
    for i, v in enumerate(HOSTILE):
        assert rec.env[f"HOSTILE_{i}"] == v
    for i in (1, 2, 3):
        assert not Path(f"/tmp/rigsmith-pwned-{i}").exists(), "a recipe value was executed on the host"


def test_sparse_mount_file_is_created_at_exact_size(
    tmp_path: Path, podman: Podman, fake_cdi: Path, standin_image: str
) -> None:
    data = standin_deployment(tmp_path, seed="flash-next-int4-3x3090", name="standin-sparse")
    prepare_host_dirs(data)
    d = _deploy(tmp_path, data)
    ple = Path(data["mounts"][0]["host"])  # type: ignore[index]
    try:
        proc = run_script(d / "run.sh", podman.env)
        assert proc.returncode == 0, proc.stderr
        assert ple.is_file() and ple.stat().st_size == 102400491520
        assert ple.stat().st_blocks == 0, "must be sparse, not 95 GiB of zeros"
        rec = parse_recording(podman.logs_until("standin-sparse", "Application startup complete"))
        assert rec.argv[0:2] == ["serve", "/models/Qwen3.8-Flash-Next-INT4-Mixed-AutoRound"]
    finally:
        podman.run("rm", "--force", "--time", "0", "standin-sparse", check=False)


def test_run_refuses_a_directory_where_the_sparse_file_belongs(
    tmp_path: Path, podman: Podman, fake_cdi: Path, standin_image: str
) -> None:
    data = standin_deployment(tmp_path, seed="flash-next-int4-3x3090", name="standin-dir")
    prepare_host_dirs(data)
    Path(data["mounts"][0]["host"]).mkdir(parents=True)  # type: ignore[index]
    d = _deploy(tmp_path, data)
    proc = run_script(d / "run.sh", podman.env)
    assert proc.returncode == 1
    assert "is a directory" in proc.stderr and "hint:" in proc.stderr
    assert podman.run("container", "exists", "standin-dir", check=False).returncode == 1


def test_run_refuses_a_stale_file_where_the_sparse_file_belongs_and_starts_once_it_is_right(
    tmp_path: Path, podman: Podman, fake_cdi: Path, standin_image: str
) -> None:
    """Seed 000's pitfall 2 as the generated spec carries it (deployments/flash-next-int4-3x3090.yaml is what
    import-recipe makes of the record): a 0-byte file, which the patched loader rejects as stale, stops
    run.sh before podman runs; the file at its exact size starts the engine with it mounted."""
    data = standin_deployment(tmp_path, seed="flash-next-int4-3x3090", name="standin-stale")
    prepare_host_dirs(data)
    ple = Path(data["mounts"][0]["host"])  # type: ignore[index]
    ple.parent.mkdir(parents=True)
    ple.touch()
    d = _deploy(tmp_path, data)
    proc = run_script(d / "run.sh", podman.env)
    assert proc.returncode == 1
    assert "has the wrong size" in proc.stderr and "102400491520" in proc.stderr and "hint:" in proc.stderr
    assert podman.run("container", "exists", "standin-stale", check=False).returncode == 1
    ple.unlink()
    with ple.open("wb") as f:
        f.truncate(102400491520)
    try:
        proc = run_script(d / "run.sh", podman.env)
        assert proc.returncode == 0, proc.stderr
        rec = parse_recording(podman.logs_until("standin-stale", "Application startup complete"))
        assert rec.env["VLLM_PLE_MMAP_PATH"] == "/workstation/ngram_table.bin"
        mounts = podman.inspect("standin-stale")["Mounts"]  # type: ignore[index]
        (mount,) = [m for m in mounts if m["Destination"] == "/workstation/ngram_table.bin"]  # type: ignore[index, union-attr]
        assert mount["Source"] == str(ple)  # type: ignore[index]
    finally:
        podman.run("rm", "--force", "--time", "0", "standin-stale", check=False)


def test_run_refuses_missing_cdi_device_with_hint(
    tmp_path: Path, podman: Podman, fake_cdi: Path, standin_image: str
) -> None:
    data = standin_deployment(tmp_path, name="standin-nocdi")
    data["resources"]["gpus"]["cdi_devices"] = ["example.com/gpu=0", "example.com/gpu=7"]  # type: ignore[index]
    prepare_host_dirs(data)
    d = _deploy(tmp_path, data)
    proc = run_script(d / "run.sh", podman.env)
    assert proc.returncode == 1
    assert "no CDI spec provides example.com/gpu=7" in proc.stderr
    assert "nvidia-ctk cdi generate" in proc.stderr


def test_run_refuses_gpu_squatters_naming_them(
    tmp_path: Path, podman: Podman, fake_cdi: Path, standin_image: str
) -> None:
    data = standin_deployment(tmp_path, name="standin-squat")
    prepare_host_dirs(data)
    d = _deploy(tmp_path, data)
    fake_bin = tmp_path / "fakebin"
    fake_bin.mkdir()
    smi = fake_bin / "nvidia-smi"
    smi.write_text("#!/bin/sh\necho '48213, /opt/ComfyUI/venv/bin/python, 256 MiB'\n")
    smi.chmod(0o755)
    env = podman.env
    env["PATH"] = f"{fake_bin}:{env['PATH']}"
    proc = run_script(d / "run.sh", env)
    assert proc.returncode == 1
    assert "48213, /opt/ComfyUI/venv/bin/python, 256 MiB" in proc.stderr
    assert podman.run("container", "exists", "standin-squat", check=False).returncode == 1


def test_run_refuses_missing_image_and_missing_model_dir(
    tmp_path: Path, podman: Podman, fake_cdi: Path
) -> None:
    data = standin_deployment(tmp_path, name="standin-noimg", engine={"image": "localhost/nope:1"})
    d = _deploy(tmp_path, data)
    proc = run_script(d / "run.sh", podman.env)
    assert proc.returncode == 1 and "does not exist" in proc.stderr and "invoke fetch-model" in proc.stderr
    prepare_host_dirs(data)
    proc = run_script(d / "run.sh", podman.env)
    assert proc.returncode == 1 and "image localhost/nope:1 is not in local storage" in proc.stderr
