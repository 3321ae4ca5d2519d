"""Secondary Hub models and ``NAME=$OTHER`` secrets through the podman target's run.sh, executed for real:
podman (--network none), fake CDI GPUs, the recording stand-in engine."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from rigsmith.rendering import deploy
from tests.support.common import (
    HOST_MEMLOCK,
    prepare_host_dirs,
    run_script,
    standin_deployment,
    write_project,
)
from tests.support.podman import Podman, parse_recording
from tests.support.targets import run_quadlet

DRAFT = '{"model": "acme/draft", "num_speculative_tokens": 3, "method": "draft_model"}'
TOKEN = "hf_not-a-real-token 'with' $(quotes)"  # never expanded, never written into a file


def _data(tmp_path: Path, name: str) -> dict[str, object]:
    data = standin_deployment(tmp_path, name=name)
    args = list(data["engine"]["args"])  # type: ignore[index]
    spec_i = args.index("--speculative-config") + 1
    args[spec_i] = DRAFT
    args += ["--tokenizer", "acme/tok", "--enable-lora", "--lora-modules", "a=acme/lora"]
    data["engine"]["args"] = args  # type: ignore[index]
    data["secondary_models"] = [
        {"role": "speculative", "repo": "acme/draft", "arg": spec_i},
        {"role": "tokenizer", "repo": "acme/tok", "arg": len(args) - 4},
        {"role": "lora", "repo": "acme/lora", "name": "a", "arg": len(args) - 1},
    ]
    data["env"] = [
        *data["env"],  # type: ignore[list-item]
        {"name": "HUGGING_FACE_HUB_TOKEN", "value": "$HF_TOKEN", "secret": True},
    ]
    return data


def test_secondaries_mount_read_only_and_the_mapped_secret_reaches_the_container(
    tmp_path: Path, podman: Podman, fake_cdi: Path, standin_image: str
) -> None:
    name = "standin-secondary"
    data = _data(tmp_path, name)
    prepare_host_dirs(data)
    models = tmp_path / "models"
    project = write_project(tmp_path, data)
    out = tmp_path / "out"
    deploy.deploy(project, "podman", deployment=name, out=out, memlock=HOST_MEMLOCK, echo=lambda _m: None)
    run = out / "podman" / name / "run.sh"
    assert TOKEN not in run.read_text()

    # The secondary dirs are checked first (fetch-model makes them), then the host's HF_TOKEN.
    proc = run_script(run, podman.env)
    assert proc.returncode == 1 and "does not exist" in proc.stderr and "fetch-model" in proc.stderr
    for d in ("draft", "tok", "lora"):
        (models / d).mkdir(parents=True)
        (models / d / "config.json").write_text(d)
    env = {k: v for k, v in podman.env.items() if k not in ("HF_TOKEN", "HUGGING_FACE_HUB_TOKEN")}
    proc = run_script(run, env)
    assert proc.returncode == 1 and "HF_TOKEN is not set" in proc.stderr, proc.stderr

    try:
        proc = run_script(run, {**env, "HF_TOKEN": TOKEN, "HUGGING_FACE_HUB_TOKEN": "the wrong one"})
        assert proc.returncode == 0, proc.stderr
        rec = parse_recording(podman.logs_until(name, "Application startup complete"))
        info = podman.inspect(name)
    finally:
        podman.run("rm", "--force", "--time", "0", name, check=False)
    assert rec.env["HUGGING_FACE_HUB_TOKEN"] == TOKEN
    assert json.loads(rec.argv[rec.argv.index("--speculative-config") + 1])["model"] == "/models/draft"
    assert rec.argv[rec.argv.index("--tokenizer") + 1] == "/models/tok"
    assert rec.argv[rec.argv.index("--lora-modules") + 1] == "a=/models/lora"
    mounts = {m["Destination"]: m for m in info["Mounts"]}  # type: ignore[index]
    for d in ("draft", "tok", "lora"):
        m = mounts[f"/models/{d}"]
        assert m["Source"] == str(models / d) and m["RW"] is False


@pytest.mark.parametrize(
    ("target", "expected"),
    [
        ("quadlet", "Secret=HF_TOKEN,type=env,target=HUGGING_FACE_HUB_TOKEN"),
        ("compose", "HUGGING_FACE_HUB_TOKEN=${HF_TOKEN}"),
        ("kube", "key: HF_TOKEN"),
        ("lxc", 'export HUGGING_FACE_HUB_TOKEN="$HF_TOKEN"'),
    ],
)
def test_every_target_reads_the_mapped_secret_from_the_other_name(
    target: str, expected: str, tmp_path: Path
) -> None:
    data = _data(tmp_path, "mapped")
    gpus = data["resources"]["gpus"]  # type: ignore[index]
    gpus["cdi_devices"] = [f"nvidia.com/gpu={i}" for i in range(gpus["count"])]  # lxc maps NVIDIA nodes
    project = write_project(tmp_path, data)
    _plan, files = deploy.artifacts(project, target, deployment="mapped", out=tmp_path / "out")
    text = "\n".join(f.content if isinstance(f.content, str) else f.content.decode() for f in files)
    assert expected in text


def test_compose_passes_the_mapped_secret_and_mounts_the_secondaries_on_real_podman(
    tmp_path: Path, podman: Podman, fake_cdi: Path, standin_image: str, compose_bins: dict[str, list[str]]
) -> None:
    name = "standin-secondary-compose"
    data = _data(tmp_path, name)
    prepare_host_dirs(data)
    for d in ("draft", "tok", "lora"):
        (tmp_path / "models" / d).mkdir(parents=True)
    project = write_project(tmp_path, data)
    out = tmp_path / "out"
    deploy.deploy(project, "compose", deployment=name, out=out, memlock=HOST_MEMLOCK, echo=lambda _m: None)
    compose_file = out / "compose" / name / "compose.yaml"
    assert TOKEN not in compose_file.read_text()
    up = [*compose_bins["1.6.0"], "-f", str(compose_file), "--podman-run-args=--stop-timeout=70", "up", "-d"]
    env = {**podman.env, "HF_TOKEN": TOKEN}
    env.pop("HUGGING_FACE_HUB_TOKEN", None)
    try:
        proc = subprocess.run(
            up, cwd=compose_file.parent, env=env, capture_output=True, text=True, timeout=180, check=False
        )
        assert proc.returncode == 0, proc.stdout + proc.stderr
        rec = parse_recording(podman.logs_until(name, "Application startup complete"))
        info = podman.inspect(name)
    finally:
        podman.run("rm", "--force", "--time", "0", name, check=False)
        podman.run("pod", "rm", "--force", f"pod_{name}", check=False)
    assert rec.env["HUGGING_FACE_HUB_TOKEN"] == TOKEN
    assert rec.argv[rec.argv.index("--tokenizer") + 1] == "/models/tok"
    mounts = {m["Destination"]: m for m in info["Mounts"]}  # type: ignore[index]
    assert all(mounts[f"/models/{d}"]["RW"] is False for d in ("draft", "tok", "lora"))


def test_quadlet_generator_reads_the_mapped_secret_and_the_read_only_secondary_volumes(
    tmp_path: Path, quadlet_bin: Path
) -> None:
    data = _data(tmp_path, "mapped-quadlet")
    project = write_project(tmp_path, data)
    _plan, files = deploy.artifacts(project, "quadlet", deployment="mapped-quadlet", out=tmp_path / "out")
    unit = next(f for f in files if f.path.suffix == ".container")
    unit.path.parent.mkdir(parents=True, exist_ok=True)
    unit.path.write_text(str(unit.content))
    proc = run_quadlet(quadlet_bin, unit.path, tmp_path)
    assert proc.returncode == 0, proc.stderr
    exec_start = next(ln for ln in proc.stdout.splitlines() if ln.startswith("ExecStart="))
    assert "--secret HF_TOKEN,type=env,target=HUGGING_FACE_HUB_TOKEN" in exec_start
    for d in ("draft", "tok", "lora"):
        assert f"-v {tmp_path}/models/{d}:/models/{d}:ro" in exec_start
