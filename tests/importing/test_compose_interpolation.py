"""Issue 25: compose interpolation as the compose spec says it, checked against podman-compose's own
``config`` output; values from the process environment over the .env beside the file or --env-file;
multi-service files and --service."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from rigsmith.errors import RecipeError
from rigsmith.importing import importer, recipe
from rigsmith.importing.recipe.compose import env as composeenv
from rigsmith.project import Project
from tests.support.common import require
from tests.support.recipes import HERE

COMPOSE = {c["id"]: c for c in json.loads((HERE / "data" / "compose-files.json").read_text(encoding="utf-8"))}
CLUB = COMPOSE["club3090-gemma4-26b-a4b-single-compose"]["raw"]

OPERATORS = """services:
  vllm:
    image: ${IMAGE:-vllm/vllm-openai:v0.11.0}
    command: ["${A-d1}", "${A:-d2}", "${B:+x}", "${B+y}", "${E+z}", "${E:+w}", "$$HOME", "$B", "${B}",
              "pre-${B}-post", "${U:-${B:-n}}", "--model", "${MODEL:?set MODEL to the repo}", "a$$$$b"]
    environment:
      - FROM_FILE=${FILE_ONLY}
      - WHICH=${BOTH}
      - HF_TOKEN=${HF_TOKEN}
