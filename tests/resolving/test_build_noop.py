"""A no-op `invoke build` answers from the lock and one image inspect (no docker-py, no build request), and
the engine builds again whenever an input differs: a context file, the image definition (so the
Dockerfile), the base digest, or the image gone from the engine."""

from __future__ import annotations

import json
import subprocess
import sys

import docker  # type: ignore[import-untyped]

from rigsmith.resolving.image import build as buildmod
from rigsmith.resolving.image import engine as enginemod
from rigsmith.resolving.image import registry as registrymod
from rigsmith.resolving.lock import lock as lockmod
from tests.support import services
from tests.support.common import REPO
from tests.support.images import cli_env, tiny_image, tiny_project


def _build(env: dict[str, str]) -> tuple[int, str, list[str]]:
    """`invoke build` in a fresh interpreter: exit code, output, and which of docker-py, requests, httpx (with
    its CLI's rich and click) it loaded."""
    code = (
        "import json, sys\nfrom invoke.main import program\n"
        "try:\n    program.run(['invoke', 'build', '--image', 'tiny', '--engine', 'podman'])\n"
        "except SystemExit as e:\n    rc = e.code or 0\nelse:\n    rc = 0\n"
        "print('MODULES', json.dumps(sorted(sys.modules)))\nsys.exit(rc)\n"
    )
    res = subprocess.run(
        [sys.executable, "-c", code], cwd=REPO, env=env, capture_output=True, text=True, timeout=600
    )
    *said, mods = res.stdout.splitlines()
    loaded = json.loads(mods.removeprefix("MODULES "))
    return (
        res.returncode,
        "\n".join(said) + res.stderr,
        [m for m in loaded if m in ("docker", "requests", "httpx", "rich", "click")],
    )


def _noop(env: dict[str, str]) -> None:
    rc, said, heavy = _build(env)
    assert rc == 0 and "not rebuilt" in said and "STEP " not in said, said
    assert heavy == []


def _rebuilt(env: dict[str, str]) -> str:
    rc, said, heavy = _build(env)
    assert rc == 0 and "STEP 1/" in said and "not rebuilt" not in said, said
    assert heavy == ["docker", "requests"]
    return said


def test_the_engine_builds_again_whenever_an_input_differs(
    tmp_path, base_ref: str, podman_api: services.PodmanService
) -> None:
    # A build arg of its own: no layer in common with test_build_real's builds of images/tiny, which expect
    # their RUN steps to run (podman's layer cache is shared by the session's tests).
    own = {"GREETING": "the no-op test's own layers"}
    project = tiny_project(tmp_path, base_ref, build_args=own)
    env = cli_env(project, CONTAINER_HOST=podman_api.url)
    reg = registrymod.Registry({})
    try:
        buildmod.pin_images(project, reg, echo=lambda _: None)
    finally:
        reg.close()
    _rebuilt(env)
    _noop(env)

    files = [{"src": "greet.txt", "dest": "/opt/src/greet.txt"}, {"src": "extra.txt", "dest": "/opt/extra"}]
    tiny_image(project.root, base_ref, files=files, build_args=own)  # the definition: the Dockerfile
    (project.images / "tiny" / "extra.txt").write_text("one\n")
    _rebuilt(env)
    _noop(env)

    (project.images / "tiny" / "extra.txt").write_text("two\n")  # a context file
    _rebuilt(env)
    _noop(env)

    built = lockmod.read(project.lock_path).builds["tiny"]
    tag = (built.inputs_sha256 or "").removeprefix("sha256:")[:16]
    podman_api.cli("untag", f"{buildmod.LOCAL_REPO}/tiny:{tag}")  # the image gone from the engine
    assert "Using cache" in _rebuilt(env)
    _noop(env)

    # Another base digest (the lock's pin moved): the engine is asked to build FROM it.
    with lockmod.locked(project.lock_path) as lock:
        lock.images[base_ref] = lock.images[base_ref].model_copy(update={"digest": "sha256:" + "e" * 64})
    rc, said, heavy = _build(env)
    assert f"FROM {base_ref.rpartition(':')[0]}@sha256:{'e' * 64}" in said and heavy, said
    assert rc != 0  # no registry serves that digest: the engine tried, and said so


def test_the_minimum_api_version_is_docker_pys() -> None:
    assert enginemod.MINIMUM_API == docker.constants.MINIMUM_DOCKER_API_VERSION
