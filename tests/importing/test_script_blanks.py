"""A blank a script leaves to fill (``MODEL_PATH=""`` then ``--model $MODEL_PATH``): bash word-splits the
empty value away and leaves the flag without its value, so the import makes it the placeholder
``<MODEL_PATH>`` — found by bash's own runs, and the argv is bash's with the blank filled (the oracle:
plain bash outside the jail, ``readonly NAME='<NAME>'`` before the text). An empty accumulator, or an
empty variable that is no flag's value, stays exactly as bash runs it."""

from __future__ import annotations

from pathlib import Path

import pytest

from rigsmith.importing import bashjail, recipe
from rigsmith.importing.recipe.command import script as scriptform
from tests.support.bashoracle import script_launches
from tests.support.recipes import refusal

BLANKS = {
    "unquoted, an option follows": (
        'MODEL_PATH=""\nvllm serve --model $MODEL_PATH --trust-remote-code --port 8000\n',
        {"MODEL_PATH": "--model"},
    ),
    "quoted (the empty word)": (
        'MODEL_PATH=\nvllm serve --model "$MODEL_PATH" --port 8000\n',
        {"MODEL_PATH": "--model"},
    ),
    "last on the line": (
        'NAME=""\nvllm serve Qwen/Qwen3-0.6B --port 8000 --served-model-name $NAME\n',
        {"NAME": "--served-model-name"},
    ),
    "--flag=": (
        'LEN=""\nvllm serve Qwen/Qwen3-0.6B --max-model-len=$LEN --port 8000\n',
        {"LEN": "--max-model-len"},
    ),
    "exported, in python -m": (
        'export MODEL_PATH=""\nTP=""\npython3 -m vllm.entrypoints.openai.api_server --model $MODEL_PATH \\\n'
        "  --tensor-parallel-size $TP --port 8000\n",
        {"MODEL_PATH": "--model", "TP": "--tensor-parallel-size"},
    ),
    "local, in a function": (
        'serve() {\n  local M=""\n  vllm serve --model $M --port 8000\n}\nserve\n',
        {"M": "--model"},
    ),
    "the second of a repeated --flag=": (
        'A=""\nvllm serve Qwen/Q3 --served-model-name=qwen --served-model-name=$A --port 8000\n',
        {"A": "--served-model-name"},
    ),
    "declared with typeset -x": (
        'typeset -x M=""\nvllm serve --model $M --port 8000\n',
        {"M": "--model"},
    ),
}

AS_BASH_RUNS = {
    "an accumulator": 'ARGS=""\nARGS+=" --enforce-eager"\nvllm serve Qwen/Q3 --port 8000 $ARGS\n',
    "empty at the end, no flag's value": 'EXTRA=""\nvllm serve Qwen/Q3 --port 8000 $EXTRA\n',
    "empty after a flag that has its value": 'EXTRA=""\nvllm serve Qwen/Q3 --port 8000 $EXTRA --seed 1\n',
    "empty after a boolean flag": 'EXTRA=""\nvllm serve Qwen/Q3 --trust-remote-code $EXTRA --port 8000\n',
    "assigned a value later": 'M=""\nM=Qwen/Qwen3-0.6B\nvllm serve --model $M --port 8000\n',
    "an empty value's fallback": 'M=""\nvllm serve Qwen/Q3 --served-model-name ${M:-qwen} --port 8000\n',
    "a fallback after --flag=": 'M=""\nvllm serve Qwen/Q3 --served-model-name=${M:-q} --port 8\n',
    "appended to": 'M=""\nM+=""\nvllm serve Qwen/Q3 --served-model-name $M --port 8000\n',
    "an empty guard that sets a default": (
        'PORT=""\nif [ -z "$PORT" ]; then PORT=8001; fi\nvllm serve Qwen/Qwen3-0.6B --port $PORT\n'
    ),
}


def _launched(text: str, tmp: Path, blanks: list[str]) -> list[str]:
    """The words after ``vllm serve`` / ``python -m MODULE`` plain bash runs, the blanks filled."""
    (argv,) = script_launches(text, tmp, blanks=blanks)
    return argv[2:] if argv[0] == "vllm" else argv[3:]


@pytest.mark.parametrize("case", BLANKS)
def test_a_blank_left_to_fill_is_its_placeholder_and_the_argv_is_bashs_with_it_filled(
    case: str, tmp_path: Path
) -> None:
    text, flags = BLANKS[case]
    answer = bashjail.run(text)
    assert answer.problems == []
    assert {name: flag for name, (_, flag) in answer.blanks.items()} == flags
    launch = scriptform.from_script(text, "t", accept=False)
    assert launch.problems == []
    assert launch.args == _launched(text, tmp_path, list(flags))
    dep = recipe.parse(text, source="t", sha256="0" * 64)
    assert sorted(dep.placeholders) == sorted(f"<{n}>" for n in flags)
    for name, flag in flags.items():
        (note,) = [
            n
            for n in dep.notes
            if n.endswith(f"it is the placeholder <{name}>, which you fill in before deploy")
        ]
        assert (
            f"{name} is assigned only the empty string, and bash then leaves {flag} without its value" in note
        )


@pytest.mark.parametrize("case", AS_BASH_RUNS)
def test_an_empty_variable_that_is_no_blank_stays_as_bash_runs_it(case: str, tmp_path: Path) -> None:
    text = AS_BASH_RUNS[case]
    answer = bashjail.run(text)
    assert answer.problems == [] and answer.blanks == {}
    launch = scriptform.from_script(text, "t", accept=False)
    assert launch.args == _launched(text, tmp_path, [])
    dep = recipe.parse(text, source="t", sha256="0" * 64)
    assert dep.placeholders == {}
    assert not any("assigned only the empty string" in n for n in dep.notes)


def test_a_variable_emptied_after_a_value_is_no_blank_and_its_bare_flag_is_refused() -> None:
    # the author gave it a value and took it away: not a blank to fill, and vLLM would stop on the bare flag
    text = 'M=Qwen/Qwen3-0.6B\nM=""\nvllm serve --model $M --port 8000\n'
    assert bashjail.run(text).blanks == {}
    assert "--model takes a value, but the option '--port' follows it" in refusal(text)


def test_a_secret_left_blank_never_reaches_the_spec() -> None:
    dep = recipe.parse(
        'API_KEY=""\nvllm serve Qwen/Qwen3-0.6B --api-key $API_KEY --port 8000\n', source="t", sha256="0" * 64
    )
    assert "--api-key" not in dep.engine.args and "<API_KEY>" not in dep.placeholders
    assert any(e.name == "VLLM_API_KEY" and e.secret for e in dep.env)
    assert any("API_KEY names a secret, whose value the spec never holds" in n for n in dep.notes)


def test_a_decision_on_a_blank_is_refused_like_one_on_any_placeholder() -> None:
    text = 'M=""\nif [ "$M" = big ]; then TP=2; else TP=1; fi\nvllm serve --model $M -tp $TP --port 8000\n'
    answer = bashjail.run(text)
    assert any("bash decides on the placeholder <M>" in p for p in answer.problems)
