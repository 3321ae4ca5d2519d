"""Issue 35: no value of a secret in the importing environment is written anywhere — the spec, its .base
copy, the notes, or any target's artifacts — whatever key or variable carries it, through every import form.
A secret a recipe references becomes a reference the targets pass through at run time; a value that still
reaches a file is refused by the writer's last check (rigsmith.secretenv), naming the variable, never the
value."""

from __future__ import annotations

import json
import shlex
from pathlib import Path

import pytest
import yaml

from rigsmith import secretenv, writer
from rigsmith.errors import RecipeError, RigsmithError
from rigsmith.importing import importer, recipe
from rigsmith.project import Project
from rigsmith.rendering import deploy

#: Fake secrets put into the importing environment (one token-shaped, one not).
TOKEN = "hf_" + "Zq9x" * 9
KEY = "s3cr3t-Value-42xyz"
IMAGE = "vllm/vllm-openai:v0.11.0"
TARGETS = ("podman", "quadlet", "compose", "lxc", "kube")

COMPOSE = f"""services:
  vllm:
    image: {IMAGE}
    command: ["--model", "Qwen/Qwen3-0.6B", "--port", "8000"]
    environment:
      - MY_VAR=${{HF_TOKEN}}
      - WITH_DEFAULT=${{HF_TOKEN:-none}}
      - HF_TOKEN=${{HF_TOKEN}}
      - BY_VALUE=${{PLAIN_NAME}}
      - SERVICE_KEY=${{SERVICE_KEY}}
"""
SCRIPT = f"""#!/bin/bash
docker run --gpus all -e HF_TOKEN -e MY_VAR=$HF_TOKEN -e SERVICE_KEY=$SERVICE_KEY \\
  {IMAGE} --model Qwen/Qwen3-0.6B --port 8000
"""
RECIPE_JSON = json.dumps(
    {
        "title": "secret references",
        "command": "vllm serve Qwen/Qwen3-0.6B --port 8000 --hf-token $HF_TOKEN",
        "env": "MY_VAR=$HF_TOKEN HF_TOKEN=$HF_TOKEN SERVICE_KEY=${SERVICE_KEY}",
    }
)
VLLM_RECIPE = """meta:
  title: "Qwen3-0.6B"
model:
  model_id: "Qwen/Qwen3-0.6B"
  base_args: ["--port", "8000"]
  base_env:
    MY_VAR: "$HF_TOKEN"
    HF_TOKEN: "${HF_TOKEN}"
    SERVICE_KEY: "${SERVICE_KEY}"
variants:
  default:
    precision: bf16
    vram_minimum_gb: 4
"""
FORMS = {"compose": ("c.yml", COMPOSE), "script": ("serve.sh", SCRIPT), "json": ("r.json", RECIPE_JSON)}
FORMS["vllm-recipe"] = ("Qwen_Qwen3-0.6B.yaml", VLLM_RECIPE)


