"""Issue 25: pasted scripts are evaluated (never executed) into the one command they run.

The oracle is bash: the published text and the interpreted text run under ``bash`` with stub launchers
that print their argv; both give the spec's argv. A property test drives generated scripts through the
evaluator under an audit hook that records every process start and file open.
"""

from __future__ import annotations

import json
import os
import shlex
import sys
from pathlib import Path
from typing import Any, ClassVar

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rigsmith.importing import recipe, shelleval, shellparse
from rigsmith.spec import Deployment
from tests.support.bashoracle import bash_argv
from tests.support.recipes import HERE, corpus, refusal

SCRIPTS: list[dict[str, Any]] = json.loads((HERE / "data" / "shell-scripts.json").read_text(encoding="utf-8"))
_CORPUS = {c["id"]: c for c in corpus()}


def _raw(case: dict[str, Any]) -> str:
    return str(_CORPUS[case["id"]]["raw"] if case.get("corpus") else case["raw"])


def _parse(text: str, accept: bool = False) -> Deployment:
    return recipe.parse(text, source="t", sha256="0" * 64, accept=accept)


def _args_of(argv: list[str], dep: Deployment) -> list[str]:
    eng = dep.engine
    if argv[0] in ("docker", "podman"):
        assert eng.image is not None
        return argv[argv.index(eng.image) + 1 :]
    if argv[0].startswith("python"):
        return argv[argv.index("-m") + 2 :]
    return argv[1 + len(eng.subcommand) :]


@pytest.mark.parametrize("case", SCRIPTS, ids=[c["id"] for c in SCRIPTS])
def test_published_script(case: dict[str, Any], tmp_path: Path) -> None:
    text, accept = _raw(case), bool(case.get("yes"))
    if "refused" in case:
        with pytest.raises(Exception) as err:
            _parse(text, accept)
        for fragment in case["refused"]:
            assert fragment in str(err.value)
        return
    dep = _parse(text, accept)
    assert list(dep.engine.args) == case["args"]
    notes = "\n".join(dep.notes)
    for fragment in case.get("notes_contain", []):
        assert fragment in notes
    interpreted = shelleval.evaluate(text, accept=accept)
    assert interpreted.changed
    # bash on the interpreted text gives the spec's argv, byte for byte
    assert _args_of(bash_argv(interpreted.text, tmp_path), dep) == case["args"]
    if not accept and not shellparse.strip_prompts(text)[1] and case.get("bash_original", True):
        # and bash on the published text itself, where bash runs it as its author meant (a prompt is not)
        assert _args_of(bash_argv(text, tmp_path), dep) == case["args"]


# -- each form ---------------------------------------------------------------------------------------