"""


def _podman_compose_config(text: str, dotenv: str, environ: dict[str, str], tmp_path: Path) -> Any:
    (tmp_path / "c.yml").write_text(text, encoding="utf-8")
    (tmp_path / ".env").write_text(dotenv, encoding="utf-8")
    proc = subprocess.run(
        [require("podman-compose"), "-f", "c.yml", "config"],
        cwd=tmp_path,
        env={"PATH": os.environ["PATH"], "HOME": str(tmp_path), **environ},
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    return yaml.safe_load(proc.stdout)


def _ours(
    text: str, dotenv: str, environ: dict[str, str], service: str
) -> tuple[Any, composeenv.Interpolation]:
    data = yaml.safe_load(text)
    env = composeenv.ComposeEnv(process=environ, file_text=dotenv, file_name=".env")
    values, origin = env.lookup()
    interp = composeenv.Interpolation(values, origin)
    svc = composeenv.interpolate(data["services"][service], interp, f"services.{service}")
    return json.loads(json.dumps(svc).replace("$$", "$")), interp


def _env_dict(env: Any) -> dict[str, str]:
    if isinstance(env, dict):
        return {str(k): str(v) for k, v in env.items()}
    return dict(str(e).split("=", 1) for e in env)


@pytest.mark.parametrize(
    ("text", "service", "dotenv", "environ"),
    [
        (
            OPERATORS,
            "vllm",
            "A=\nB=bee\nE=\nMODEL=from-file/model\nFILE_ONLY=f\nBOTH=file\nHF_TOKEN=hf_x\n",
            {"BOTH": "process", "MODEL": "Qwen/Qwen3-0.6B"},
        ),
        (
            CLUB,
            "vllm-gemma-4-26b-a4b-tp1",
            "VLLM_NIGHTLY_SHA=0123abc\nMAX_MODEL_LEN=2048\nTP=2\n",
            {"MAX_MODEL_LEN": "4096", "GPU_MEMORY_UTILIZATION": "0.85"},
        ),
    ],
    ids=["operators", "club3090-gemma4-26b"],
)
def test_interpolation_is_what_podman_compose_config_says(
    text: str, service: str, dotenv: str, environ: dict[str, str], tmp_path: Path
) -> None:
    theirs = _podman_compose_config(text, dotenv, environ, tmp_path)["services"][service]
    ours, interp = _ours(text, dotenv, environ, service)
    assert interp.problems == [] and interp.notes == []
    for key in ("image", "command", "entrypoint"):
        assert ours.get(key) == theirs.get(key), key
    # `NAME=${NAME}` is a pass-through: rigsmith reads NAME from the host when the engine starts (compose
    # reads it at `config` time); every other entry is compose's value.
    mine, compose = _env_dict(ours["environment"]), _env_dict(theirs["environment"])
    kept = {k for k, v in mine.items() if v in (f"${k}", f"${{{k}}}")}
    assert {k: v for k, v in mine.items() if k not in kept} == {
        k: v for k, v in compose.items() if k not in kept
    }
    assert kept == ({"HF_TOKEN"} if "HF_TOKEN=${HF_TOKEN}" in text else set())


def test_a_required_value_nobody_sets_is_an_error_naming_it() -> None:
    text = (
        "services:\n  vllm:\n    image: vllm/vllm-openai:v0.11.0\n"
        "    command: [--model, '${MODEL:?the repo}']\n"
    )
    with pytest.raises(RecipeError) as err:
        recipe.parse(text, source="t", sha256="0" * 64)
    assert "${MODEL:?the repo}: MODEL is required (the repo) and is not set" in str(err.value)


def test_a_value_nobody_sets_is_a_placeholder_not_an_empty_string() -> None:
    text = (
        "services:\n  vllm:\n    image: vllm/vllm-openai:v0.11.0\n"
        "    command: [Qwen/Qwen3-0.6B, --served-model-name, '${NAME}']\n"
    )
    dep = recipe.parse(text, source="t", sha256="0" * 64)
    assert dep.engine.args[-1] == "<NAME>" and dep.unfilled_placeholders() == ["<NAME>"]


def test_the_real_club3090_compose_imports_with_its_dotenv(tmp_path: Path) -> None:
    (tmp_path / "deployments").mkdir()
    compose = tmp_path / "kit" / "docker-compose.yml"
    compose.parent.mkdir()
    compose.write_text(CLUB, encoding="utf-8")
    (compose.parent / ".env").write_text("VLLM_NIGHTLY_SHA=0123abc\nMAX_MODEL_LEN=2048\n", encoding="utf-8")
    dep = importer.import_recipe(
        Project(tmp_path), str(compose), environ={"MAX_MODEL_LEN": "4096"}, echo=lambda _: None
    )
    assert dep.engine.image == "vllm/vllm-openai:nightly-0123abc"
    assert dep.engine.flag_value("--max-model-len") == "4096"  # the process environment wins
    notes = "\n".join(dep.notes)
    assert "MAX_MODEL_LEN='4096' (from the process environment)" in notes
    assert f"VLLM_NIGHTLY_SHA='0123abc' (from the .env beside {compose})" in notes
    # --env-file replaces the .env beside the file
    other = tmp_path / "other.env"
    other.write_text("VLLM_NIGHTLY_SHA=fedcba9\n", encoding="utf-8")
    dep = importer.import_recipe(
        Project(tmp_path), str(compose), env_file=str(other), environ={}, yes=True, echo=lambda _: None
    )
    assert dep.engine.image == "vllm/vllm-openai:nightly-fedcba9"
    assert dep.engine.flag_value("--max-model-len") == "8192"


TWO = """services:
  small:
    image: vllm/vllm-openai:v0.11.0
    command: [Qwen/Qwen3-0.6B, --port, "8001"]
  big:
    image: vllm/vllm-openai:v0.11.0
    command: [Qwen/Qwen3-8B, --port, "8002"]
  proxy:
    image: nginx:1.27
"""


def test_several_vllm_services_need_service_and_each_imports_on_its_own() -> None:
    with pytest.raises(RecipeError) as err:
        recipe.parse(TWO, source="t", sha256="0" * 64)
    message = str(err.value)
    assert "2 services run vLLM (small, big)" in message and "--service NAME" in message
    small = recipe.parse(TWO, source="t", sha256="0" * 64, service="small")
    big = recipe.parse(TWO, source="t", sha256="0" * 64, service="big")
    assert (small.model.repo, big.model.repo) == ("Qwen/Qwen3-0.6B", "Qwen/Qwen3-8B")
    with pytest.raises(RecipeError, match=r"--service nope: the file has no such service"):
        recipe.parse(TWO, source="t", sha256="0" * 64, service="nope")
