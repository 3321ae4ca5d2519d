"""Fixtures for fetch-model: one Hub stand-in server per session, a fresh checkout per test, goldens."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import huggingface_hub.constants
import pytest

from rigsmith import spec as specmod
from rigsmith.hub import HfHub, RetryPolicy
from rigsmith.project import Project
from tests.models.hubserver import HubServer, random_bytes

ROOT = Path(__file__).resolve().parents[2]
GOLDEN = ROOT / "tests" / "golden" / "models"
FAST = RetryPolicy(attempts=3, multiplier=0.05, max_wait=0.2, jitter=0.05)
MiB = 1 << 20


@pytest.fixture(scope="session")
def hub_server() -> Iterator[HubServer]:
    """A real threaded HTTP server on 127.0.0.1 speaking the Hub API huggingface_hub 2.4 uses."""
    with HubServer() as server:
        yield server


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


def tiny_files(seed: str, *, shards: int = 2, shard_size: int = 3 * MiB) -> dict[str, bytes]:
    """A small checkpoint laid out like a real one: config, tokenizer, index, safetensors shards."""
    files: dict[str, bytes] = {
        "config.json": json.dumps(
            {
                "architectures": ["Qwen3ForCausalLM"],
                "text_config": {"hidden_size": 64, "ple_embedding_dtype": "bfloat16"},
            },
            indent=2,
        ).encode()
        + b"\n",
        "generation_config.json": b'{"do_sample": true}\n',
        "tokenizer/tokenizer.json": json.dumps({"seed": seed}).encode(),
        "README.md": f"# {seed}\n".encode(),
    }
    weight_map = {}
    for i in range(1, shards + 1):
        name = f"model-{i:05d}-of-{shards:05d}.safetensors"
        files[name] = random_bytes(f"{seed}/{i}", shard_size + i * 4099)
        weight_map[f"layers.{i}.weight"] = name
    files["model.safetensors.index.json"] = json.dumps({"weight_map": weight_map}, indent=2).encode()
    return files


def digest(kind: str, data: bytes) -> str:
    if kind == "sha256":
        return hashlib.sha256(data).hexdigest()
    return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()


@pytest.fixture
def make_project(tmp_path: Path) -> Callable[..., tuple[Project, specmod.Deployment]]:
    """A checkout in tmp with one deployment derived from the seed 003 spec, model section overridden."""

    def make(name: str = "t", **model: Any) -> tuple[Project, specmod.Deployment]:
        root = tmp_path / "proj"
        (root / "deployments").mkdir(parents=True, exist_ok=True)
        data = specmod.to_data(specmod.load(ROOT / "deployments" / "flash-next-merlin-4x3090.yaml"))
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


def cli_env(hub: HubServer, project: Project, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("HF_", "HUGGING"))}
    env.update(
        HF_ENDPOINT=hub.url,
        HF_HOME=str(project.root / ".hf-home"),
        HF_HUB_DISABLE_TELEMETRY="1",
        HF_HUB_DISABLE_XET="1",
        RIGSMITH_ROOT=str(project.root),
        PYTHONPATH=os.pathsep.join([str(ROOT / "src"), str(ROOT)]),
    )
    env.update(extra)
    return env


def invoke_argv(*args: str) -> list[str]:
    """``invoke`` from this checkout's tasks/ (the worktree under test, not an installed copy)."""
    inv = shutil.which("invoke")
    assert inv, "invoke is not installed"
    return [sys.executable, inv, "-r", str(ROOT), *args]


def run_cli(hub: HubServer, project: Project, *args: str, **env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        invoke_argv(*args), env=cli_env(hub, project, **env), capture_output=True, text=True, timeout=300
    )