FORMS = [
    # (text, args, env, a note fragment)
    (
        "MODEL=Qwen/Qwen3-0.6B\nexport CUDA_VISIBLE_DEVICES=0,1\n"
        "vllm serve $MODEL -tp 2 --port ${PORT:-8001}\n",
        ["Qwen/Qwen3-0.6B", "-tp", "2", "--port", "8001"],
        {"CUDA_VISIBLE_DEVICES": "0,1"},
        "${PORT:-8001} is its default '8001'",
    ),
    (
        'ARGS="--tensor-parallel-size 2  --port 8000"\nEMPTY=\n'
        'vllm serve Qwen/Qwen3-0.6B $ARGS $EMPTY "${EMPTY}" '
        "${EMPTY:+--x} ${ARGS:+--enforce-eager} ${N:=3} --max-num-seqs $N\n",
        [
            "Qwen/Qwen3-0.6B",
            "--tensor-parallel-size",
            "2",
            "--port",
            "8000",
            "",
            "--enforce-eager",
            "3",
            "--max-num-seqs",
            "3",
        ],
        {},
        "shell variable(s) ARGS",
    ),
    (
        "(venv) $ source .venv/bin/activate && vllm serve Qwen/Qwen3-0.6B 2>&1 | tee -a server.log\n",
        ["Qwen/Qwen3-0.6B"],
        {},
        "'| tee …' dropped",
    ),
    (
        "$ cd /srv/vllm\n$ conda activate vllm\n$ nohup python -u -m vllm.entrypoints.openai.api_server \\\n"
        ">   --model Qwen/Qwen3-0.6B --port 8000 > out.log 2>&1 &\n",
        ["--model", "Qwen/Qwen3-0.6B", "--port", "8000"],
        {},
        "'cd /srv/vllm'",
    ),
    (
        'NVLINK=1\nif [ "${NVLINK:-0}" = 1 ]; then\n  vllm serve Qwen/Qwen3-0.6B -tp 2\n'
        'elif [ -n "$X" ]; then\n'
        "  exit 1\nelse\n  vllm serve Qwen/Qwen3-0.6B -tp 2 --disable-custom-all-reduce\nfi\n",
        ["Qwen/Qwen3-0.6B", "-tp", "2"],
        {},
        "bash takes the 'then' branch",
    ),
    (
        'if [ -z "${NVLINK:-}" ]; then EXTRA=--disable-custom-all-reduce; fi\n'
        "vllm serve Qwen/Qwen3-0.6B -tp 2 $EXTRA\n",
        ["Qwen/Qwen3-0.6B", "-tp", "2", "--disable-custom-all-reduce"],
        {},
        "the test '[ -z \"${NVLINK:-}\" ]' is true",
    ),
    (
        "export HF_HOME=/data/hf\n"
        "bash -c 'export VLLM_LOGGING_LEVEL=DEBUG && exec vllm serve Qwen/Qwen3-0.6B "
        "--max-model-len ${LEN:-4096}'\n",
        ["Qwen/Qwen3-0.6B", "--max-model-len", "4096"],
        {"HF_HOME": "/data/hf", "VLLM_LOGGING_LEVEL": "DEBUG"},
        "'bash -c SCRIPT'",
    ),
    (
        "set -euo pipefail\nTP=2\necho starting\n"
        'vllm serve Qwen/Qwen3-0.6B --served-model-name "$NAME" -tp $TP\n',
        ["Qwen/Qwen3-0.6B", "--served-model-name", "<NAME>", "-tp", "2"],
        {},
        "it is the placeholder <NAME>",
    ),
]


@pytest.mark.parametrize(("text", "args", "env", "note"), FORMS, ids=[str(i) for i in range(len(FORMS))])
def test_script_form_imports_with_bashs_argv(
    text: str, args: list[str], env: dict[str, str], note: str, tmp_path: Path
) -> None:
    dep = _parse(text)
    assert list(dep.engine.args) == args
    assert {e.name: e.value for e in dep.env} == env
    assert note in "\n".join(dep.notes)
    interpreted = shelleval.evaluate(text)
    assert _args_of(bash_argv(interpreted.text, tmp_path), dep) == args
    if "<NAME>" not in args and "$ " not in text and "bash -c" not in text:  # stubs do not reach a child bash
        assert _args_of(bash_argv(text, tmp_path), dep) == args


@pytest.mark.parametrize(
    ("text", "fragment"),
    [
        ("vllm serve Qwen/Qwen3-0.6B --max-num-seqs 8(here change to 1)\n", "bash stops with a syntax error"),
        ("ARGS=(--tp 2)\nvllm serve Qwen/Qwen3-0.6B\n", "an array assignment"),
        ("for m in a b; do vllm serve $m; done\n", "shell control flow ('for')"),
        (
            "M=$(cat model.txt)\nvllm serve $M\n",
            "M, which is set on line 1 by command substitution $(cat model.txt)",
        ),
        ("source ./env.sh\nvllm serve Qwen/Qwen3-0.6B\n", "reads a file the text does not contain"),
        ("if [ -f /etc/x ]; then vllm serve a/b; fi\n", "is not a comparison rigsmith decides"),
        ('if [ "$GPU" = a100 ]; then vllm serve a/b; fi\n', "the 'if' test depends on GPU"),
        ("vllm serve Qwen/Qwen3-0.6B --port $((8000 + 1))\n", "$((8000 + 1)) in the command is arithmetic"),
        ("vllm serve Qwen/Qwen3-0.6B | grep -v DEBUG\n", "piped ('|') into 'grep'"),
        ("vllm serve Qwen/Qwen3-0.6B --chat-template $'a\\nb'\n", "is ANSI-C quoted string"),
        ("docker run vllm/vllm-openai:v0.11.0 Qwen/Qwen3-0.6B --x $'\\t'\n", "is ANSI-C quoted string"),
        ("VLLM_USE_MODELSCOPE=True vllm serve Qwen/Qwen3-0.6B\n", "env VLLM_USE_MODELSCOPE is set"),
        ("export VLLM_USE_MODELSCOPE=1\nvllm serve qwen/Qwen3-0.6B\n", "ModelScope"),
        ("vllm serve Qwen/Qwen3-0.6B --port 1 || exit 1\n", "'||' runs the next command only when"),
    ],
)
def test_outside_the_subset_is_refused_naming_it(text: str, fragment: str) -> None:
    assert fragment in refusal(text)


