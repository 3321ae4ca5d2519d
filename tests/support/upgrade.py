"""The serving stand-in image for the upgrade tests, and a rig built on it with the Hub stand-in.

The image is busybox + the host's Python + rigsmith's OpenAI stand-in (tests/support/standin.py).
Its ``vllm`` reads how to behave from the model snapshot it is given (``vllm serve MODEL_DIR …``), so a
new Hub commit is all an upgrade test changes: ``standin-rate`` (tokens/s per stream), ``standin-name``
(the model id /v1/models answers: which snapshot is serving), ``standin-broken`` (the engine dies while
loading, as vLLM does: "Engine core initialization failed"), ``standin-hub`` (the engine first connects to
the Hub, huggingface.co:443, and dies when it cannot, as vLLM does without HF_HUB_OFFLINE),
``standin-lookup`` (the engine only looks the Hub's name up, then serves).
"""

from __future__ import annotations

import json
import shutil
import subprocess
import textwrap
from dataclasses import dataclass
from pathlib import Path

import httpx

from rigsmith.project import Project
from tests.support import services
from tests.support.bundle import invoke, must
from tests.support.common import REPO, prepare_host_dirs, write_project
from tests.support.hubserver import HubServer
from tests.support.models import tiny_files
from tests.support.ops import ops_data
from tests.support.podman import Podman, import_tar

UPGRADE_IMAGE = "localhost/rigsmith-serving-standin:1"
ENGINE = textwrap.dedent(
    """\
    #!/bin/sh
    model="$2"; port=8000; prev=""
    for a in "$@"; do [ "$prev" = "--port" ] && port="$a"; prev="$a"; done
    echo "INFO 09-20 10:00:00 [api_server.py:1880] vLLM API server version 0.0.0+standin"
    if [ -e "$model/standin-broken" ]; then
      echo "ERROR 09-20 10:00:05 [core.py:700] Engine core initialization failed. See root cause above."
      exit 1
    fi
    if [ -e "$model/standin-hub" ]; then
      python3 -c 'import socket; socket.create_connection(("huggingface.co", 443), 10)' 2>/dev/null \
        || { echo "OSError: We couldn't connect to 'https://huggingface.co' to load the files"; exit 1; }
    fi
    [ -e "$model/standin-lookup" ] && python3 -c 'import socket; socket.getaddrinfo("huggingface.co", 443)'
    exec python3 /opt/standin.py --port "$port" --rate "$(cat "$model/standin-rate")" --ttft 0.05 \\
      --model "$(cat "$model/standin-name")" --log /dev/stdout
    """
)
#: Tokens per bench request and prompt words: enough tokens that the decode rate is measured, not guessed.
BENCH = ("--max-tokens", "40", "--prompt-words", "10")


def build_image(podman: Podman, work: Path) -> str:
    """Import the serving stand-in image (once per session)."""
    root = services.python_rootfs(work / "rootfs")
    (root / "opt").mkdir(exist_ok=True)
    shutil.copy2(REPO / "tests/support/standin.py", root / "opt/standin.py")
    (root / "usr/local/bin").mkdir(parents=True, exist_ok=True)
    (root / "usr/local/bin/vllm").write_text(ENGINE)
    (root / "usr/local/bin/vllm").chmod(0o755)
    tar = subprocess.run(["tar", "-C", str(root), "-c", "."], capture_output=True, check=True).stdout
    return import_tar(podman, tar, UPGRADE_IMAGE, "ENV=PATH=/usr/local/bin:/usr/bin:/bin")


def snapshot(
    repo: str, name: str, rate: float, *, broken: bool = False, hub: bool = False, lookup: bool = False
) -> dict[str, bytes]:
    """A small checkpoint whose stand-in serves as ``name`` at ``rate`` tokens/s (or dies loading, or
    reaches for the Hub first)."""
    files = tiny_files(repo, shards=1, shard_size=256 * 1024)
    files["standin-rate"] = f"{rate}\n".encode()
    files["standin-name"] = f"{name}\n".encode()
    if broken:
        files["standin-broken"] = b"1\n"
    if hub:
        files["standin-hub"] = b"1\n"
    if lookup:
        files["standin-lookup"] = b"1\n"
    return files


@dataclass
class Rig:
    """A checkout serving ``repo`` from the Hub stand-in through real podman."""

    project: Project
    podman: Podman
    hub: HubServer
    repo: str
    port: int
    name: str

    def cli(self, *args: str) -> subprocess.CompletedProcess[str]:
        return invoke(self.project, self.podman, *args, HF_ENDPOINT=self.hub.url)

    def serving(self) -> str:
        """The model id the running deployment answers with (which snapshot it serves)."""
        r = httpx.get(f"http://127.0.0.1:{self.port}/v1/models", timeout=10)
        r.raise_for_status()
        return str(r.json()["data"][0]["id"])

    def bench_rows(self) -> list[dict[str, object]]:
        path = self.project.root / ".rigsmith/bench.jsonl"
        return [json.loads(ln) for ln in path.read_text().splitlines()] if path.exists() else []


def fetched_rig(
    base: Path,
    podman: Podman,
    hub: HubServer,
    name: str,
    files: dict[str, bytes] | None = None,
    image: str = UPGRADE_IMAGE,
    **model: object,
) -> Rig:
    """pin → fetch-model of ``files`` (default: snapshot v1, 200 tok/s) run by ``image``; nothing started."""
    repo = f"acme/{name}"
    hub.repo(repo).add_commit(files or snapshot(repo, "model-v1", 200.0))
    data = ops_data(base, name)
    data["engine"]["image"] = image
    args = data["engine"]["args"]  # type: ignore[index]
    args[args.index("--port") + 1] = str(data["network"]["port"])  # type: ignore[index]  # the engine's own
    data["model"] = {**data["model"], "repo": repo, **model}  # type: ignore[dict-item]
    prepare_host_dirs(data)
    rig = Rig(write_project(base, data), podman, hub, repo, int(data["network"]["port"]), name)  # type: ignore[index]
    for step in (("pin",), ("fetch-model",)):
        must(rig.cli(*step))
    return rig


def make_rig(base: Path, podman: Podman, hub: HubServer, name: str, **model: object) -> Rig:
    """pin → fetch-model → up → wait → bench of snapshot v1 (200 tok/s), as a user brings a rig up."""
    rig = fetched_rig(base, podman, hub, name, **model)
    for step in (("up", "--memlock", "host"), ("wait",), ("bench", *BENCH)):
        must(rig.cli(*step))
    assert rig.serving() == "model-v1"
    return rig
