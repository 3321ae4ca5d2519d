"""A word a published recipe leaves for its reader to replace — ``/path/to/…`` as the model or as any path a
vLLM flag names, the model word ``...`` — imports as a placeholder the user fills, by one rule in every
form (plain command, script, compose, recipe JSON, vLLM recipes YAML): the spec lists it, one note quotes
the word, and pin and deploy refuse until it is filled."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from rigsmith import spec as specmod
from rigsmith.importing import recipe
from tests.support.common import invoke_cli

_FLAGS = "--chat-template /path/to/chat.jinja --enable-lora --lora-modules sql=/path/to/sql-lora"
_COMMAND = f"vllm serve /path/to/Qwen/Qwen2.5-3B-Instruct {_FLAGS} --port 8000"
_RECIPES_YAML = Path(__file__).parent / "data" / "vllm-recipes" / "Qwen_Qwen3-8B.yaml"


def _compose() -> str:
    argv = ["--model", "/path/to/Qwen/Qwen2.5-3B-Instruct", *_FLAGS.split(), "--port", "8000"]
    service = {"image": "vllm/vllm-openai:v0.11.0", "command": argv, "ipc": "host", "network_mode": "host"}
    return yaml.safe_dump({"services": {"vllm": service}})


FORMS = {
    "plain command": _COMMAND + "\n",
    "script": 'M="/path/to/Qwen/Qwen2.5-3B-Instruct"\nT=/path/to/chat.jinja\n'
    + _COMMAND.replace("/path/to/Qwen/Qwen2.5-3B-Instruct", "$M").replace("/path/to/chat.jinja", "$T")
    + "\n",
    "bash -c in a script": f"bash -c '{_COMMAND}' &\nsleep 60\n",
    "compose": _compose(),
    "recipe JSON": json.dumps({"title": "t", "command": _COMMAND}),
}


@pytest.mark.parametrize("form", FORMS)
def test_a_documentation_word_is_a_placeholder_to_fill_in_every_form(form: str) -> None:
    dep = recipe.parse(FORMS[form], source="t", sha256="0" * 64)
    args = list(dep.engine.args)
    assert dep.model.repo == "<MODEL>" and dep.model_placeholder == "<MODEL>"
    assert args[args.index("--chat-template") + 1] == "<CHAT_TEMPLATE>"
    assert args[args.index("--lora-modules") + 1] == "sql=<LORA_MODULES>"
    assert not any("path/to" in a for a in args)
    assert set(dep.placeholders) == {"<MODEL>", "<CHAT_TEMPLATE>", "<LORA_MODULES>"}
    assert not [m for m in dep.mounts if "path/to" in m.host]  # never mounted as if it were a directory
    assert not dep.secondary_models
    notes = "\n".join(dep.notes)
    assert "the model '/path/to/Qwen/Qwen2.5-3B-Instruct' is a word the published text leaves" in notes
    assert "placeholders: {'<MODEL>': OWNER/NAME}" in notes
    assert "--chat-template names '/path/to/chat.jinja', a documentation path" in notes
    assert "it is the placeholder <CHAT_TEMPLATE>: fill it before deploy" in notes
    assert "--lora-modules sql names '/path/to/sql-lora'" in notes
    assert sum("<CHAT_TEMPLATE>" in n for n in dep.notes) == 1  # one note a word


def test_a_path_in_a_flags_json_and_the_elided_model_word_are_placeholders() -> None:
    spec_conf = json.dumps({"model": "/path/to/draft", "num_speculative_tokens": 3})
    dep = recipe.parse(f"vllm serve ... --speculative-config '{spec_conf}'\n", source="t", sha256="0" * 64)
    assert dep.engine.args[0] == "<MODEL>"
    assert json.loads(dep.engine.args[2]) == {"model": "<SPECULATIVE_CONFIG>", "num_speculative_tokens": 3}
    assert set(dep.placeholders) == {"<MODEL>", "<SPECULATIVE_CONFIG>"}
    assert "the model '...' is a word the published text leaves" in "\n".join(dep.notes)


def test_a_vllm_recipes_yaml_flag_path_is_a_placeholder() -> None:
    data = yaml.safe_load(_RECIPES_YAML.read_text())
    data["model"]["base_args"] = ["--chat-template", "/path/to/tool_chat.jinja"]
    dep = recipe.parse(yaml.safe_dump(data), source="t.yaml", sha256="0" * 64)
    args = list(dep.engine.args)
    assert args[args.index("--chat-template") + 1] == "<CHAT_TEMPLATE>"
    assert dep.model.repo == "Qwen/Qwen3-8B" and set(dep.placeholders) == {"<CHAT_TEMPLATE>"}


def test_placeholders_the_text_already_uses_are_not_reused() -> None:
    dep = recipe.parse(
        "vllm serve /path/to/m --chat-template /path/to/a.jinja --served-model-name '<CHAT_TEMPLATE>'\n",
        source="t",
        sha256="0" * 64,
    )
    args = list(dep.engine.args)
    assert args[args.index("--chat-template") + 1] == "<CHAT_TEMPLATE_2>"


def test_the_quoted_word_reaches_the_notes_through_shown() -> None:
    dep = recipe.parse("vllm serve '/path/to/m\x1b]52;c;aGk=\x07'\n", source="t", sha256="0" * 64)
    assert dep.model.repo == "<MODEL>"
    note = next(n for n in dep.notes if "leaves for you to replace" in n)
    assert "\x1b" not in note and "\x07" not in note


def test_pin_and_deploy_refuse_until_the_placeholders_are_filled(tmp_path: Path) -> None:
    src = tmp_path / "start.sh"
    src.write_text(FORMS["bash -c in a script"])
    (tmp_path / "deployments").mkdir()
    imported = invoke_cli(tmp_path, "import-recipe", str(src), "--name", "doc", "--image", "localhost/vllm:1")
    assert imported.returncode == 0, imported.stderr
    path = tmp_path / "deployments" / "doc.yaml"
    assert specmod.load(path).placeholders == {
        "<MODEL>": None,
        "<CHAT_TEMPLATE>": None,
        "<LORA_MODULES>": None,
    }
    pin = invoke_cli(tmp_path, "pin", "--deployment", "doc")
    assert pin.returncode != 0 and "Traceback" not in pin.stderr
    assert "model.repo is the placeholder <MODEL>" in pin.stderr
    deploy = invoke_cli(tmp_path, "deploy", "--target", "podman", "--deployment", "doc")
    assert deploy.returncode != 0 and "Traceback" not in deploy.stderr
    assert "<MODEL>" in deploy.stderr
    assert not (tmp_path / "rigsmith.lock").exists()