def test_what_bash_would_break_on_is_asked_and_recorded_when_accepted(tmp_path: Path) -> None:
    text = "vllm serve Qwen/Qwen3-0.6B \\\n  --port 8000 \\  # the port\n  -tp 2\n"
    message = refusal(text)
    assert "--yes imports the lines as one command" in message and "re-run with --yes" in message
    dep = _parse(text, accept=True)
    assert list(dep.engine.args) == ["Qwen/Qwen3-0.6B", "--port", "8000", "-tp", "2"]
    assert any(n.startswith("accepted with --yes: line 2:") for n in dep.notes)
    assert _args_of(bash_argv(shelleval.evaluate(text, accept=True).text, tmp_path), dep) == list(
        dep.engine.args
    )


def test_python_interpreter_options_before_m_are_accepted() -> None:
    dep = _parse("python3 -u -X dev -m vllm.entrypoints.openai.api_server --model Qwen/Qwen3-0.6B\n")
    assert (dep.engine.executable, list(dep.engine.args)) == ("python3", ["--model", "Qwen/Qwen3-0.6B"])
    assert any("'-u -X dev' before -m dropped" in n for n in dep.notes)


def test_a_plain_command_is_handed_on_unchanged() -> None:
    text = "vllm serve Qwen/Qwen3-0.6B --port 8000 -e X=$Y\n"
    assert not shelleval.evaluate(text).changed


# -- the evaluator never runs anything ------------------------------------------------------------

_NAME = st.sampled_from(["MODEL", "TP", "PORT", "EXTRA", "X"])
_VALUE = st.text(alphabet="abc/-_.: 0129*?'\"$", max_size=12)
_REF = st.builds(
    lambda name, op, arg: f"${{{name}{op}{arg}}}" if op else f"${name}",
    _NAME,
    st.sampled_from(["", ":-", "-", ":=", ":+", "+"]),
    st.text(alphabet="abc0129-", max_size=5),
)
_WORD = st.one_of(
    st.text(alphabet="abcxyz0123-/.=", min_size=1, max_size=8),
    _REF,
    _REF.map(lambda r: f'"{r}"'),
    _VALUE.map(shlex.quote),
)
_LINE = st.one_of(
    st.builds(lambda n, v: f"{n}={shlex.quote(v)}", _NAME, _VALUE),
    st.builds(lambda n, v: f"export {n}={shlex.quote(v)}", _NAME, _VALUE),
    st.just("cd /tmp/x"),
    st.just("source venv/bin/activate"),
    st.builds(
        lambda n, v: f'if [ "${{{n}:-}}" = {shlex.quote(v)} ]; then {n}=1; else {n}=2; fi', _NAME, _VALUE
    ),
)
_SERVE = st.builds(
    lambda pre, words, post: f"{pre}vllm serve Qwen/Qwen3-0.6B {' '.join(words)}{post}",
    st.sampled_from(["", "nohup ", "$ ", "exec "]),
    st.lists(_WORD, max_size=6),
    st.sampled_from(["", " > log 2>&1", " &", " 2>&1 | tee log", " > log 2>&1 &"]),
)
_SCRIPT = st.builds(
    lambda lines, serve: "\n".join([*lines, serve]) + "\n", st.lists(_LINE, max_size=4), _SERVE
)


class _Audit:
    """Records the audit events of process starts and file opens while ``armed``."""

    EVENTS = (
        "subprocess.Popen",
        "os.system",
        "os.exec",
        "os.posix_spawn",
        "os.spawn",
        "os.fork",
        "open",
        "os.listdir",
        "os.scandir",
        "pty.spawn",
    )
    armed = False
    seen: ClassVar[list[str]] = []

    @classmethod
    def hook(cls, event: str, args: tuple[object, ...]) -> None:
        if cls.armed and event.startswith(cls.EVENTS):
            cls.seen.append(f"{event} {args!r}"[:200])


sys.addaudithook(_Audit.hook)


