"""Shared fixtures and hooks: real podman in isolated storage, the fake CDI GPU vendor, the stand-in images,
the Hub stand-in server. Helpers live in tests/support/.

Settings that only this machine needs (runc, cgroupfs, nofile limits, memlock override) live here, never in
what rigsmith generates. See shared/ENVIRONMENT.md.

The suite never sees the real user's home: before anything is imported, ``tests.support.sandbox.isolate``
points ``$HOME`` (what rigsmith's home rule, :func:`rigsmith.userhome.invoking_home`, reads; also
``Path.home`` and ``expanduser``) and the XDG directories at a fresh home under the suite's temp root,
``TMPDIR`` at a short temp dir of its own, and drops ``SUDO_USER``. See docs/testing.md.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from tests.support import sandbox

# Before huggingface_hub and rigsmith are imported (huggingface_hub reads HOME and XDG_CACHE_HOME at import).
_SANDBOX_MADE = sandbox.isolate(sandbox.temp_root(Path(__file__).resolve().parents[1]))

import huggingface_hub.constants  # noqa: E402
import pytest  # noqa: E402

from rigsmith import spec as specmod  # noqa: E402
from rigsmith.project import Project  # noqa: E402
from rigsmith.resolving.model.hub import HfHub  # noqa: E402
from tests.support.common import REPO, STANDIN_IMAGE, make_seed_project, require  # noqa: E402
from tests.support.hubserver import HubServer  # noqa: E402
from tests.support.models import FAST  # noqa: E402
from tests.support.ops import ENGINE, OPS_IMAGE  # noqa: E402
from tests.support.podman import (  # noqa: E402
    FAKE_CDI_SPEC,
    RECORDER,
    RECORDER_TOOLS,
    Podman,
    containers_conf,
    import_busybox_image,
    unmount_under,
)

#: Fixtures that start or build something real: a container engine (podman, dockerd) or an image in it, a
#: registry, liblxc, the systemd guest, network namespaces, the Hub stand-in server. A test that uses one,
#: directly or through another fixture, is marked ``engine``: ``pytest -m "not engine"`` is the inner loop
#: (docs/testing.md). A test that starts an engine without a fixture says ``pytest.mark.engine`` itself.
ENGINE_FIXTURES = frozenset(
    {
        # podman, its images and the projects made with them (conftest files under tests/)
        "podman", "standin_image", "ops_image", "serving_image", "listener_image", "source", "offline_podman",
        # dockerd, the registry, the podman API service (tests/resolving/conftest.py)
        "dockerd", "docker_client", "registry", "podman_api", "base_ref",
        # liblxc, the systemd guest (tests/rendering/conftest.py)
        "busybox_rootfs", "systemd_guest", "units",
        # network namespaces, Ray and the ssh cluster (tests/operating, tests/rendering)
        "nodes", "netns", "ns", "pair", "machine", "ray_tmp",
        # the Hub stand-in server (tests/conftest.py)
        "hub_server",
    }
)  # fmt: skip


#: Fixtures whose tests share state beyond their worker (xdist, ``--dist loadgroup``), so each set runs on one
#: worker, one test at a time: the namespace clusters (/tmp/ray as every node's mount point, Ray processes
#: counted machine-wide by address) and the systemd guest (one boot serves every test that uses it).
SHARED_GROUPS = {
    "netns-cluster": frozenset({"nodes", "netns", "pair", "ray_tmp"}),
    "systemd-guest": frozenset({"systemd_guest"}),
}


def _xdist_group(item: pytest.Item) -> str | None:
    """The group a test runs in: a shared set above, else its module when it uses a module- or class-scoped
    fixture (built once per module on the worker that runs them all)."""
    names = set(getattr(item, "fixturenames", ()))
    for group, fixtures in SHARED_GROUPS.items():
        if names & fixtures:
            return group
    info = getattr(item, "_fixtureinfo", None)
    defs = info.name2fixturedefs.values() if info is not None else ()
    if any(d.scope in ("module", "class", "package") for chain in defs for d in chain):
        return item.nodeid.split("::", 1)[0]
    return None


@pytest.hookimpl(tryfirst=True)  # before the mark plugin's -m selection and xdist's loadgroup read the marks
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        if ENGINE_FIXTURES.intersection(getattr(item, "fixturenames", ())):
            item.add_marker(pytest.mark.engine)
        if item.get_closest_marker("xdist_group") is None and (group := _xdist_group(item)) is not None:
            item.add_marker(pytest.mark.xdist_group(group))


def pytest_unconfigure(config: pytest.Config) -> None:
    for made in _SANDBOX_MADE:  # in the process that made them (the xdist controller, or the only one)
        shutil.rmtree(made, ignore_errors=True)


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--update-golden", action="store_true", help="rewrite tests/golden/ from the current output"
    )


@pytest.fixture
def update_golden(request: pytest.FixtureRequest) -> bool:
    return bool(request.config.getoption("--update-golden"))


@pytest.fixture
def seed_project(tmp_path: Path) -> Project:
    """The shipped deployments with a locked build (see make_seed_project)."""
    return make_seed_project(tmp_path)


@pytest.fixture(scope="session")
def podman(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Podman]:
    """Real podman with its own storage (session-wide), and a `podman` wrapper on a PATH prefix."""
    require("podman")
    require("runc")
    base = tmp_path_factory.mktemp("podman")
    # podman refuses a runroot longer than 50 characters
    runroot = Path(tempfile.mkdtemp(prefix="rsrr-", dir="/tmp"))
    p = Podman(base / "root", runroot, base / "containers.conf", base / "bin")
    # Own libpod tmp dir: the default /run/libpod (its "alive" file) is shared by every podman on the machine,
    # and a concurrent session resetting it makes this one "refresh" its containers mid-test.
    p.conf.write_text(containers_conf(runroot))
    p.bin.mkdir()
    wrapper = p.bin / "podman"
    wrapper.write_text(
        "#!/bin/sh\n"
        f"CONTAINERS_CONF={p.conf}; export CONTAINERS_CONF\n"
        f'exec /usr/bin/podman --root {p.root} --runroot {p.runroot} "$@"\n'
    )
    wrapper.chmod(0o755)
    yield p
    subprocess.run(
        p.argv("rm", "--all", "--force", "--time", "0"),
        capture_output=True,
        check=False,
        env={**os.environ, "CONTAINERS_CONF": str(p.conf)},
    )
    subprocess.run(
        p.argv("system", "reset", "--force"),
        capture_output=True,
        check=False,
        env={**os.environ, "CONTAINERS_CONF": str(p.conf)},
    )
    unmount_under(base)
    unmount_under(runroot)
    shutil.rmtree(runroot, ignore_errors=True)


@pytest.fixture(scope="session")
def fake_cdi() -> Iterator[Path]:
    """A fake CDI vendor spec in /etc/cdi (podman < 5.5 reads only the default dirs).

    Left in place after the run: concurrent test sessions (several checkouts) share it, and a second file
    defining the same devices would make podman's CDI registry refuse both. Vendor example.com is inert.
    """
    path = Path("/etc/cdi/rigsmith-test-example-gpu.json")
    text = json.dumps(FAKE_CDI_SPEC, indent=1)
    if not path.exists() or path.read_text() != text:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(f".{os.getpid()}.tmp")
        tmp.write_text(text)
        tmp.replace(path)
    yield path


@pytest.fixture(scope="session")
def standin_image(podman: Podman, tmp_path_factory: pytest.TempPathFactory) -> str:
    """A busybox image whose `vllm` records what it was given (imported; nothing is pulled)."""
    return import_busybox_image(
        podman, tmp_path_factory.mktemp("standin-rootfs"), STANDIN_IMAGE, RECORDER_TOOLS, RECORDER
    )


@pytest.fixture(scope="session")
def hub_server() -> Iterator[HubServer]:
    """A real threaded HTTP server on 127.0.0.1 speaking the Hub API huggingface_hub 2.4 uses."""
    with HubServer() as server:
        yield server


@pytest.fixture(scope="session")
def ops_image(podman: Podman, tmp_path_factory: pytest.TempPathFactory) -> str:
    """A busybox image whose `vllm` logs like vLLM's startup (imported; nothing is pulled)."""
    root = tmp_path_factory.mktemp("ops-rootfs")
    return import_busybox_image(podman, root, OPS_IMAGE, ("sh", "sleep", "echo"), ENGINE)


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
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_DISABLE_XET", True)  # likewise: read at import
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
