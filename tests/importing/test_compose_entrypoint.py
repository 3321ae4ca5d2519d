"""Compose `entrypoint: []` (the image's entrypoint cleared): the command is the whole argv."""

from __future__ import annotations

import hashlib
import re

import pytest

from rigsmith.errors import RecipeError
from rigsmith.importing import recipe


def _parse(service_yaml: str):
    text = "services:\n  vllm:\n    image: vllm/vllm-openai:v0.9.0\n" + service_yaml
    return recipe.parse(text, source="compose.yaml", sha256=hashlib.sha256(text.encode()).hexdigest())


def test_cleared_entrypoint_takes_the_executable_from_the_command() -> None:
    spec = _parse("    entrypoint: []\n    command: ['vllm', 'serve', 'acme/m', '--port', '9000']\n")
    assert (spec.engine.executable, spec.engine.subcommand) == ("vllm", ("serve",))
    assert spec.engine.args == ("acme/m", "--port", "9000") and spec.model.repo == "acme/m"


@pytest.mark.parametrize(
    ("service", "message"),
    [
        ("    entrypoint: []\n    command: ['vllm serve acme/m']\n", "contains whitespace"),
        ("    entrypoint: []\n", "entrypoint is [] and command is empty"),
    ],
)
def test_cleared_entrypoint_without_a_usable_command_is_refused_by_field(service: str, message: str) -> None:
    with pytest.raises(RecipeError, match=re.escape(message)) as err:
        _parse(service)
    assert "services.vllm" in str(err.value)


def _shell(text: str):
    return recipe.parse(text, source="cmd.txt", sha256=hashlib.sha256(text.encode()).hexdigest())


@pytest.mark.parametrize(
    ("command", "args", "secrets"),
    [
        ("vllm serve acme/m --api-key sk-123 --port 9000", ("acme/m", "--port", "9000"), ["VLLM_API_KEY"]),
        ("vllm serve acme/m --api-key=sk-1 --hf-token", ("acme/m", "--hf-token"), ["VLLM_API_KEY"]),
        (
            "vllm serve acme/m --hf-token hf_x --api-key a b --x 1",
            ("acme/m", "--x", "1"),
            ["HF_TOKEN", "VLLM_API_KEY"],
        ),
    ],
)
def test_secret_flag_values_never_enter_the_spec(
    command: str, args: tuple[str, ...], secrets: list[str]
) -> None:
    from rigsmith import spec as specmod

    spec = _shell(command)
    assert spec.engine.args == args
    assert sorted(e.name for e in spec.env if e.secret and e.value == "") == secrets
    text = specmod.dump(spec)
    for leaked in ("sk-123", "sk-1", "hf_x", " a b"):
        assert leaked not in text
