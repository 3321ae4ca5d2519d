"""A rewritten model argument keeps the recipe's served name (issue 24): vLLM serves a model under its
model argument, which every target points at the mounted copy; without --served-model-name clients that
call the recipe's id get 404, so the plan adds it (and import notes the decision)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from rigsmith.importing import recipe
from rigsmith.rendering import plan as planmod
from rigsmith.resolving.lock import lock as lockmod
from tests.support.common import FAKE_VENDOR, STANDIN_IMAGE, invoke_cli, run_script, write_project
from tests.support.podman import Podman, parse_recording


def _command(text: str) -> tuple[str, ...]:
    dep = recipe.parse(text, source="t", sha256="0" * 64, image="localhost/x:1")
    return planmod.build(dep, ("localhost/x:1", False), spec_path="x", lock=lockmod.Lock()).command


@pytest.mark.parametrize(
    ("text", "served"),
    [
        ("vllm serve Qwen/Qwen3-8B", ["Qwen/Qwen3-8B"]),
        ("vllm serve --model=Qwen/Qwen3-8B", ["Qwen/Qwen3-8B"]),
        ("vllm serve Qwen/Qwen3-8B --served-model-name q", ["q"]),
        ("vllm serve Qwen/Qwen3-8B --served_model_name=q", []),  # set by the recipe, in the = form
        ("docker run --gpus 1 -v /srv/m:/models/m img --model /models/m", []),  # the path is unchanged
    ],
)
def test_the_served_name_is_added_only_when_the_model_word_changes_and_none_is_set(
    text: str, served: list[str]
) -> None:
    command = list(_command(text))
    got = [command[i + 1] for i, a in enumerate(command) if a == "--served-model-name"]
    assert got == served


def test_cli_deploy_serves_the_recipe_id_on_real_podman(
    tmp_path: Path, podman: Podman, fake_cdi: Path, standin_image: str
) -> None:
    root = write_project(tmp_path).root
    env = {**os.environ, "HOME": str(tmp_path / "home")}
    (tmp_path / "home/models/Qwen3-8B").mkdir(parents=True)
    src = tmp_path / "r.sh"
    src.write_text(f"docker run --device {FAKE_VENDOR}=0 {STANDIN_IMAGE} --model Qwen/Qwen3-8B\n")
    proc = invoke_cli(root, "import-recipe", str(src), "--name", "served", "--yes", env=env)
    assert proc.returncode == 0, proc.stderr
    spec = (root / "deployments/served.yaml").read_text()
    assert "every target adds" in spec and "--served-model-name Qwen/Qwen3-8B" in spec.replace("\n  ", " ")
    proc = invoke_cli(
        root, "deploy", "--target", "podman", "--deployment", "served", "--memlock", "host", env=env
    )
    assert proc.returncode == 0, proc.stderr
    try:
        proc = run_script(root / "podman/served/run.sh", {**podman.env, "HOME": env["HOME"]})
        assert proc.returncode == 0, proc.stderr
        rec = parse_recording(podman.logs_until("served", "Application startup complete"))
    finally:
        podman.run("rm", "--force", "--time", "0", "served", check=False)
    assert rec.argv[:3] == ["serve", "--model", "/models/Qwen3-8B"]
    assert rec.argv[rec.argv.index("--served-model-name") + 1] == "Qwen/Qwen3-8B"
