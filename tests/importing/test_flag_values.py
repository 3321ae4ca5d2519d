"""Issue 35: a flag value that cannot be what vLLM's flag takes is refused naming the flag."""

from __future__ import annotations

import hashlib

import pytest

from rigsmith.errors import RecipeError
from rigsmith.importing import recipe
from rigsmith.spec import Deployment


def _parse(text: str) -> Deployment:
    return recipe.parse(text, source="r.sh", sha256=hashlib.sha256(text.encode()).hexdigest(), image="v:1")


def _refusal(text: str) -> str:
    with pytest.raises(RecipeError) as err:
        _parse(text)
    return str(err.value)


@pytest.mark.parametrize(
    ("words", "flag", "value"),
    [
        ("--tensor-parallel-size Your_GPU_number", "--tensor-parallel-size", "Your_GPU_number"),
        ("-tp two", "--tensor-parallel-size", "two"),
        ("--pipeline-parallel-size=1.5", "--pipeline-parallel-size", "1.5"),
        ("--port -8000", "--port", "-8000"),
        ("--data-parallel-size +2", "--data-parallel-size", "+2"),
        ("-tp ²", "--tensor-parallel-size", "²"),
        ("--port ٨٠", "--port", "٨٠"),
        ("--shutdown-timeout 1e3", "--shutdown-timeout", "1e3"),
    ],
)
def test_a_whole_number_flag_given_something_else_is_refused_naming_the_flag(
    words: str, flag: str, value: str
) -> None:
    message = _refusal(f"vllm serve Qwen/Qwen3-0.6B {words}")
    assert f"{flag} takes a whole number written in ASCII digits" in message
    assert f"gives it {value!r}" in message


@pytest.mark.parametrize("words", ["-tp 2", "--port=8001", "--tensor-parallel-size <TP>", "--seed 0"])
def test_a_whole_number_or_a_placeholder_imports(words: str) -> None:
    assert _parse(f"vllm serve Qwen/Qwen3-0.6B {words}").engine.args[1:] == tuple(words.split())


@pytest.mark.parametrize(
    ("words", "flag", "after"),
    [
        # tsinghua-fib-lab/AgentMove serving/vllm_serving.sh: MODEL_PATH="" left `--model` before an option
        ("--model --trust-remote-code", "--model", "the option '--trust-remote-code' follows it"),
        ("--port --enforce-eager", "--port", "the option '--enforce-eager' follows it"),
        ("-tp", "-tp", "nothing follows it"),
        ("--chat-template", "--chat-template", "nothing follows it"),
    ],
)
def test_a_flag_left_without_its_value_is_refused_as_vllm_would(words: str, flag: str, after: str) -> None:
    message = _refusal(f"vllm serve Qwen/Qwen3-0.6B {words}")
    assert f"{flag} takes a value, but {after}" in message
    assert message.count("takes a") == 1  # one problem for one missing value


def test_a_negative_number_is_a_value_not_an_option() -> None:
    message = _refusal("vllm serve Qwen/Qwen3-0.6B --port -8000")
    assert "takes a value" not in message and "gives it '-8000'" in message
