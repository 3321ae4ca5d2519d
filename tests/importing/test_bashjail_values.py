"""Issue 35, what bash learns about values in the jail: a Python program before the server is a command
outside the launchers, an empty default is a placeholder, a command's output a variable holds is its
placeholder, no token of rigsmith's own reaches the user, and a decision on a value made from a placeholder
(its length, a part of it, arithmetic on it) is refused naming the line and the placeholder."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rigsmith import spec as specmod
from rigsmith.importing import recipe
from rigsmith.importing.tracewords import trace_words
from rigsmith.spec import Deployment
from tests.support.bashoracle import script_launches
from tests.support.recipes import refusal

_SECRET = "hf_rigsmithPreServerToken0123456789"


def _parse(text: str) -> Deployment:
    return recipe.parse(text, source="t", sha256="0" * 64)


def _served(text: str, tmp: Path, dep: Deployment) -> list[str]:
    """The words bash hands ``vllm serve`` (outside the jail), given the placeholders rigsmith made."""
    (argv,) = [a for a in script_launches(text, tmp, list(dep.placeholders)) if a[0] == "vllm"]
    return argv[2:]


@pytest.mark.parametrize("python", ["python", "python3", "/usr/bin/python3.11"])
def test_a_python_program_before_the_server_is_a_note_and_its_secret_is_written_nowhere(python: str) -> None:
    # ivangabriele/docker-llm entrypoint.sh: a Hub login and a download with python -c, then the server
    text = (
        f"set -e\nexport HF_TOKEN={_SECRET}\n"
        f"{python} -c \"import huggingface_hub; huggingface_hub.login(token='${{HF_TOKEN}}')\"\n"
        f"{python} -u prefetch.py --token $HF_TOKEN\n"
        f"{python} -m vllm.entrypoints.openai.api_server --model Qwen/Qwen3-0.6B --port 8000\n"
    )
    dep = _parse(text)
    assert list(dep.engine.args) == ["--model", "Qwen/Qwen3-0.6B", "--port", "8000"]
    notes = "\n".join(dep.notes)
    name = python.rsplit("/", 1)[-1]
    assert f"line 3: '{name} -c …' (a Python program calling huggingface_hub.login) is not a launch" in notes
    assert f"line 4: '{python} -u prefetch.py --token $HF_TOKEN' is not a launch" in notes  # the value hidden
    assert _SECRET not in specmod.dump(dep)


def test_a_python_programs_output_in_the_launch_is_a_placeholder_or_refused() -> None:
    dep = _parse("M=$(python3 -c 'print(1)')\nvllm serve Qwen/Qwen3-0.6B --max-num-seqs \"$M\"\n")
    assert list(dep.engine.args)[-2:] == ["--max-num-seqs", "<M>"]
    assert "line 1: M is the output of 'python3 -c …' (a Python program calling print)" in "\n".join(
        dep.notes
    )
    message = refusal("vllm serve Qwen/Qwen3-0.6B --max-num-seqs $(python3 -c 'print(1)')\n")
    assert "'python3 -c …' (a Python program calling print) runs on the machine" in message


@pytest.mark.parametrize(
    ("text", "fragment"),
    [
        ("python3 train.py --epochs 3\n", "line 1: 'python3' is not a vLLM launch command"),
        ("python -m vllm.entrypoints.api_server --model a/b\n", "is not vLLM's OpenAI server"),
    ],
)
def test_a_python_that_is_the_only_command_is_still_judged_as_the_launch(text: str, fragment: str) -> None:
    assert fragment in refusal(text)


@pytest.mark.parametrize(
    ("text", "args", "placeholders"),
    [
        ('MODEL="${1:-}"\nvllm serve "$MODEL" --port 8000\n', ["<1>", "--port", "8000"], ["<1>"]),
        ('vllm serve ${MODEL:-} --port "${PORT-}"\n', ["<MODEL>", "--port", "<PORT>"], ["<MODEL>", "<PORT>"]),
        ('M=Qwen/Qwen3-0.6B\nvllm serve "${M:-""}" --port 8000\n', ["Qwen/Qwen3-0.6B", "--port", "8000"], []),
        ('if [ -z "${1:-}" ]; then echo usage; exit 1; fi\nvllm serve "$1"\n', ["<1>"], ["<1>"]),
    ],
    ids=["positional", "variables", "set-by-the-text", "usage-guard"],
)  # fmt: skip
def test_an_empty_default_of_an_unknown_is_its_placeholder(
    text: str, args: list[str], placeholders: list[str], tmp_path: Path
) -> None:
    dep = _parse(text)
    assert list(dep.engine.args) == args
    assert sorted(dep.placeholders) == placeholders
    assert _served(text, tmp_path, dep) == args


def test_a_commands_output_never_reaches_the_user_as_rigsmiths_token() -> None:
    message = refusal(
        "vllm serve Qwen/Qwen3-0.6B --tensor-parallel-size $(nproc) --served-model-name x$(hostname)\n"
    )
    assert "@@rigsmith" not in message
    assert "'nproc' runs on the machine" in message and "'hostname' runs on the machine" in message
    # a check after bash's on the argv quotes the output as what it is
    message = refusal("vllm serve Qwen/Qwen3-0.6B --tensor-parallel-size x$(nproc)\n")
    assert "@@rigsmith" not in message
    assert "--tensor-parallel-size takes a whole number" in message and "'x<output of nproc>'" in message
    dep = _parse("nvidia-smi -L | wc -l\nvllm serve Qwen/Qwen3-0.6B\n")
    assert "@@rigsmith" not in "\n".join(dep.notes)


def test_a_variable_holding_a_commands_output_is_its_placeholder(tmp_path: Path) -> None:
    # Mengfanzhe0127/cot_rec: GPU_COUNT=$(echo "$GPU_ID" | awk -F',' '{print NF}') sizes the parallelism
    text = (
        "GPU_ID=$1\nGPU_COUNT=$(echo \"$GPU_ID\" | awk -F',' '{print NF}')\n"
        'CUDA_VISIBLE_DEVICES=${GPU_ID} vllm serve Qwen/Qwen3-0.6B --tensor-parallel-size "${GPU_COUNT}"\n'
    )
    dep = _parse(text)
    assert list(dep.engine.args) == ["Qwen/Qwen3-0.6B", "--tensor-parallel-size", "<GPU_COUNT>"]
    assert sorted(dep.placeholders) == ["<1>", "<GPU_COUNT>"]
    assert "line 2: GPU_COUNT is the output of 'awk -F, {print NF}'" in "\n".join(dep.notes)
    # a decision on it is still refused
    message = refusal('N=$(nproc)\nif [ "$N" -gt 4 ]; then vllm serve a/b -tp 4; else vllm serve a/b; fi\n')
    assert "bash decides on the output of 'nproc' (line 1)" in message


@pytest.mark.parametrize(
    ("text", "where"),
    [
        ('if [ ${#1} -gt 5 ]; then exit 1; fi\nvllm serve "$1"\n', "line 1: bash decides on|<1>"),
        ("P=${MODEL:0:3}\ncase $P in ab) exit 1;; esac\nvllm serve a/b\n", "line 2: bash decides on|<MODEL>"),
        ("if (( ${#1} + 1 > 4 )); then vllm serve a/b; fi\n", "line 1: bash decides on|<1>"),
        ("for ((i = 0; i < ${#GPUS}; i++)); do :; done\nvllm serve a/b\n", "line 1: bash decides on|<GPUS>"),
        ("vllm serve a/b --max-num-seqs ${#NAME}\n", "line 1: bash launches with|<NAME>"),
    ],
    ids=["length", "substring-case", "arithmetic", "loop-bound", "launched-length"],
)  # fmt: skip
def test_a_decision_on_a_value_made_from_a_placeholder_is_refused_naming_line_and_placeholder(
    text: str, where: str
) -> None:
    said, mark = where.split("|")
    assert f"{said} a value made from the placeholder {mark}" in refusal(text)


def test_only_the_placeholder_decided_on_is_named() -> None:
    message = refusal('if [ ${#2} -gt 3 ]; then :; fi\nvllm serve "$1" --port "$2"\n')
    assert "the placeholder <2>" in message and "placeholder <1>" not in message


def test_a_placeholder_carried_whole_or_trimmed_of_a_prefix_imports(tmp_path: Path) -> None:
    text = 'vllm serve "$1" --served-model-name "${1##*/}" --port "${PORT:-8000}"\n'
    dep = _parse(text)
    assert list(dep.engine.args) == ["<1>", "--served-model-name", "<1>", "--port", "8000"]
    assert _served(text, tmp_path, dep) == list(dep.engine.args)


def _traced(words: list[bytes]) -> str:
    """The command ``true WORDS…`` as bash's ``set -x`` writes it, read as the jail reads it (bytes
    decoded, no newline translation)."""
    run = subprocess.run([b"bash", b"-xc", b'true "$@"', b"_", *words], capture_output=True, check=True)
    err = run.stderr.decode(errors="replace")
    assert err.startswith("+ ") and err.endswith("\n")
    return err[2:-1]


@settings(max_examples=200, deadline=None)
@given(st.lists(st.text(st.characters(blacklist_categories=("Cs",), blacklist_characters="\0"), max_size=12)))
def test_the_words_of_a_traced_command_are_the_words_bash_ran(words: list[str]) -> None:
    # bash's own `set -x` quoting (bare, '…', $'…') read back: what blanks and the secret filter see
    assert trace_words(_traced([w.encode() for w in words])) == ["true", *words]


def test_bytes_that_are_no_utf_8_are_read_as_the_jail_reads_the_trace() -> None:
    words = [b"\xff", b"a\x80b", b"\xc3\xa9", b"\x1b[1m\x01"]
    assert trace_words(_traced(words)) == [
        "true",
        *(w.decode(errors="replace") for w in words),
    ]


@pytest.mark.parametrize(
    "text",
    [
        'vllm serve "${MODEL:?set MODEL first}" --port 8000\n',
        ': "${MODEL:?give the model}"\nvllm serve "$MODEL" --port 8000\n',
    ],
)
def test_a_variable_the_text_requires_with_colon_question_is_its_placeholder(
    text: str, tmp_path: Path
) -> None:
    # `${NAME:?message}` is the author's "you must set this": bash stops there, rigsmith asks for it
    dep = _parse(text)
    assert list(dep.placeholders) == ["<MODEL>"]
    assert any(n.startswith("line 1: $MODEL: MODEL has no value") for n in dep.notes), dep.notes
    assert _served(text, tmp_path, dep)[:3] == ["<MODEL>", "--port", "8000"]


@pytest.mark.parametrize(("value", "hidden"), [("t0k3", True), ("t0k", False)])
def test_a_secret_value_is_hidden_from_four_characters_on(value: str, hidden: bool) -> None:
    # shorter values would hide ordinary words of the message; four and more are the secret's
    text = (
        f"export HF_TOKEN={value}\n"
        'vllm serve Qwen/Qwen3-0.6B --x "$(curl -s -H "Authorization: Bearer $HF_TOKEN" https://h/a)"\n'
    )
    message = refusal(text)
    assert ("Bearer $HF_TOKEN" in message) is hidden and (f"Bearer {value}" in message) is not hidden
