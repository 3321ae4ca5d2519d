"""The recipe site and the CLI of the journeys: a static server for examples/recipes/ on 127.0.0.1, and
`invoke` run in a separate process against a checkout."""

from __future__ import annotations

import contextlib
import functools
import threading
from collections.abc import Iterator, Mapping
from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

from tests.support.common import REPO
from tests.support.podman import Podman

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
