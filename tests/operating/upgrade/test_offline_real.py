"""up --offline / unbundle --prove-offline on real podman: the generated run.sh started inside a network
namespace with only loopback, /health answered from inside it, an engine that reaches for the Hub named with
host:port, a missing local piece named before anything starts."""

from __future__ import annotations

import subprocess
from collections.abc import Callable, Iterator
from pathlib import Path

import httpx
import pytest

from tests.support import services
from tests.support.bundle import must
from tests.support.common import require, write_project
from tests.support.hubserver import HubServer
from tests.support.podman import Podman, import_tar
from tests.support.upgrade import Rig, fetched_rig, snapshot

pytestmark = pytest.mark.engine
UP = ("up", "--offline", "--memlock", "host")


@pytest.fixture
def make(
    tmp_path: Path, podman: Podman, hub_server: HubServer, serving_image: str, request: pytest.FixtureRequest
) -> Iterator[Callable[..., Rig]]:
    made: list[Rig] = []

    def make(image: str = serving_image, **files: bool) -> Rig:
        name = "off-" + request.node.name.removeprefix("test_")[:16].replace("_", "-").strip("-")
        hub_server.reset()
        files_ = snapshot(f"acme/{name}", "model-v1", 200.0, **files)
        rig = fetched_rig(tmp_path, podman, hub_server, name, files_, image=image)
        made.append(rig)
        return rig

    yield make
    for r in made:
        podman.run("rm", "--force", "--time", "0", r.name, check=False)
        if Path(f"/run/netns/rigsmith-{r.name}").exists():
            subprocess.run(["ip", "netns", "delete", f"rigsmith-{r.name}"], check=False)


def _netns_of(podman: Podman, name: str) -> int:
    pid = podman.run("inspect", "--format", "{{.State.Pid}}", name).stdout.strip()
    return Path(f"/proc/{pid}/ns/net").stat().st_ino


def test_up_offline_answers_health_from_inside_a_namespace_with_no_route_out(
    make: Callable[..., Rig], podman: Podman
) -> None:
    rig = make()
    out = rig.cli(*UP)
    assert out.returncode == 0, out.stdout + out.stderr
    assert (
        f"{rig.name} answered http://127.0.0.1:{rig.port}/health from inside network namespace" in out.stdout
    )
    assert "no connection attempt out was seen" in out.stdout
    ns = Path(f"/run/netns/rigsmith-{rig.name}")
    assert _netns_of(podman, rig.name) == ns.stat().st_ino  # the engine runs in that namespace …
    with pytest.raises(httpx.ConnectError):  # … so this host's network does not reach it
        httpx.get(f"http://127.0.0.1:{rig.port}/health", timeout=5)
    down = must(rig.cli("down"))
    assert f"network namespace rigsmith-{rig.name} (from up --offline) removed" in down
    assert podman.run("container", "exists", rig.name, check=False).returncode == 1
    assert not ns.exists()


def test_prove_offline_names_the_hub_the_engine_tried_to_reach(
    make: Callable[..., Rig], podman: Podman
) -> None:
    rig = make(hub=True)
    out = rig.cli(*UP)
    assert out.returncode != 0
    err = out.stderr + out.stdout
    assert f"offline proof of {rig.name}: step 'engine startup' needed the network" in err
    assert "tried to reach huggingface.co:443" in err
    assert "it reached the Hugging Face Hub: set HF_HUB_OFFLINE=1 in the spec's env" in err
    assert "| OSError: We couldn't connect to 'https://huggingface.co'" in err  # the engine's own last words
    assert "Traceback" not in err
    assert podman.run("container", "exists", rig.name, check=False).returncode == 1  # stopped again
    assert not Path(f"/run/netns/rigsmith-{rig.name}").exists()


def test_a_lookup_that_never_connects_is_said_but_does_not_fail_the_proof(
    make: Callable[..., Rig], podman: Podman
) -> None:
    rig = make(lookup=True)
    out = rig.cli(*UP)
    assert out.returncode == 0, out.stdout + out.stderr
    assert "no connection attempt out was seen (looked up, never connected to: huggingface.co)" in out.stdout
    must(rig.cli("down"))


