"""A repo-less (local checkpoint) deployment, imported from the corpus, renders for every target."""

from __future__ import annotations

import hashlib
import subprocess
from pathlib import Path

import pytest

from rigsmith import spec as specmod
from rigsmith.errors import SpecError
from rigsmith.importing import recipe
from rigsmith.project import TARGETS, Project
from rigsmith.rendering import deploy
from tests.support.common import require
from tests.support.recipes import corpus

CASE = "vllm-issue-3710-2x4090-docker-p2p-disable"
HOST_DIR = "/home/super/data/models/Qwen1.5-7B-Chat"


def _imported(tmp_path: Path, **model: str) -> tuple[Project, specmod.Deployment]:
    (case,) = [c for c in corpus() if c["id"] == CASE]
    dep = recipe.parse(
        case["raw"], source=f"corpus:{CASE}", sha256=hashlib.sha256(case["raw"].encode()).hexdigest()
    )
    # What a user adds before `deploy --target lxc`: the CT's memory is sized from host_ram_gib.
    dep = dep.model_copy(
        update={
            "resources": dep.resources.model_copy(update={"host_ram_gib": 32.0}),
            "model": dep.model.model_copy(update=model),
        }
    )
    project = Project(tmp_path / "proj")
    project.spec_path(dep.name).parent.mkdir(parents=True)
    project.spec_path(dep.name).write_text(specmod.dump(dep), encoding="utf-8")
    return project, dep


@pytest.mark.parametrize("target", TARGETS)
def test_an_imported_local_model_renders_for_every_target(tmp_path: Path, target: str) -> None:
    project, dep = _imported(tmp_path)
    assert dep.model.repo is None and dep.model.local_dir == HOST_DIR
    plan, files = deploy.artifacts(project, target, deployment=dep.name, out=tmp_path / "out")
    (model_mount,) = [m for m in plan.mounts if m.role == "model"]
    assert (model_mount.host, model_mount.container, model_mount.readonly) == (
        HOST_DIR,
        "/models/Qwen1.5-7B-Chat",
        True,
    )
    i = plan.command.index("--model")
    assert plan.command[i : i + 2] == ("--model", "/models/Qwen1.5-7B-Chat")
    text = "\n".join(a.content for a in files)
    assert HOST_DIR in text and "/models/Qwen1.5-7B-Chat" in text
    assert "/workspace/models/Qwen1.5-7B-Chat" not in text, "the recipe's container path is mapped"
    for script in [a for a in files if a.path.suffix == ".sh"]:
        proc = subprocess.run(
            [require("shellcheck"), "--severity=style", "-"],
            input=script.content,
            capture_output=True,
            text=True,
            check=False,
        )
        assert proc.returncode == 0, f"{script.path.name}: {proc.stdout}"


@pytest.mark.parametrize("target", TARGETS)
def test_a_relative_local_model_dir_is_refused_by_every_target(tmp_path: Path, target: str) -> None:
    project, dep = _imported(tmp_path, local_dir="./Qwen1.5-7B-Chat")
    with pytest.raises(SpecError) as err:
        deploy.artifacts(project, target, deployment=dep.name, out=tmp_path / "out")
    assert err.value.problems == [
        (
            "model.local_dir",
            "'./Qwen1.5-7B-Chat' is relative (to where the recipe ran); set the checkpoint's absolute path "
            "or ~/…",
        )
    ]
