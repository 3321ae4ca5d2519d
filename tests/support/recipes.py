"""The recipe corpus, its expectations and a local recipe HTTP server."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from rigsmith import spec as specmod
from tests.support.common import REPO

HERE = REPO / "tests" / "importing"
#: The published commands: the project's shared corpus (40) plus 33 more (issue 13), each with its source.
CORPUS = HERE / "data" / "vllm-commands.json"
SEED_RECIPE = (
    REPO / "examples" / "recipes" / "qwen3-8-flash-next-w4a16-merlin-on-4x-rtx-3090-tp2xpp2-ep-mtp3-f.json"
)


EXPECTED = HERE / "corpus_expected.yaml"


def corpus() -> list[dict[str, Any]]:
    data: list[dict[str, Any]] = json.loads(CORPUS.read_text(encoding="utf-8"))
    return data


def refusal(text: str, source: str = "t") -> str:
    """The RecipeError message ``text`` is refused with, checked to hold no traceback."""
    import pytest

    from rigsmith.errors import RecipeError
    from rigsmith.importing import recipe

    with pytest.raises(RecipeError) as err:
        recipe.parse(text, source=source, sha256="0" * 64)
    message = str(err.value)
    assert "Traceback" not in message
    return message


def expected() -> dict[str, dict[str, Any]]:
    data: dict[str, dict[str, Any]] = yaml.safe_load(EXPECTED.read_text(encoding="utf-8"))
    return data


@dataclass
class Route:
    """A scripted response: a list of (status, body) served in turn (the last one repeats)."""

    responses: list[tuple[int, bytes]]
    delay: float = 0.0
    hits: int = 0
    declare_length: int | None = None


@dataclass
class RecipeServer:
    """A real ThreadingHTTPServer on 127.0.0.1 whose routes tests script."""

    base: str
    routes: dict[str, Route] = field(default_factory=dict)

    def route(
        self, path: str, *responses: tuple[int, bytes], delay: float = 0.0, declare_length: int | None = None
    ) -> str:
        self.routes[path] = Route(list(responses), delay, 0, declare_length)
        return self.base + path


def import_cli(root: Path, *args: str) -> subprocess.CompletedProcess[str]:
    """`invoke import-recipe ARGS` in a subprocess against the checkout at ``root`` (no terminal)."""
    return task_cli(root, "import-recipe", *args)


def task_cli(root: Path, *args: str, **env: str) -> subprocess.CompletedProcess[str]:
    """`invoke ARGS` in a subprocess against the checkout at ``root`` (no terminal), ``env`` added."""
    full = {**os.environ, "RIGSMITH_ROOT": str(root), "PYTHONPATH": f"{REPO / 'src'}:{REPO}", **env}
    return subprocess.run(
        [sys.executable, "-m", "invoke", *args],
        cwd=REPO,
        env=full,
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )


def filled_as_user(dep: specmod.Deployment) -> specmod.Deployment:
    """The imported spec as a user completes it: placeholders, relative host paths and an image filled."""
    mounts = tuple(
        m if m.host.startswith(("/", "~")) else m.model_copy(update={"host": f"/filled{m.container}"})
        for m in dep.mounts
    )
    local = dep.model.local_dir
    addresses = {n.address for n in dep.cluster.nodes} if dep.cluster else set()
    return dep.model_copy(
        update={
            # A node's address gets a host name (it is checked as one once filled); the rest a path.
            "placeholders": {
                t: f"node{i}.lan" if t in addresses else f"/filled/{i}"
                for i, t in enumerate(dep.placeholders)
            },
            "engine": dep.engine.model_copy(update={"image": dep.engine.image or "localhost/vllm:1"}),
            "mounts": mounts,
            "model": dep.model.model_copy(
                update={"local_dir": local if local.startswith(("/", "~")) else "/filled/model"}
            ),
        }
    )
