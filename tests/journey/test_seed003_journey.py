"""Seed 003 as a user lives it, through the real CLI in separate processes:

recipe URL → import-recipe → (deploy refuses the placeholders) → the user fills them → pin → fetch-model
(verified, config patched) → deploy → up (devices and env verified) → wait (recipe gates) → bench →
down. Real podman with the fake CDI vendor, the Hub stand-in and a streaming OpenAI stand-in, all on
127.0.0.1. Only the GPUs and the weights are stand-ins.
"""

from __future__ import annotations

import json
import os
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from rigsmith import spec as specmod
from rigsmith.resolving.lock import lock as lockmod
from tests.support.common import FAKE_VENDOR, invoke_cli
from tests.support.hubserver import HubServer
from tests.support.journey import recipe_site
from tests.support.models import tiny_files
from tests.support.ops import OPS_IMAGE, free_port
from tests.support.podman import Podman
from tests.support.standin import Standin, StandinConfig

RECIPE = "qwen3-8-flash-next-w4a16-merlin-on-4x-rtx-3090-tp2xpp2-ep-mtp3-f.json"
HUB_REPO = "halt95/Qwen3.8-Flash-Next-W4A16-Merlin"


@pytest.fixture
def recipe_url() -> Iterator[str]:
    with recipe_site(RECIPE) as url:
        yield url


def _cli(root: Path, env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return invoke_cli(root, *args, env=env, timeout=600)


def test_seed_003_from_recipe_url_to_a_qualified_deployment_and_back(
    tmp_path: Path, recipe_url: str, hub_server: HubServer, podman: Podman, fake_cdi: Path, ops_image: str
) -> None:
    root = tmp_path / "rig"
    (root / "deployments").mkdir(parents=True)
    hub_server.reset()
    env = {k: v for k, v in podman.env.items() if not k.startswith(("HF_", "HUGGING"))}
    env.update(
        HF_ENDPOINT=hub_server.url,
        HF_HOME=str(tmp_path / "hf"),
        HF_HUB_DISABLE_TELEMETRY="1",
        HF_HUB_DISABLE_XET="1",
    )

    # 1. import: the recipe names no image, so the user gives one
    imp = _cli(root, env, "import-recipe", recipe_url, "--name", "merlin", "--image", OPS_IMAGE)
    assert imp.returncode == 0, imp.stderr
    spec_path = root / "deployments" / "merlin.yaml"
    spec = specmod.load(spec_path)
    assert spec.provenance and spec.provenance.source == recipe_url
    assert spec.engine.image == OPS_IMAGE and spec.readiness.kv_cache_tokens == 924993

    # 2. deploy refuses until the placeholders are filled, naming each
    refused = _cli(root, env, "deploy", "--target", "podman")
    assert refused.returncode == 1
    assert "'<repo>' has no value" in refused.stderr and "'<vllm tree>' has no value" in refused.stderr
    assert not (root / "podman").exists()

    # 3. the user applies the recipe to this rig: paths, GPUs (fake CDI vendor here), a free port
    port = free_port()
    data = yaml.safe_load(spec_path.read_text())
    data["placeholders"] = {"<repo>": "/opt/merlin", "<vllm tree>": "/opt/merlin/vllm-v2.5"}
    data["model"]["local_dir"] = str(tmp_path / "models" / "Flash-Next-Merlin")
    data["mounts"] = [{"host": str(tmp_path / "merlin"), "container": "/opt/merlin"}]
    data["resources"]["gpus"]["cdi_devices"] = [f"{FAKE_VENDOR}={i}" for i in range(4)]
    data["network"] = {"host": "127.0.0.1", "port": port}
    spec_path.write_text(specmod.dump(specmod.from_data(data)))
    (tmp_path / "merlin").mkdir()

    # 4. pin the floating model revision, then fetch, verify and patch
    files = tiny_files(HUB_REPO, shards=1)
    files["config.json"] = json.dumps(
        {"architectures": ["Qwen3NextForCausalLM"], "text_config": {"hidden_size": 64}}
    ).encode()
    commit = hub_server.repo(HUB_REPO).add_commit(files)
    pin = _cli(root, env, "pin")
    assert pin.returncode == 0, pin.stderr
    assert lockmod.read(root / "rigsmith.lock").models["merlin"].commit == commit
    fetch = _cli(root, env, "fetch-model")
    assert fetch.returncode == 0, fetch.stderr
    cfg = json.loads((tmp_path / "models/Flash-Next-Merlin/config.json").read_text())
    assert cfg["text_config"] == {"hidden_size": 64, "ple_embedding_dtype": "float8_e4m3fn"}
    assert lockmod.read(root / "rigsmith.lock").models["merlin"].patches[0].file == "config.json"

    # 5. render; doctor: everything the artifacts need from this host is GO (no GPUs or memlock here)
    dep = _cli(root, env, "deploy", "--target", "podman", "--memlock", "host")
    assert dep.returncode == 0, dep.stderr
    doc = _cli(root, {**env, "COLUMNS": "400"}, "doctor", "--verify")
    rows = {
        cells[0]: cells[1]
        for line in doc.stdout.splitlines()
        if len(cells := [c.strip() for c in line.strip("│ ").split("│")]) > 2 and cells[0]
    }
    for row in (
        "CDI devices",
        "shm",
        "podman",
        "init binary",
        "OCI runtime",
        "conmon",
        "image",
        "model files",
    ):
        assert rows.get(row) == "go", f"{row}: {rows.get(row)}\n{doc.stdout}"
    assert rows["GPUs"] == "no-go" and doc.returncode == 1  # no NVIDIA driver on this machine

    # 6. start, verify, wait on the recipe's gates, qualify, stop
    try:
        up = _cli(root, env, "up", "--memlock", "host")
        assert up.returncode == 0, up.stderr
        assert "verified merlin: running; 4 CDI device(s)" in up.stdout
        with Standin(StandinConfig(model_names=("flash-next-v2",), rate=120.0, ttft=0.01), port=port):
            wait = _cli(root, env, "wait")
            assert wait.returncode == 0, wait.stderr
            assert "GPU KV cache 924,993 tokens" in wait.stdout
            seen = [json.loads(r) for r in (root / ".rigsmith/observed.jsonl").read_text().splitlines()]
            assert seen[-1]["kv_cache_tokens"] == 924_993 and seen[-1]["deployment"] == "merlin"
            bench = _cli(root, env, "bench", "--max-tokens", "30", "--prompt-words", "10")
            assert bench.returncode == 0, bench.stderr
        rows = [json.loads(r) for r in (root / ".rigsmith/bench.jsonl").read_text().splitlines()]
        assert rows and rows[-1]["deployment"] == "merlin"
        one = rows[-1]["runs"][0]
        assert one["streams"] == 1 and one["aggregate_decode_tps"] == pytest.approx(120.0, rel=0.1)
        down = _cli(root, env, "down")
        assert down.returncode == 0, down.stderr
        assert podman.run("container", "exists", "merlin", check=False).returncode == 1
    finally:
        podman.run("rm", "--force", "--time", "0", "merlin", check=False)
    assert os.environ.get("HF_ENDPOINT") != hub_server.url  # the test process itself stayed untouched
