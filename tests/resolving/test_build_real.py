"""`invoke pin` and `invoke build` for real: a local registry, Podman's API service and a private dockerd."""

from __future__ import annotations

import hashlib
import io
import json
import subprocess
import tarfile
from pathlib import Path

import docker  # type: ignore[import-untyped]
import pytest

from rigsmith.errors import AdapterError, PreflightError, RigsmithError
from rigsmith.project import Project
from rigsmith.resolving.image import build as buildmod
from rigsmith.resolving.image import engine as enginemod
from rigsmith.resolving.image import registry as registrymod
from rigsmith.resolving.lock import lock as lockmod
from tests.support import services
from tests.support.common import REPO
from tests.support.images import TINY_PATCH, cli_env, invoke_bin, tiny_project

pytestmark = pytest.mark.engine


def _invoke(project_env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [invoke_bin(), *args],
        cwd=REPO,
        env=project_env,
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )


def _podman(svc: services.PodmanService) -> enginemod.DockerPyEngine:
    return enginemod.connect("podman", {"CONTAINER_HOST": svc.url})


def _docker(d: services.Dockerd) -> enginemod.DockerPyEngine:
    return enginemod.connect("docker", {"DOCKER_HOST": d.url})


def _pin(project: Project) -> None:
    reg = registrymod.Registry({})
    try:
        buildmod.pin_images(project, reg, echo=lambda _: None)
    finally:
        reg.close()


def test_pin_writes_the_base_digest_the_registry_serves(tmp_path: Path, base_ref: str) -> None:
    project = tiny_project(tmp_path, base_ref)
    proc = _invoke(cli_env(project), "pin")
    assert proc.returncode == 0, proc.stderr
    lock = lockmod.read(project.lock_path)
    assert lock.images[base_ref].digest == services.skopeo_digest(base_ref)
    assert lock.images[base_ref].media_type in registrymod.MANIFEST_TYPES
    assert f"pinned  {base_ref} -> {lock.images[base_ref].digest}" in proc.stdout
    again = _invoke(cli_env(project), "pin")
    assert again.returncode == 0 and "unchanged" in again.stdout


def test_build_refuses_a_tag_only_base_with_the_pin_hint(tmp_path: Path, base_ref: str) -> None:
    project = tiny_project(tmp_path, base_ref)
    proc = _invoke(cli_env(project), "build", "--image", "tiny", "--engine", "podman")
    assert proc.returncode == 1
    assert "Traceback" not in proc.stderr
    assert f"base {base_ref} is a tag without a digest" in proc.stderr
    assert "run `invoke pin`" in proc.stderr
    assert not (project.root / "build").exists()
    assert not project.lock_path.exists()


def test_build_with_a_missing_patch_file_names_the_slot(tmp_path: Path, base_ref: str) -> None:
    project = tiny_project(tmp_path, base_ref)
    _pin(project)
    (project.images / "tiny" / "patches" / "greet.patch").unlink()
    proc = _invoke(cli_env(project), "build", "--image", "tiny", "--engine", "podman")
    assert proc.returncode == 1
    assert "Traceback" not in proc.stderr
    assert (
        "patches[0]: patch slot 'greet' is declared but images/tiny/patches/greet.patch is missing"
        in proc.stderr
    )
    assert "builds" not in lockmod.read(project.lock_path).model_dump(exclude_defaults=True)


