"""Helpers for the bundle tests: the connected side's facts, `invoke` on isolated podman, fresh checkouts."""

from __future__ import annotations

import os
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rigsmith.project import Project
from tests.support.hubserver import random_bytes
from tests.support.models import MiB, tiny_files
from tests.support.ops import free_port
from tests.support.podman import Podman

REPO = Path(__file__).resolve().parents[2]
NAME = "airgap"
MODEL_REPO = "acme/airgapped"
BIG = "model-00003-of-00003.safetensors"


@dataclass(frozen=True)
class Source:
    """The connected machine after `invoke bundle`: project, bundle and what the lock pins."""

    base: Path
    project: Project
    bundle: Path
    data: dict[str, Any]
    files: dict[str, bytes]
    image_ref: str  # REGISTRY/NAME:1 as the spec writes it
    digest: str  # the registry digest the lock holds
    bundle_stdout: str

    @property
    def model_dir(self) -> Path:
        return Path(self.data["model"]["local_dir"])

    @property
    def pinned(self) -> str:
        return f"{self.image_ref.rsplit(':', 1)[0]}@{self.digest}"


def cli_env(project: Project, podman: Podman, **extra: str) -> dict[str, str]:
    """`invoke` acting on ``project`` with ``podman``'s storage first on PATH; no Hub unless given."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("HF_", "HUGGING", "DOCKER_"))}
    env.update(
        HF_HOME=str(project.root / ".hf-home"),
        HF_HUB_DISABLE_TELEMETRY="1",
        HF_HUB_DISABLE_XET="1",
        # A closed port: an offline step that reached for the Hub would fail loudly, not quietly succeed.
        HF_ENDPOINT=f"http://127.0.0.1:{free_port()}",
        RIGSMITH_ROOT=str(project.root),
        PYTHONPATH=os.pathsep.join([str(REPO / "src"), str(REPO)]),
        PATH=f"{podman.bin}:{os.environ['PATH']}",
        CONTAINERS_CONF=str(podman.conf),
    )
    env.update(extra)
    return env


def invoke(project: Project, podman: Podman, *args: str, **env: str) -> subprocess.CompletedProcess[str]:
    inv = shutil.which("invoke")
    assert inv, "invoke is not installed"
    return subprocess.run(
        [inv, "-r", str(REPO), *args],
        env=cli_env(project, podman, **env),
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )


def must(proc: subprocess.CompletedProcess[str]) -> str:
    assert proc.returncode == 0, f"{proc.args} failed ({proc.returncode}):\n{proc.stdout}\n{proc.stderr}"
    return proc.stdout


def model_files() -> dict[str, bytes]:
    files = tiny_files(MODEL_REPO, shards=2, shard_size=2 * MiB)
    files[BIG] = random_bytes("big", 24 * MiB + 7)  # the file the kill -9 test interrupts
    return files


def offline_project(base: Path) -> Project:
    """A fresh, empty checkout on the offline machine."""
    root = base / "offline-project"
    (root / "deployments").mkdir(parents=True)
    return Project(root)


def built_project(source: Source, root: Path, build: str) -> Project:
    """A copy of the connected checkout whose deployment builds ``images/<build>`` instead of pulling."""
    import yaml

    project = Project(root)
    shutil.copytree(source.project.root / "deployments", project.deployments)
    data = yaml.safe_load(project.spec_path(NAME).read_text())
    data["engine"].pop("image")
    data["engine"]["build"] = build
    project.spec_path(NAME).write_text(yaml.safe_dump(data, sort_keys=False))
    return project
