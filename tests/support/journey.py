"""The recipe site and the CLI of the journeys: a static server for examples/recipes/ on 127.0.0.1, and
`invoke` run in a separate process against a checkout."""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import threading
from collections.abc import Iterator, Mapping
from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import yaml

from tests.support import services
from tests.support.common import REPO
from tests.support.podman import Podman
from tests.support.sources import AssetServer, Upstream, asset_server, git_daemon, serve_release

SEED_003 = "qwen3-8-flash-next-w4a16-merlin-on-4x-rtx-3090-tp2xpp2-ep-mtp3-f.json"


class _Quiet(SimpleHTTPRequestHandler):
    def log_message(self, format: str, *args: object) -> None:
        pass


@contextlib.contextmanager
def recipe_site(recipe: str = SEED_003) -> Iterator[str]:
    """examples/recipes/ over HTTP on 127.0.0.1; yields the recipe's URL."""
    handler = functools.partial(_Quiet, directory=str(REPO / "examples" / "recipes"))
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/{recipe}"
    finally:
        server.shutdown()
        server.server_close()


def build_env(podman_env: Mapping[str, str], base: Path, hub_url: str) -> dict[str, str]:
    """The environment of a journey that pins and builds: ``podman_env``'s podman, the Hub stand-in at
    ``hub_url``, the source cache under ``base`` and no user registry credentials (an empty docker config)."""
    (base / "docker-config").mkdir(exist_ok=True)
    (base / "docker-config" / "config.json").write_text("{}")
    env = {k: v for k, v in podman_env.items() if not k.startswith(("HF_", "HUGGING", "DOCKER_HOST"))}
    env.update(
        HF_ENDPOINT=hub_url,
        HF_HOME=str(base / "hf"),
        HF_HUB_DISABLE_TELEMETRY="1",
        HF_HUB_DISABLE_XET="1",
        RIGSMITH_CACHE=str(base / "cache"),
        DOCKER_CONFIG=str(base / "docker-config"),
    )
    return env


def standin_base(podman: Podman, registry: str, image: str) -> str:
    """The base a source tree runs on in a journey: the stand-in engine ``image``, pushed to ``registry``."""
    ref = f"{registry}/vllm-standin:1"
    podman.run("tag", image, ref)
    podman.run("push", "--tls-verify=false", ref)
    return ref


@dataclasses.dataclass(frozen=True)
class BuildServices:
    """What a journey that builds from the recipe's source tree talks to, all on 127.0.0.1."""

    upstream: Upstream  # the recipe's repository behind git daemon
    assets: AssetServer  # its release assets
    registry: str  # host:port of the registry the base image is pulled from
    api: str  # CONTAINER_HOST of a Podman API on the journey's storage (for `invoke build` only)
    base: str  # the base the tree runs on: the stand-in engine image, pushed to the registry


@contextlib.contextmanager
def build_services(tmp_path: Path, podman: Podman, image: str) -> Iterator[BuildServices]:
    """The git daemon, asset server, registry and Podman API a source build needs, the stand-in engine
    ``image`` pushed as the base."""
    with (
        git_daemon(tmp_path / "git") as upstream,
        asset_server() as assets,
        services.registry(tmp_path / "registry") as reg,
        services.podman_api_on(podman, reg.host, tmp_path) as api,
    ):
        yield BuildServices(upstream, assets, reg.host, api, standin_base(podman, reg.host, image))


def fill_image(image_path: Path, svc: BuildServices, *, drop_commit: bool = True) -> dict[str, Any]:
    """What a user fills in a proposed image.yaml on this machine: a base it can pull, the repository and
    the release assets' URLs; ``drop_commit``: also drop the commit the recipe names (not this test
    repository's, and pin says so). Returns the image definition as written."""
    image = yaml.safe_load(image_path.read_text())
    image["base"] = {"name": svc.base.rsplit(":", 1)[0], "tag": "1"}
    image["tree"]["repo"] = svc.upstream.url
    urls = serve_release(svc.assets)
    for a in image["tree"]["assets"]:
        a["url"] = urls[a["name"]]
    if drop_commit:
        image["tree"].pop("commit")
    image_path.write_text(yaml.safe_dump(image, sort_keys=False))
    return dict(image)