def test_a_missing_local_piece_is_named_before_anything_starts(
    make: Callable[..., Rig], podman: Podman
) -> None:
    rig = make()
    model_dir = Path(rig.project.load(rig.name).model.local_dir)
    (model_dir / "standin-rate").unlink()
    out = rig.cli(*UP)
    assert out.returncode != 0
    err = out.stderr + out.stdout
    assert f"up --offline {rig.name}: step 'local pieces': 1 piece(s)" in err
    assert "standin-rate: missing" in err and f"invoke fetch-model --deployment {rig.name}" in err
    assert "invoke unbundle DIR" in err
    assert podman.run("container", "exists", rig.name, check=False).returncode == 1
    assert not Path(f"/run/netns/rigsmith-{rig.name}").exists()


def test_unbundle_prove_offline_starts_the_bundle_with_no_route_out_and_stops_it(
    make: Callable[..., Rig], podman: Podman, serving_image: str, tmp_path: Path
) -> None:
    require("docker-registry")
    require("skopeo")
    with services.registry(tmp_path / "registry") as reg:  # a bundle carries an image pinned by digest
        ref = f"{reg.host}/serving-standin:1"
        podman.run("tag", serving_image, ref)
        podman.run("push", "--tls-verify=false", ref)
        rig = make(image=ref)
        must(rig.cli("bundle", "--out", str(tmp_path / "bundle")))
    there = write_project(tmp_path / "offline-rig")
    other = Rig(there, podman, rig.hub, rig.repo, rig.port, rig.name)
    out = other.cli("unbundle", str(tmp_path / "bundle"), "--prove-offline", "--memlock", "host", "--yes")
    assert out.returncode == 0, out.stdout + out.stderr
    assert f"unbundled {rig.name}" in out.stdout
    assert f"offline proof: {rig.name} answered" in out.stdout
    assert f"stopped again; `invoke up --deployment {rig.name}` starts it for use" in out.stdout
    assert podman.run("container", "exists", rig.name, check=False).returncode == 1


def test_a_missing_image_is_named_with_the_command_that_brings_it(
    make: Callable[..., Rig], podman: Podman, tmp_path: Path
) -> None:
    root = tmp_path / "one-file"
    (root / "etc").mkdir(parents=True)
    (root / "etc/offline-test").write_text(tmp_path.name)  # an image of its own, removed below
    tar = subprocess.run(["tar", "-C", str(root), "-c", "."], capture_output=True, check=True).stdout
    ref = import_tar(podman, tar, "localhost/rigsmith-offline-gone:1")
    rig = make(image=ref)
    podman.run("rmi", "--force", ref)
    out = rig.cli(*UP)
    assert out.returncode != 0
    err = out.stderr + out.stdout
    assert "step 'local pieces': 1 piece(s)" in err
    assert (
        "localhost/rigsmith-offline-gone" in err and "not in local storage (podman run would pull it)" in err
    )
    assert "invoke build" in err
    assert not Path(f"/run/netns/rigsmith-{rig.name}").exists()


def test_offline_refuses_what_it_cannot_prove_and_a_deployment_already_running(
    make: Callable[..., Rig], podman: Podman
) -> None:
    rig = make()
    quadlet = rig.cli("up", "--offline", "--target", "quadlet")
    assert (
        quadlet.returncode != 0 and "--target quadlet: the service manager starts the unit" in quadlet.stderr
    )
    image = rig.cli("up", "--offline", "--image", "localhost/other:1")
    assert image.returncode != 0 and "it does not take --image" in image.stderr
    must(rig.cli("up", "--memlock", "host"))
    running = rig.cli(*UP)
    assert running.returncode != 0
    assert "it is already running (with this host's network)" in running.stderr
    assert f"invoke down --deployment {rig.name}" in running.stderr
    assert rig.serving() == "model-v1"  # left as it was
