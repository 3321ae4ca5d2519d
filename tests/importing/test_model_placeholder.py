"""A script whose model comes from a variable it never sets (``MODEL=${MODEL:?set MODEL}`` / ``vllm serve
$MODEL``) imports with the model as a placeholder the user fills — never an empty string — and every later
command names that field until it is filled: ``next``, ``doctor``, ``pin`` and ``deploy``, through the CLI."""

from __future__ import annotations

from pathlib import Path

import pytest

from rigsmith import spec as specmod
from rigsmith.operating.doctor import doctor
from rigsmith.operating.host import gather
from rigsmith.project import Project
from tests.support.common import REPO, invoke_cli
from tests.support.replay import ReplayHost

TEXTS = {
    "required": "#!/bin/bash\nMODEL=${MODEL:?set MODEL}\nvllm serve $MODEL --tensor-parallel-size 2 \\\n"
    "  --max-model-len 8192\n",
    "unset": "vllm serve $MODEL --tensor-parallel-size 2 --max-model-len 8192\n",
    "in bash -c": "bash -c 'vllm serve \"$MODEL\" --tensor-parallel-size 2 --max-model-len 8192'\n",
}


def _import(tmp_path: Path, text: str) -> tuple[specmod.Deployment, Path, str]:
    src = tmp_path / "serve.sh"
    src.write_text(text)
    (tmp_path / "deployments").mkdir()
    proc = invoke_cli(tmp_path, "import-recipe", str(src), "--name", "fromvar", "--image", "localhost/vllm:1")
    assert proc.returncode == 0, proc.stderr
    path = tmp_path / "deployments" / "fromvar.yaml"
    return specmod.load(path), path, proc.stdout


@pytest.mark.parametrize("form", TEXTS)
def test_a_model_from_an_unset_variable_imports_as_a_placeholder_to_fill(tmp_path: Path, form: str) -> None:
    spec, _, out = _import(tmp_path, TEXTS[form])
    assert spec.model.repo == "<MODEL>" and spec.model_placeholder == "<MODEL>"
    assert spec.placeholders == {"<MODEL>": None}
    assert spec.engine.args == ("<MODEL>", "--tensor-parallel-size", "2", "--max-model-len", "8192")
    assert "" not in spec.engine.args
    assert "fill model.repo in deployments/fromvar.yaml" in out
    assert any("the model is the placeholder <MODEL>" in n for n in spec.notes)


def test_next_pin_and_deploy_name_the_model_until_it_is_filled(tmp_path: Path) -> None:
    _, path, _ = _import(tmp_path, TEXTS["required"])
    nxt = invoke_cli(tmp_path, "next", "--deployment", "fromvar")
    assert "NEXT  imported   deployments/fromvar.yaml: model.repo is the placeholder <MODEL>" in nxt.stdout
    assert "next: fill model.repo in deployments/fromvar.yaml" in nxt.stdout

    pin = invoke_cli(tmp_path, "pin", "--deployment", "fromvar")
    assert pin.returncode != 0 and "Traceback" not in pin.stderr
    assert "model.repo is the placeholder <MODEL>" in pin.stderr
    assert "placeholders: {'<MODEL>': OWNER/NAME}" in pin.stderr
    assert not (tmp_path / "rigsmith.lock").exists()

    deploy = invoke_cli(tmp_path, "deploy", "--target", "podman", "--deployment", "fromvar")
    assert deploy.returncode != 0 and "Traceback" not in deploy.stderr
    assert "model.repo: is the placeholder <MODEL>" in deploy.stderr
    assert not (tmp_path / "podman").exists()

    # Filled: the model is that repo everywhere, and `next` moves on to pinning it.
    path.write_text(path.read_text().replace("<MODEL>: null", "<MODEL>: Qwen/Qwen3-8B"))
    spec = specmod.load(path)
    assert (spec.model.repo, spec.model.local_dir, spec.model.container_path) == (
        "Qwen/Qwen3-8B",
        "~/models/Qwen3-8B",
        "/models/Qwen3-8B",
    )
    assert spec.unfilled_placeholders() == []
    nxt = invoke_cli(tmp_path, "next", "--deployment", "fromvar")
    assert "done  imported" in nxt.stdout
    assert "rigsmith.lock has no pin for model Qwen/Qwen3-8B" in nxt.stdout


def test_a_model_filled_with_a_directory_is_a_checkpoint_on_disk(tmp_path: Path) -> None:
    _, path, _ = _import(tmp_path, TEXTS["unset"])
    path.write_text(path.read_text().replace("<MODEL>: null", "<MODEL>: /srv/models/qwen"))
    spec = specmod.load(path)
    assert (spec.model.repo, spec.model.local_dir, spec.model.container_path) == (
        None,
        "/srv/models/qwen",
        "/models/qwen",
    )
    nxt = invoke_cli(tmp_path, "next", "--deployment", "fromvar")
    assert "done  imported" in nxt.stdout and "local checkpoint (nothing to pin)" in nxt.stdout


def test_a_filled_model_that_is_neither_a_repo_nor_a_directory_is_refused_naming_it(tmp_path: Path) -> None:
    _, path, _ = _import(tmp_path, TEXTS["unset"])
    path.write_text(path.read_text().replace("<MODEL>: null", "<MODEL>: qwen3"))
    nxt = invoke_cli(tmp_path, "next", "--deployment", "fromvar")
    assert nxt.returncode != 0 and "Traceback" not in nxt.stderr
    assert "placeholders['<MODEL>']: 'qwen3' is the model" in nxt.stderr


def test_doctor_names_the_model_placeholder_as_the_one_no_go(tmp_path: Path) -> None:
    seed = Project(REPO).load("flash-next-merlin-4x3090")
    data = seed.model_dump(mode="json")
    data["model"]["repo"] = "<MODEL>"
    data["placeholders"] = {**data["placeholders"], "<MODEL>": None}
    spec = specmod.Deployment.model_validate(data)
    checks = doctor.evaluate(spec, gather(ReplayHost("4x3090-idle"), model_dir=spec.model.local_dir))
    assert [(c.name, c.verdict) for c in checks if c.verdict == "no-go"] == [("placeholders", "no-go")]
    [row] = [c for c in checks if c.name == "placeholders"]
    assert row.detail.startswith("model.repo is the placeholder <MODEL>")

    _, _, _ = _import(tmp_path, TEXTS["unset"])
    proc = invoke_cli(tmp_path, "doctor", "--deployment", "fromvar")
    assert "Traceback" not in proc.stderr
    assert "model.repo is the placeholder <MODEL>" in proc.stdout