@given(_SCRIPT)
@settings(max_examples=int(os.environ.get("SHELLEVAL_EXAMPLES", "60")), deadline=None)
def test_evaluation_starts_no_process_reads_no_file_and_matches_bash(script: str) -> None:
    import tempfile

    _Audit.seen.clear()
    _Audit.armed = True
    try:
        result = shelleval.evaluate(script)
    finally:
        _Audit.armed = False
    assert _Audit.seen == []
    assert result.problems == [] and result.asks == []  # the generated scripts stay inside the subset
    # bash cannot run a prompt: the published text without it is what the author ran
    typed = script.replace("\n$ ", "\n").removeprefix("$ ")
    with tempfile.TemporaryDirectory() as tmp:
        want = bash_argv(typed, Path(tmp))
        got = bash_argv(result.text, Path(tmp))
    placeholders = [w for w in got if w.startswith("<") and w.endswith(">")]
    if not placeholders:
        assert got == want


# -- bash -c inside a container ----------------------------------------------------------------------


def test_compose_entrypoint_script_runs_its_one_command_with_the_services_args() -> None:
    text = (
        "services:\n  vllm:\n    image: vllm/vllm-openai:v0.11.0\n    environment:\n      - X=1\n"
        "    entrypoint: [/bin/bash, -c, 'export X=2 && exec vllm serve \"$$@\" --port 8000', --]\n"
        "    command: [Qwen/Qwen3-0.6B, -tp, '2']\n"
    )
    dep = _parse(text)
    assert (dep.engine.executable, list(dep.engine.args)) == (
        "vllm",
        ["Qwen/Qwen3-0.6B", "-tp", "2", "--port", "8000"],
    )
    assert {e.name: e.value for e in dep.env} == {"X": "2"}  # the script's export is set after the service's
    assert any("'/bin/bash -c SCRIPT'" in n for n in dep.notes)


def test_docker_run_image_bash_c_runs_the_scripts_command() -> None:
    dep = _parse(
        "docker run --gpus all vllm/vllm-openai:v0.11.0 bash -c "
        "'cd /work && export VLLM_CPU_KVCACHE_SPACE=40 && python3 -m vllm.entrypoints.openai.api_server "
        "--model Qwen/Qwen3-0.6B --port 80'\n"
    )
    assert (dep.engine.executable, list(dep.engine.args)) == (
        "python3",
        ["--model", "Qwen/Qwen3-0.6B", "--port", "80"],
    )
    assert ("VLLM_CPU_KVCACHE_SPACE", "40") in [(e.name, e.value) for e in dep.env]
    assert any("'cd /work'" in n for n in dep.notes)


def test_a_container_script_outside_the_subset_is_refused_naming_it() -> None:
    message = refusal("docker run vllm/vllm-openai:v0.11.0 bash -c 'for i in 1 2; do vllm serve a/b; done'\n")
    assert "the bash -c script: " in message and "shell control flow ('for')" in message


def test_a_pasted_terminal_session_drops_the_output_after_the_prompted_command() -> None:
    # vLLM issue 13124's comment: the prompt, the command, then the server's log
    text = (
        "(qwen25vl) lzh@instance-aw1rhmsz-5:~/Code/qwen2_5vl$ "
        "vllm serve Qwen/Qwen2.5-VL-7B-Instruct --port 6006\n"
        "INFO 02-12 13:31:03 __init__.py:190] Automatically detected platform cuda.\n"
        "INFO 02-12 13:31:04 api_server.py:840] vLLM API server version 0.7.2\n"
    )
    dep = _parse(text)
    assert list(dep.engine.args) == ["Qwen/Qwen2.5-VL-7B-Instruct", "--port", "6006"]
    assert any("line(s) 2-3: terminal output after a prompted command" in n for n in dep.notes)


def test_the_recipe_json_command_is_read_with_the_same_rules() -> None:
    text = json.dumps({"title": "t", "command": "MODEL=Qwen/Qwen3-0.6B\nnohup vllm serve $MODEL -tp 2 &"})
    dep = _parse(text)
    assert list(dep.engine.args) == ["Qwen/Qwen3-0.6B", "-tp", "2"]
    assert any("'nohup' dropped" in n for n in dep.notes)


@pytest.mark.parametrize(
    "text",
    ["$((1+2", "$(echo hi", "`echo hi", "${MODEL", "$'abc", "'abc", '"abc', '"$((1"'],
)
def test_a_construct_never_closed_is_refused_not_lexed_forever(text: str) -> None:
    # Found by the mangled-corpus fuzz test: an unclosed $(( sent the lexer back to the start of the text.
    assert "never closed" in refusal(f"vllm serve Qwen/Qwen3-0.6B --port {text}\n")
