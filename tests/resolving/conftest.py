"""Fixtures of the resolving area.

Images: session-wide real services for the image-build tests (registry, Podman API service, private
dockerd); a missing binary fails the test run (never a skip): these are the engines `invoke build` exists
for. Models: the Hub stand-in (the root's hub_server) pointed at per test, a fresh checkout per test, goldens.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import docker  # type: ignore[import-untyped]
import huggingface_hub.constants
import pytest

from rigsmith import spec as specmod
from rigsmith.project import Project
from rigsmith.resolving.hub import HfHub
from tests.support import services
from tests.support.common import REPO, require
from tests.support.hubserver import HubServer
from tests.support.models import FAST, GOLDEN


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
def hub(hub_server: HubServer, monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Iterator[HubServer]:
    """The session server, counters and faults reset, and this process pointed at it."""
    hub_server.reset()
    monkeypatch.setenv("HF_ENDPOINT", hub_server.url)
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf-home"))
    monkeypatch.setenv("HF_HUB_DISABLE_TELEMETRY", "1")
    monkeypatch.setenv("HF_HUB_DISABLE_XET", "1")
    monkeypatch.delenv("HF_TOKEN", raising=False)
    monkeypatch.delenv("HUGGING_FACE_HUB_TOKEN", raising=False)
    # huggingface_hub reads its env at import time; the telemetry ping would otherwise go to the real Hub.
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_DISABLE_TELEMETRY", True)
    yield hub_server
    hub_server.reset()


@pytest.fixture
def client(hub: HubServer) -> HfHub:
    """The real huggingface_hub-backed adapter, with short retry waits."""
    return HfHub.from_env(retry=FAST)


@pytest.fixture
def make_project(tmp_path: Path) -> Callable[..., tuple[Project, specmod.Deployment]]:
    """A checkout in tmp with one deployment derived from the seed 003 spec, model section overridden."""

    def make(name: str = "t", **model: Any) -> tuple[Project, specmod.Deployment]:
        root = tmp_path / "proj"
        (root / "deployments").mkdir(parents=True, exist_ok=True)
        data = specmod.to_data(specmod.load(REPO / "deployments" / "flash-next-merlin-4x3090.yaml"))
        data["name"] = name
        data["model"] = {"local_dir": str(tmp_path / "models" / name), "config_patches": [], **model}
        spec = specmod.from_data(data)
        (root / "deployments" / f"{name}.yaml").write_text(specmod.dump(spec), encoding="utf-8")
        return Project(root), spec

    return make


@pytest.fixture
def golden(request: pytest.FixtureRequest) -> Callable[[str, str], None]:
    """``golden(name, text)``: compare with tests/golden/models/<name>, or rewrite it with --update-golden."""
    update = bool(request.config.getoption("--update-golden"))

    def check(name: str, text: str) -> None:
        path = GOLDEN / name
        if update:
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(text, encoding="utf-8")
            return
        assert path.is_file(), f"missing golden file {path}; run pytest --update-golden and review the diff"
        assert text == path.read_text(encoding="utf-8")

    return check
