"""Fixtures of the resolving area.

Images: session-wide real services for the image-build tests (registry, Podman API service, private
dockerd); a missing binary fails the test run (never a skip): these are the engines `invoke build` exists
for. Models: the Hub stand-in (the root's hub_server) pointed at per test, a fresh checkout per test, goldens.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import docker  # type: ignore[import-untyped]
import pytest

from tests.support import services
from tests.support.common import golden_path, require
from tests.support.models import GOLDEN


@pytest.fixture(scope="session")
def registry(tmp_path_factory: pytest.TempPathFactory) -> Iterator[services.LocalRegistry]:
    """docker-registry on 127.0.0.1:<free port>, no auth."""
    require("docker-registry")
    with services.registry(tmp_path_factory.mktemp("registry")) as reg:
        yield reg


@pytest.fixture(scope="session")
def podman_api(
    tmp_path_factory: pytest.TempPathFactory, registry: services.LocalRegistry
) -> Iterator[services.PodmanService]:
    """Podman's API service over private storage (runc, cgroupfs, test ulimits; the registry insecure)."""
    require("podman")
    require("runc")
    with services.podman_service(tmp_path_factory.mktemp("podman-api"), [registry.host]) as svc:
        yield svc


@pytest.fixture(scope="session")
def dockerd(tmp_path_factory: pytest.TempPathFactory) -> Iterator[services.Dockerd]:
    """A private dockerd (127.0.0.0/8 registries are insecure by default there)."""
    require("dockerd")
    require("containerd")
    with services.dockerd(tmp_path_factory.mktemp("dockerd")) as d:
        yield d


@pytest.fixture(scope="session")
def base_ref(
    podman_api: services.PodmanService,
    registry: services.LocalRegistry,
    tmp_path_factory: pytest.TempPathFactory,
) -> str:
    """A busybox base pushed to the registry: REGISTRY/tinybase:1."""
    require("skopeo")
    if not Path("/bin/busybox").exists():
        pytest.fail("busybox-static is not installed; run `bash .ci/run` first", pytrace=False)
    return services.push_base(podman_api, registry, tmp_path_factory.mktemp("base"))


@pytest.fixture(scope="session")
def docker_client(dockerd: services.Dockerd) -> Iterator[docker.DockerClient]:
    client = docker.DockerClient(base_url=dockerd.url, version="auto")
    yield client
    client.close()


@pytest.fixture
def golden(request: pytest.FixtureRequest) -> Callable[[str, str], None]:
    """``golden(name, text)``: compare with tests/golden/models/<name>, or rewrite it with --update-golden."""
    update = bool(request.config.getoption("--update-golden"))

    def check(name: str, text: str) -> None:
        path = golden_path(GOLDEN / name)
        if update:
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(text, encoding="utf-8")
            return
        assert path.is_file(), f"missing golden file {path}; run pytest --update-golden and review the diff"
        assert text == path.read_text(encoding="utf-8")

    return check