@pytest.fixture
def secret_env(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HF_TOKEN", TOKEN)
    monkeypatch.setenv("SERVICE_KEY", KEY)
    monkeypatch.setenv("PLAIN_NAME", TOKEN)  # a name that says nothing, holding a secret's value


def _files_holding(root: Path, *values: str) -> list[str]:
    return [
        str(p.relative_to(root))
        for p in sorted(root.rglob("*"))
        if p.is_file() and any(v.encode() in p.read_bytes() for v in values)
    ]


@pytest.mark.parametrize("form", list(FORMS))
def test_no_secret_value_from_the_environment_reaches_any_file(
    form: str, tmp_path: Path, secret_env: None
) -> None:
    file_name, text = FORMS[form]
    source = tmp_path / file_name
    source.write_text(text, encoding="utf-8")
    root = tmp_path / "project"
    (root / "deployments").mkdir(parents=True)
    project = Project(root)
    messages: list[str] = []
    dep = importer.import_recipe(project, str(source), name="s", image=IMAGE, echo=messages.append)
    spec_data = yaml.safe_load(project.spec_path("s").read_text(encoding="utf-8"))
    # the user fills what the import left to fill and points the model at this checkout
    spec_data["resources"]["gpus"]["cdi_devices"] = ["nvidia.com/gpu=0"]
    spec_data["resources"]["gpus"]["count"] = 1
    project.spec_path("s").write_text(yaml.safe_dump(spec_data, sort_keys=False), encoding="utf-8")
    for target in TARGETS:
        deploy.deploy(project, target, deployment="s", out=root / "out", echo=messages.append)

    assert (root / "deployments" / ".base" / "s.yaml").is_file()
    assert {p.name for p in (root / "out").iterdir()} == set(TARGETS)
    assert _files_holding(root, TOKEN, KEY) == []
    assert not any(TOKEN in m or KEY in m for m in messages)
    assert all(TOKEN not in n and KEY not in n for n in dep.notes)
    secrets = {e.name: e for e in dep.env if e.secret}
    # every reference is passed from the host at run time, by the variable it reads
    assert {"HF_TOKEN", "SERVICE_KEY"} <= {e.host_source for e in secrets.values()}
    assert secrets["MY_VAR"].host_source == "HF_TOKEN"
    if form == "compose":
        assert secrets["WITH_DEFAULT"].host_source == "HF_TOKEN"
        assert secrets["BY_VALUE"].host_source == "PLAIN_NAME"
    run_sh = next((root / "out" / "podman").rglob("run.sh")).read_text(encoding="utf-8")
    assert "MY_VAR" in run_sh and "HF_TOKEN" in run_sh


def test_a_secret_interpolated_into_the_command_is_refused_by_name_not_value(
    tmp_path: Path, secret_env: None
) -> None:
    text = COMPOSE.replace('"--port", "8000"', '"--served-model-name", "m-${PLAIN_NAME}"')
    source = tmp_path / "c.yml"
    source.write_text(text, encoding="utf-8")
    project = Project(tmp_path)
    (tmp_path / "deployments").mkdir()
    with pytest.raises(RecipeError) as err:
        importer.import_recipe(project, str(source), name="s", echo=lambda _m: None)
    message = f"{err.value}\n{err.value.hint}"
    assert "command[3]" in message and "PLAIN_NAME" in message and "holds the value of a secret" in message
    assert TOKEN not in message
    assert list((tmp_path / "deployments").iterdir()) == []


@pytest.mark.parametrize(
    "text",
    [
        # the user pasted their own token inline, under names that say nothing
        f"vllm serve Qwen/Qwen3-0.6B --served-model-name {TOKEN}",
        f"MY_OPTION={KEY} vllm serve Qwen/Qwen3-0.6B",
        json.dumps({"command": "vllm serve Qwen/Qwen3-0.6B", "env": f"OPTION_A={KEY}"}),
    ],
)
def test_a_secret_value_written_inline_is_refused_by_the_writer_and_nothing_is_written(
    text: str, tmp_path: Path, secret_env: None
) -> None:
    source = tmp_path / "r.txt"
    source.write_text(text, encoding="utf-8")
    (tmp_path / "deployments").mkdir()
    for dry_run in (True, False):
        messages: list[str] = []
        with pytest.raises(RigsmithError) as err:
            importer.import_recipe(
                Project(tmp_path), str(source), name="s", image=IMAGE, dry_run=dry_run, echo=messages.append
            )
        message = f"{err.value}\n{err.value.hint}"
        assert "deployments/s.yaml would hold the value of" in message and "nothing was written" in message
        assert ("HF_TOKEN" in message) or ("SERVICE_KEY" in message)
        assert TOKEN not in message + "".join(messages) and KEY not in message + "".join(messages)
        assert list((tmp_path / "deployments").iterdir()) == []


def test_deploy_refuses_a_spec_the_user_wrote_a_secret_value_into(tmp_path: Path, secret_env: None) -> None:
    source = tmp_path / "r.txt"
    source.write_text("vllm serve Qwen/Qwen3-0.6B --port 8000", encoding="utf-8")
    root = tmp_path / "project"
    (root / "deployments").mkdir(parents=True)
    project = Project(root)
    importer.import_recipe(project, str(source), name="s", image=IMAGE, echo=lambda _m: None)
    path = project.spec_path("s")
    data = yaml.safe_load(path.read_text(encoding="utf-8"))
    data["env"] = [{"name": "SOME_SETTING", "value": KEY}]
    path.write_text(yaml.safe_dump(data), encoding="utf-8")
    with pytest.raises(RigsmithError) as err:
        deploy.deploy(project, "podman", deployment="s", out=root / "out", echo=lambda _m: None)
    assert "run.sh would hold the value of SERVICE_KEY" in str(err.value) and KEY not in str(err.value)
    assert not (root / "out").exists()


@pytest.mark.parametrize(
    ("environ", "found"),
    [
        ({"HF_TOKEN": TOKEN}, {TOKEN: "HF_TOKEN"}),
        (
            {"db_password": KEY, "MY_SECRET_THING": KEY + "2"},
            {KEY: "db_password", KEY + "2": "MY_SECRET_THING"},
        ),
        ({"API_KEY": "short", "TOKENIZERS_PARALLELISM": "false-but-long", "HOME": "/home/x/long"}, {}),
        (
            {"GOOGLE_APPLICATION_CREDENTIALS": "/etc/hostname", "SSL_KEY": "/no/such/file/here"},
            {"/no/such/file/here": "SSL_KEY"},
        ),
    ],
)
def test_which_environment_values_count_as_secrets(environ: dict[str, str], found: dict[str, str]) -> None:
    assert secretenv.values(environ) == found


def test_the_writer_refuses_every_write_naming_each_file_and_variable(
    tmp_path: Path, secret_env: None
) -> None:
    arts = [writer.Artifact(tmp_path / "a", f"x {TOKEN} y"), writer.Artifact(tmp_path / "b", "clean")]
    for write in (
        lambda: writer.write(arts, echo=lambda _m: None),
        lambda: writer.write_one(arts[0].path, arts[0].content),
    ):
        with pytest.raises(RigsmithError) as err:
            write()
        assert f"{tmp_path / 'a'} would hold the value of HF_TOKEN" in str(err.value)
        assert str(tmp_path / "b") not in str(err.value) and TOKEN not in str(err.value)
        assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize(
    ("env", "name", "source"),
    [
        ("MY_VAR=$HF_TOKEN", "MY_VAR", "HF_TOKEN"),
        ("MY_VAR=${SERVICE_KEY}", "MY_VAR", "SERVICE_KEY"),
        ("MY_VAR=<HF_TOKEN>", "MY_VAR", "HF_TOKEN"),  # a secret the text read but never set
        ("HF_TOKEN=<your_hf_token>", "HF_TOKEN", "HF_TOKEN"),  # a documentation placeholder: by its own name
        ("HUGGING_FACE_HUB_TOKEN=$HF_TOKEN", "HUGGING_FACE_HUB_TOKEN", "HF_TOKEN"),
    ],
)
def test_a_secret_reference_is_passed_from_the_host_in_every_env_form(
    env: str, name: str, source: str
) -> None:
    shell = f"docker run --gpus all -e {shlex.quote(env)} {IMAGE} Qwen/Qwen3-0.6B"
    card = json.dumps({"command": "vllm serve Qwen/Qwen3-0.6B", "env": env})
    for text in (shell, card):
        dep = recipe.parse(text, source="r", sha256="0" * 64, image=IMAGE)
        (e,) = [e for e in dep.env if e.name == name]
        assert e.secret and e.host_source == source and dep.placeholders == {}, text
