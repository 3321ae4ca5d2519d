"""Fixtures for fetch-model: one Hub stand-in server per session, a fresh checkout per test, goldens."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import huggingface_hub.constants
import pytest

from rigsmith import spec as specmod
from rigsmith.project import Project
from rigsmith.resolving.hub import HfHub
from tests.support.common import REPO
from tests.support.hubserver import HubServer
from tests.support.models import FAST, GOLDEN


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