def test_podman_build_push_and_deploy_use_the_locked_digest(
    tmp_path: Path, base_ref: str, registry: services.LocalRegistry, podman_api: services.PodmanService
) -> None:
    project = tiny_project(tmp_path, base_ref, deployment=True)
    env = cli_env(project, CONTAINER_HOST=podman_api.url)
    _pin(project)  # the library call: `invoke pin` would also pin the seed's model on the Hub
    proc = _invoke(
        env, "build", "--deployment", "flash-next-int4-3x3090", "--engine", "podman", "--push", registry.host
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert (
        "STEP 1/" in proc.stdout
        and "smoke: ok" in proc.stdout
        and "apply-patch: applied greet.patch" in proc.stdout
    )

    lock = lockmod.read(project.lock_path)
    built = lock.builds["tiny"]
    assert built.ref == f"{registry.host}/tiny"
    assert built.digest == services.skopeo_digest(f"{built.ref}@{built.digest}")
    assert built.base == f"{base_ref.rpartition(':')[0]}@{lock.images[base_ref].digest}"
    assert built.patches == {
        "images/tiny/patches/greet.patch": "sha256:" + hashlib.sha256(TINY_PATCH.encode()).hexdigest()
    }
    tag = built.inputs_sha256.removeprefix("sha256:")[:16] if built.inputs_sha256 else ""
    assert registrymod.Registry({}).resolve(f"{built.ref}:{tag}").digest == built.digest

    deployed = _invoke(env, "deploy", "--target", "podman", "--yes")
    assert deployed.returncode == 0, deployed.stderr
    run_sh = (project.root / "podman" / "flash-next-int4-3x3090" / "run.sh").read_text()
    assert f"IMAGE={built.ref}@{built.digest}\n" in run_sh
    assert f"image: {built.ref}@{built.digest} (registry digest from rigsmith.lock)" in deployed.stdout

    # A later local build with the same inputs, the image still present, asks the engine for nothing.
    noop = _invoke(env, "build", "--engine", "podman")
    assert noop.returncode == 0, noop.stdout + noop.stderr
    assert "not rebuilt" in noop.stdout and "STEP 1/" not in noop.stdout
    assert f"lock: builds.tiny = {built.ref}@{built.digest} (unchanged)" in noop.stdout
    assert lockmod.read(project.lock_path).builds["tiny"] == built

    # Without the local tag it builds (bare: every image a deployment builds) and gives the same image: the
    # lock keeps the pushed digest, and deploy still runs it by digest.
    podman_api.cli("untag", f"localhost/rigsmith/tiny:{tag}", f"localhost/rigsmith/tiny:{tag}")
    again = _invoke(env, "build", "--engine", "podman")
    assert again.returncode == 0, again.stdout + again.stderr
    assert (
        f"lock: builds.tiny = {built.ref}@{built.digest} (the pushed digest of this same image"
        in again.stdout
    )
    assert lockmod.read(project.lock_path).builds["tiny"] == built
    redeployed = _invoke(env, "deploy", "--target", "podman", "--check")
    assert redeployed.returncode == 0 and "not pinned" not in redeployed.stdout, redeployed.stdout

    # The locked reference really is the patched image: pull it by digest and look inside.
    podman_api.cli("rmi", "--force", f"localhost/rigsmith/tiny:{tag}")
    podman_api.cli("pull", "--tls-verify=false", f"{built.ref}@{built.digest}")
    out = podman_api.cli(
        "run", "--rm", "--network", "none", f"{built.ref}@{built.digest}", "cat", "/opt/src/greet.txt"
    )
    assert out.stdout.decode() == "hello patched by rigsmith\n"
    labels = json.loads(podman_api.cli("image", "inspect", f"{built.ref}@{built.digest}").stdout)[0]["Labels"]
    assert labels["io.rigsmith.patch.greet.sha256"] == built.patches["images/tiny/patches/greet.patch"]
    assert labels["org.opencontainers.image.base.digest"] == lock.images[base_ref].digest
    assert labels["org.opencontainers.image.source"] == "https://example.invalid/rigsmith-tests"
    assert labels["org.opencontainers.image.revision"] == f"rigsmith-inputs-{built.inputs_sha256}"
    assert labels["org.example.note"] == "dollar $HOME stays literal"


def test_podman_noop_rebuild_reuses_the_cache(
    tmp_path: Path, base_ref: str, podman_api: services.PodmanService
) -> None:
    project = tiny_project(tmp_path, base_ref)
    _pin(project)
    eng = _podman(podman_api)
    try:
        first = buildmod.build_image(project, eng, image="tiny", echo=lambda _: None)
        noop: list[str] = []
        assert buildmod.build_image(project, eng, image="tiny", echo=noop.append) == first
        assert any("not rebuilt" in line for line in noop) and not any("STEP " in line for line in noop)
        # Without the local tag the engine builds again, every step from its cache.
        local = f"{buildmod.LOCAL_REPO}/tiny:{(first.inputs_sha256 or '').removeprefix('sha256:')[:16]}"
        podman_api.cli("untag", local, local)
        lines: list[str] = []
        second = buildmod.build_image(project, eng, image="tiny", echo=lines.append)
    finally:
        eng.close()
    assert second.image_id == first.image_id
    steps = sum(1 for line in lines if line.startswith("STEP "))
    assert sum(1 for line in lines if "Using cache" in line) == steps - 1  # every step after FROM
    assert lockmod.read(project.lock_path).builds["tiny"].pinned_ref == first.image_id


def test_podman_builds_from_clean_storage_give_the_same_digest(
    tmp_path: Path, base_ref: str, registry: services.LocalRegistry
) -> None:
    """Bit-for-bit: image ID and pushed manifest digest match across two fresh Podman stores."""
    project = tiny_project(tmp_path, base_ref)
    _pin(project)
    results = []
    for i in range(2):
        with services.podman_service(tmp_path / f"clean{i}", [registry.host]) as svc:
            eng = _podman(svc)
            reg = registrymod.Registry({})
            try:
                results.append(
                    buildmod.build_image(
                        project, eng, image="tiny", push=registry.host, resolver=reg, echo=lambda _: None
                    )
                )
            finally:
                eng.close()
                reg.close()
    assert results[0].image_id == results[1].image_id
    assert results[0].digest == results[1].digest is not None


def _content(client: docker.DockerClient, image_id: str) -> dict[str, tuple[str, int, str]]:
    """Every path of the image's layers → (type, mode, sha256 or link target): content without timestamps."""
    raw = b"".join(client.api.get_image(image_id))
    out: dict[str, tuple[str, int, str]] = {}
    with tarfile.open(fileobj=io.BytesIO(raw)) as archive:
        manifest = json.load(archive.extractfile("manifest.json"))  # type: ignore[arg-type]
        for layer in manifest[0]["Layers"]:
            with tarfile.open(fileobj=archive.extractfile(layer)) as lt:
                for m in lt.getmembers():
                    data = lt.extractfile(m).read() if m.isfile() else m.linkname.encode()  # type: ignore[union-attr]
                    out[m.name] = (m.type.decode(), m.mode, hashlib.sha256(data).hexdigest())
    return out


def test_docker_build_push_and_clean_rebuild(
    tmp_path: Path,
    base_ref: str,
    registry: services.LocalRegistry,
    dockerd: services.Dockerd,
    docker_client: docker.DockerClient,
) -> None:
    """Docker 20.10's classic builder stamps build times into the config and layer mtimes, so two clean
    builds differ in image ID; the strongest true statement is: same files, modes and contents, and a
    no-op rebuild reuses every cached step (same image ID)."""
    project = tiny_project(tmp_path, base_ref)
    env = cli_env(project, DOCKER_HOST=dockerd.url)
    assert _invoke(env, "pin").returncode == 0
    proc = _invoke(env, "build", "--image", "tiny", "--engine", "docker", "--push", registry.host)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "Step 1/" in proc.stdout and "smoke: ok" in proc.stdout
    first = lockmod.read(project.lock_path).builds["tiny"]
    assert first.digest == services.skopeo_digest(f"{first.ref}@{first.digest}")
    out = docker_client.containers.run(
        first.image_id, ["cat", "/opt/src/greet.txt"], remove=True, network_mode="none"
    )
    assert out == b"hello patched by rigsmith\n"
    labels = docker_client.images.get(first.image_id).labels
    assert labels["io.rigsmith.patch.greet.sha256"] == first.patches["images/tiny/patches/greet.patch"]

    noop = _invoke(env, "build", "--image", "tiny", "--engine", "docker")
    assert noop.returncode == 0
    assert lockmod.read(project.lock_path).builds["tiny"] == first
    assert "unchanged" in noop.stdout and "not rebuilt" in noop.stdout and "Step 1/" not in noop.stdout
    # Without the local tag the engine is asked again, and every step but FROM comes from its cache.
    local = next(t for t in docker_client.images.get(first.image_id).tags if t.startswith("localhost/"))
    docker_client.images.remove(local)
    rebuild = _invoke(env, "build", "--image", "tiny", "--engine", "docker")
    assert rebuild.returncode == 0
    assert lockmod.read(project.lock_path).builds["tiny"].image_id == first.image_id
    assert "(7/8 steps from cache)" in rebuild.stdout

    before = _content(docker_client, first.image_id)
    for img in docker_client.images.list():  # tagged images; their parents go with them
        docker_client.images.remove(img.id, force=True)
    assert docker_client.images.list(all=True) == []  # clean storage: not even the base is left
    again = _invoke(env, "build", "--image", "tiny", "--engine", "docker")
    assert again.returncode == 0, again.stderr
    rebuilt = lockmod.read(project.lock_path).builds["tiny"]
    assert _content(docker_client, rebuilt.image_id) == before


def test_engine_autodetect_and_a_wrong_engine(
    podman_api: services.PodmanService, dockerd: services.Dockerd
) -> None:
    eng = enginemod.connect(None, {"CONTAINER_HOST": podman_api.url})
    assert (eng.kind, eng.url) == ("podman", podman_api.url)
    eng.close()
    eng = enginemod.connect(None, {"DOCKER_HOST": dockerd.url, "CONTAINER_HOST": podman_api.url})
    assert eng.kind == "docker"
    eng.close()
    with pytest.raises(PreflightError, match="no docker API reachable") as err:
        enginemod.connect("docker", {"DOCKER_HOST": podman_api.url})
    assert "(that is podman)" in str(err.value)


def test_a_failing_build_step_is_reported_and_nothing_is_locked(
    tmp_path: Path, base_ref: str, podman_api: services.PodmanService
) -> None:
    project = tiny_project(tmp_path, base_ref, smoke=["/bin/sh", "-c", "echo smoke failed >&2; exit 3"])
    _pin(project)
    eng = _podman(podman_api)
    try:
        with pytest.raises(AdapterError, match="podman build failed"):
            buildmod.build_image(project, eng, image="tiny", echo=lambda _: None)
    finally:
        eng.close()
    assert "tiny" not in lockmod.read(project.lock_path).builds


def test_a_patch_that_does_not_apply_fails_the_build(
    tmp_path: Path, base_ref: str, podman_api: services.PodmanService
) -> None:
    project = tiny_project(tmp_path, base_ref)
    (project.images / "tiny" / "greet.txt").write_text("something else\n")
    _pin(project)
    lines: list[str] = []
    eng = _podman(podman_api)
    try:
        with pytest.raises(AdapterError):
            buildmod.build_image(project, eng, image="tiny", echo=lines.append)
    finally:
        eng.close()
    assert any("greet.patch does not apply in /opt/src" in line for line in lines)


def test_pin_deployment_engine_image_then_deploy_renders_it_by_digest(tmp_path: Path, base_ref: str) -> None:
    import yaml

    project = tiny_project(tmp_path, base_ref)
    data = yaml.safe_load((REPO / "deployments" / "flash-next-merlin-4x3090.yaml").read_text())
    data["engine"]["image"] = base_ref
    (project.deployments / "flash-next-merlin-4x3090.yaml").write_text(yaml.safe_dump(data, sort_keys=False))
    env = cli_env(project)
    lines: list[str] = []
    reg = registrymod.Registry({})
    # The library call: `invoke pin --deployment` also pins the deployment's model on the Hub.
    buildmod.pin_images(project, reg, deployment="flash-next-merlin-4x3090", echo=lines.append)
    reg.close()
    lock = lockmod.read(project.lock_path)
    assert list(lock.images) == [base_ref]  # images/tiny is not used by this deployment
    assert any("deployments/flash-next-merlin-4x3090.yaml engine.image" in line for line in lines)
    deployed = _invoke(
        env, "deploy", "--target", "podman", "--deployment", "flash-next-merlin-4x3090", "--yes"
    )
    assert deployed.returncode == 0, deployed.stderr
    run_sh = (project.root / "podman" / "flash-next-merlin-4x3090" / "run.sh").read_text()
    assert f"IMAGE={base_ref.rpartition(':')[0]}@{services.skopeo_digest(base_ref)}\n" in run_sh


def test_pin_with_an_unreachable_registry_changes_nothing(tmp_path: Path) -> None:
    project = tiny_project(tmp_path, f"127.0.0.1:{services.free_port()}/tinybase:1")
    project.lock_path.write_text(lockmod.dumps(lockmod.Lock()))
    before = project.lock_path.read_text()
    proc = _invoke(cli_env(project), "pin")
    assert proc.returncode == 1
    assert "Traceback" not in proc.stderr and "cannot resolve" in proc.stderr
    assert project.lock_path.read_text() == before


def test_a_bad_push_registry_is_refused_before_building(
    tmp_path: Path, base_ref: str, podman_api: services.PodmanService
) -> None:
    project = tiny_project(tmp_path, base_ref)
    _pin(project)
    eng = _podman(podman_api)
    lines: list[str] = []
    try:
        with pytest.raises(RigsmithError, match="not a valid repository name"):
            reg = registrymod.Registry({})
            buildmod.build_image(project, eng, image="tiny", push="127.0.0.1:5000/Not Valid", resolver=reg,
                                 echo=lines.append)  # fmt: skip
    finally:
        eng.close()
    assert not any(line.startswith("STEP") for line in lines)
    assert "tiny" not in lockmod.read(project.lock_path).builds


@pytest.mark.parametrize("kind", ["podman", "docker"])
def test_build_log_streams_while_the_build_runs(
    kind: str, tmp_path: Path, base_ref: str, podman_api: services.PodmanService, dockerd: services.Dockerd
) -> None:
    import time

    project = tiny_project(
        tmp_path, base_ref, smoke=["/bin/sh", "-c", "echo slow-step-start; sleep 2; echo slow-step-end"]
    )
    _pin(project)
    eng = _podman(podman_api) if kind == "podman" else _docker(dockerd)
    seen: dict[str, float] = {}

    def log(line: str) -> None:
        for mark in ("slow-step-start", "slow-step-end"):
            if line.strip() == mark:
                seen[mark] = time.monotonic()

    try:
        buildmod.build_image(project, eng, image="tiny", echo=log)
    finally:
        eng.close()
    assert (
        seen["slow-step-end"] - seen["slow-step-start"] > 1.5
    )  # lines arrive as they happen, not at the end
