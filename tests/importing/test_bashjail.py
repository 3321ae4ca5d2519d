"""Issue 35: a pasted script is run by GNU bash itself, jailed in bubblewrap, to learn what it launches.

The oracle is plain bash outside the jail with recording stubs on PATH: for generated scripts and for the
constructs the hand-written subset got wrong, the argv rigsmith imports is the argv bash hands the launcher.
The jail tests run hostile scripts for real and look at the host afterwards: nothing written, nothing read,
no connection made, no process left.
"""

from __future__ import annotations

import json
import os
import shlex
import socket
import subprocess
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from rigsmith.errors import RecipeError
from rigsmith.importing import bashjail, jailread, jailrun, recipe
from rigsmith.importing.recipe.command import script as scriptform
from rigsmith.spec import Deployment
from tests.support.bashoracle import recording
from tests.support.common import require
from tests.support.recipes import HERE, corpus, refusal

SCRIPTS: list[dict[str, Any]] = json.loads((HERE / "data" / "shell-scripts.json").read_text(encoding="utf-8"))
_CORPUS = {c["id"]: c for c in corpus()}

#: A launcher on PATH that appends its argv (NUL-separated, one record a line) to $ARGV_OUT; a wrapper runs
#: what it wraps.
_RECORDER = '#!/bin/bash\n{ printf "%s\\0" "${0##*/}" "$@"; printf "\\n"; } >> "$ARGV_OUT"\n'
_WRAPPER = '#!/bin/bash\nexec "$@"\n'


def _parse(text: str) -> Deployment:
    return recipe.parse(text, source="t", sha256="0" * 64)


#: What bash said on stderr in the last oracle run (its own diagnostics, ``bash: line N: …``).
_complaints: list[str] = []


def oracle(text: str, tmp: Path, blanks: Sequence[str] = ()) -> list[list[str]]:
    """Every launcher argv plain bash (outside any jail) runs for ``text``, stubs on PATH; each of ``blanks``
    (a name the text assigns only the empty string) holds its placeholder whatever the text assigns it
    (``readonly NAME='<NAME>'`` first: bash's own complaint about those assignments is no complaint)."""
    bash = require("bash")
    bodies = {"vllm": _RECORDER, "docker": _RECORDER, "python3": _RECORDER, "nohup": _WRAPPER}
    work, out, env = recording(tmp, bodies)
    filled = "".join(f"readonly {n}='<{n}>'\n" for n in blanks)
    proc = subprocess.run(
        [bash, "--norc", "--noprofile", "-c", filled + text],
        env=env,
        cwd=work,
        capture_output=True,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    _complaints[:] = [
        ln
        for ln in proc.stderr.decode().splitlines()
        if ln.split(": ", 1)[0].endswith("bash")
        and not any(ln.endswith(f": {n}: readonly variable") for n in blanks)
    ]
    records = out.read_bytes().split(b"\0\n")[:-1] if out.exists() else []
    return [r.decode().split("\0") for r in records]


def jailed(text: str) -> list[list[str]]:
    answer = bashjail.run(text)
    assert answer.problems == []
    return [list(c.argv) for c in answer.calls]


def _imported_args(text: str) -> list[str]:
    """The argv after ``vllm serve`` that the importer hands on (before the spec is assembled)."""
    launch = scriptform.from_script(text, "t", accept=False)
    assert launch.problems == []
    return list(launch.args)


# -- the property: generated scripts, bash's argv ---------------------------------------------------------

_NAMES = ("A", "B", "C")
_VALUE = st.text(alphabet="abc019 -_/.,=:@%+*", max_size=10)
_WORDLIT = st.text(alphabet="abc019-_/.,", min_size=1, max_size=6)
_REF = st.sampled_from(
    [
        "$A", '"$A"', "${B}", '"${B}"', "$C", '"$C"', '"${Z:-"a b"}"', "${Z:-x,y z}", '"${A:-d}"',
        "${A:+alt}", '"${B:+"q r"}"', '"${ARR[@]}"', "${ARR[@]}", '"${ARR[*]}"', '"${#A}"', "${A%%,*}",
        '"${B/a/X}"',
    ]
)  # fmt: skip


def _stmt() -> st.SearchStrategy[str]:
    name = st.sampled_from(_NAMES)
    quoted = _VALUE.map(shlex.quote)
    pattern = st.sampled_from(["a*", '"a*"', "*,*", "''", "[ab]?", "?", "*"])
    return st.one_of(
        st.builds(lambda n, v: f"{n}={v}", name, quoted),
        st.builds(lambda n, v: f"{n}+={v}", name, quoted),
        st.builds(lambda n, r: f"{n}={r}", name, _REF),
        st.sampled_from(["IFS=,", "IFS=' '", "IFS=$' \\t\\n'", "IFS=,:"]),
        st.builds(lambda a, b: f"ARR=({a} {b})", quoted, _REF),
        st.builds(lambda a: f"ARR+=({a})", quoted),
        st.builds(lambda n, r: f'for w in {r}; do {n}+="[$w]"; done', name, _REF),
        st.builds(lambda n, r, p: f"case {r} in {p}) {n}=hit;; *) {n}+=miss;; esac", name, _REF, pattern),
        st.builds(lambda n, r: f'f() {{ {n}="$1|$#|${{2:-none}}"; }}; f {r} x', name, _REF),
        st.builds(lambda n, r, p: f"if [[ {r} == {p} ]]; then {n}=yes; else {n}=no; fi", name, _REF, pattern),
        st.builds(lambda n: f"[[ 010 -eq 8 ]] && {n}+=oct", name),
        st.builds(lambda n, r: f"[ -n {r} ] && {n}+=nonempty || {n}+=empty", name, _REF),
    )


_SCRIPT = st.builds(
    lambda inits, body, refs, pre: "\n".join(
        [*(f"{n}={shlex.quote(v)}" for n, v in zip(_NAMES, inits, strict=True)), "ARR=()", *body,
         f"{pre}vllm serve Qwen/Qwen3-0.6B {' '.join(refs)} --port 8000"]
    ) + "\n",
    st.tuples(_VALUE, _VALUE, _VALUE),
    st.lists(_stmt(), max_size=6),
    st.lists(st.one_of(_REF, _WORDLIT), max_size=5),
    st.sampled_from(["", "nohup ", "exec "]),
)  # fmt: skip


@given(script=_SCRIPT)
@settings(
    max_examples=int(os.environ.get("BASHJAIL_EXAMPLES", "30")),
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture],
)
def test_a_generated_script_imports_the_argv_bash_runs(script: str, tmp_path: Path) -> None:
    answer = bashjail.run(script)
    # a name assigned only '' whose expansion bash leaves a flag (`-a $A`) without a value is a blank to
    # fill: bash runs the text with it filled, and a test on it is a decision on a placeholder
    want = oracle(script, tmp_path, list(answer.blanks))
    assert len(want) == 1
    if _complaints:  # bash itself reported an error on the way (`[ -n x,y z ]`): the import says so
        assert answer.problems
        return
    if answer.blanks and answer.problems:
        assert all("placeholder <" in p for p in answer.problems), answer.problems
        return
    assert [list(c.argv) for c in answer.calls] == want and answer.problems == []
    assert _imported_args(script) == want[0][2:]


# -- what the hand-written subset got wrong (issue 35's examples) -------------------------------------------

REGRESSIONS = [
    'ARGS="--port 8000"\nARGS+=" --max-num-seqs 8"\nvllm serve Qwen/Qwen3-0.6B $ARGS\n',
    "IFS=,\nL=a,b\nvllm serve Qwen/Qwen3-0.6B --x $L\n",
    'vllm serve Qwen/Qwen3-0.6B --served-model-name ${X:-"a b"}\n',
    'vllm serve Qwen/Qwen3-0.6B --served-model-name "${X:-a\\b}"\n',
    "X=\nif [ -n $X ]; then T=2; else T=1; fi\nvllm serve Qwen/Qwen3-0.6B -tp $T\n",
    "x=abc\nif [[ $x == a* ]]; then T=2; else T=1; fi\nvllm serve Qwen/Qwen3-0.6B -tp $T\n",
    "if [[ 010 -eq 8 ]]; then T=2; else T=1; fi\nvllm serve Qwen/Qwen3-0.6B -tp $T\n",
    'M=(Qwen/Qwen3-0.6B --port 8000)\nfor i in 1 2; do M+=(--x$i); done\nvllm serve "${M[@]}"\n',
    'f() { vllm serve "$@" --port 8000; }\nf Qwen/Qwen3-0.6B -tp 2\n',
    "eval 'vllm serve Qwen/Qwen3-0.6B' '--port 80$((1+1))'\n",
]


@pytest.mark.parametrize("text", REGRESSIONS, ids=[str(i) for i in range(len(REGRESSIONS))])
def test_what_the_subset_got_wrong_is_bashs_argv(text: str, tmp_path: Path) -> None:
    (want,) = oracle(text, tmp_path)
    assert list(_parse(text).engine.args) == want[2:]


def test_an_unset_variable_is_its_placeholder_by_bashs_own_account() -> None:
    dep = _parse('A=$MODEL\nvllm serve $A --port ${PORT:-8001} --served-model-name "$1"\n')
    assert list(dep.engine.args)[-4:] == ["--port", "8001", "--served-model-name", "<1>"]
    assert sorted(dep.placeholders) == ["<1>", "<MODEL>"]
    assert any("line 1: $MODEL: MODEL has no value" in n for n in dep.notes)


@pytest.mark.parametrize(
    ("text", "fragment"),
    [
        ('if [ "$GPU" = a100 ]; then vllm serve a/b; fi\n', "line 1: bash decides on the placeholder <GPU>"),
        ("case $GPU in a100) vllm serve a/b;; esac\n", "line 1: bash decides on the placeholder <GPU>"),
        ("for i in $(seq 1 $N); do :; done\nvllm serve a/b\n", "bash decides on the output of 'seq 1 <N>'"),
        ("vllm serve a/b -tp $((N * 2))\n", "line 1: bash stops with"),
        ("vllm serve a/b -tp $(nproc)\n", "line 1: 'nproc' runs on the machine, and rigsmith does not"),
        ("T=$(nvidia-smi -L | wc -l)\nif [ $T -gt 4 ]; then vllm serve a/b; fi\n", "the output of 'wc -l'"),
        ("source ./env.sh\nvllm serve Qwen/Qwen3-0.6B\n", "line 1: 'source ./env.sh' reads a file the"),
        ("curl -s http://x/setup.sh\n", "line 1: 'curl' is not a vLLM launch command"),
        ("vllm serve Qwen/Qwen3-0.6B\n  --port 8000\n", "line 2 starts with the option '--port'"),
    ],
)  # fmt: skip
def test_a_decision_or_command_outside_the_launchers_is_refused_naming_the_line(
    text: str, fragment: str
) -> None:
    assert fragment in refusal(text)


@pytest.mark.parametrize(
    "guard",
    [
        'if [ -z "$1" ]; then echo "usage: $0 MODEL"; exit 1; fi',
        "[[ -n $1 ]] || exit 2",
        'test -z "$1" && exit 1',
        'if [ ! "$1" ]; then exit 1; fi',
    ],
)
def test_a_usage_guard_on_an_argument_imports_with_the_placeholder(guard: str, tmp_path: Path) -> None:
    # q1w2e3r4-1/TowerDefense-JiuKun start_vllm_server.sh: whether a filled placeholder is empty is known
    text = f'{guard}\nvllm serve "$1" --port 8000\n'
    dep = _parse(text)
    assert list(dep.engine.args) == ["<1>", "--port", "8000"]
    assert "tests whether a placeholder is empty" in "\n".join(dep.notes)
    assert jailed(text) == [["vllm", "serve", "<1>", "--port", "8000"]]


@pytest.mark.parametrize(
    "test",
    [
        '[ "$1" = foo ]',
        '[ -d "$1" ]',
        "[[ -z $1 || $1 == x ]]",
        '[ -z "$1" ] || [ "$1" != a/b ]',
        # a case word is expanded where the command runs: "$1" is the text's argument, not the trap's own
        'case "$1" in foo) true;; *) false;; esac',
        "case ${1%/*} in Qwen) true;; *) false;; esac",
    ],
)
def test_a_test_of_what_a_placeholder_holds_is_still_refused(test: str) -> None:
    message = refusal(f'if {test}; then exit 1; fi\nvllm serve "$1"\n')
    assert "bash decides on the placeholder <1>" in message


def test_a_case_on_a_placeholder_is_refused_quoting_the_case() -> None:
    message = refusal('case "$1" in a*) T=2;; *) T=1;; esac\nvllm serve Qwen/Qwen3-0.6B -tp $T\n')
    assert (
        'line 1: bash decides on the placeholder <1> (case "$1" in), a value the text does not give'
        in message
    )


def test_a_case_on_a_functions_own_argument_is_the_functions() -> None:
    dep = _parse(
        'tp() { case "$1" in big) T=4;; *) T=1;; esac; }\ntp big\nvllm serve Qwen/Qwen3-0.6B -tp $T\n'
    )
    assert dep.engine.args == ("Qwen/Qwen3-0.6B", "-tp", "4")


@pytest.mark.parametrize(
    ("uses", "note"),
    [
        ('"$1"', "the text uses its argument $1, which nobody passes here; it is the placeholder <1>,"),
        (
            '"$1" --x "$2"',
            "the text uses its arguments $1..$2, which nobody passes here; they are the placeholders "
            "<1>..<2>",
        ),
    ],
)
def test_the_arguments_note_counts_them(uses: str, note: str) -> None:
    assert any(n.startswith(note) for n in _parse(f"vllm serve {uses}\n").notes)


def test_a_command_whose_output_does_not_reach_the_launch_is_a_note() -> None:
    dep = _parse("nvidia-smi\npip install vllm\nvllm serve Qwen/Qwen3-0.6B --port 8000 2>&1 | tee log\n")
    notes = "\n".join(dep.notes)
    for cmd in ("line 1: 'nvidia-smi'", "line 2: 'pip install vllm'", "line 3: 'tee log'"):
        assert f"{cmd} is not a launch command; rigsmith does not run it" in notes


@pytest.mark.parametrize(
    ("text", "args", "env", "note"),
    [
        (
            "export HF_HOME=/data/hf\nsudo -E env VLLM_LOGGING_LEVEL=DEBUG nohup bash -c 'exec vllm serve "
            "Qwen/Qwen3-0.6B --max-model-len ${LEN:-4096}' &\n",
            ["Qwen/Qwen3-0.6B", "--max-model-len", "4096"],
            {"HF_HOME": "/data/hf", "VLLM_LOGGING_LEVEL": "DEBUG"},
            "'sudo -E' dropped",
        ),
        (
            "cd ~/srv && source .venv/bin/activate && python3 -u -m vllm.entrypoints.openai.api_server "
            "--model Qwen/Qwen3-0.6B > out.log 2>&1 &\n",
            ["--model", "Qwen/Qwen3-0.6B"],
            {},
            "'cd ~/srv': the recipe runs from ~/srv",
        ),
        (
            "/opt/venv/bin/vllm serve Qwen/Qwen3-0.6B --download-dir $HOME/models --port 8000\n",
            ["Qwen/Qwen3-0.6B", "--download-dir", "~/models", "--port", "8000"],
            {},
            "the model argument Qwen/Qwen3-0.6B",
        ),
    ],
)
def test_wrappers_reach_the_innermost_launcher(
    text: str, args: list[str], env: dict[str, str], note: str
) -> None:
    dep = _parse(text)
    assert list(dep.engine.args) == args
    assert {e.name: e.value for e in dep.env} == env
    assert note in "\n".join(dep.notes)


@pytest.mark.parametrize("case", SCRIPTS, ids=[c["id"] for c in SCRIPTS])
def test_published_script(case: dict[str, Any], tmp_path: Path) -> None:
    text = str(_CORPUS[case["id"]]["raw"] if case.get("corpus") else case["raw"])
    if "refused" in case:
        with pytest.raises(RecipeError) as err:
            _parse(text)
        for fragment in case["refused"]:
            assert fragment in str(err.value)
        return
    dep = _parse(text)
    assert list(dep.engine.args) == case["args"]
    notes = "\n".join(dep.notes)
    for fragment in case.get("notes_contain", []):
        assert fragment in notes


def test_a_compose_entrypoint_script_runs_its_command_with_the_services_args() -> None:
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


# -- the jail holds --------------------------------------------------------------------------------------


def _left_behind(marker: str) -> list[int]:
    """Processes whose command line holds ``marker`` (the script's text is bash's -c argument)."""
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                if marker.encode() in (entry / "cmdline").read_bytes():
                    found.append(int(entry.name))
            except OSError:
                continue
    return found


@pytest.fixture
def listening() -> Any:
    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen()
        server.setblocking(False)
        yield server


def _hostile(tmp_path: Path, port: int) -> dict[str, str]:
    secret = tmp_path / "secret"
    secret.write_text("s3cr3t-value\n", encoding="utf-8")
    return {
        "socket": f"exec 3<>/dev/tcp/127.0.0.1/{port}\nvllm serve Qwen/Qwen3-0.6B\n",
        "fork-bomb": "b() { b | b & }; b\nvllm serve Qwen/Qwen3-0.6B\n",
        "allocate": 'A=x\nwhile :; do A="$A$A"; done\nvllm serve Qwen/Qwen3-0.6B\n',
        "double-26": "A=x\n" + 'A="$A$A"\n' * 26 + 'vllm serve Qwen/Qwen3-0.6B --x "$A"\n',
        "sleep-forever": "while :; do :; done\nvllm serve Qwen/Qwen3-0.6B\n",
        "background-forever": "{ while :; do :; done; } &\nvllm serve Qwen/Qwen3-0.6B\n",
        "read-shadow": 'vllm serve Qwen/Qwen3-0.6B --x "$(< /etc/shadow)"\n',
        "read-ssh": 'vllm serve Qwen/Qwen3-0.6B --x "$(< ~/.ssh/id_rsa)"\n',
        "read-file": f'vllm serve Qwen/Qwen3-0.6B --x "$(< {secret})"\n',
        "fill-dev-shm": "printf x > /dev/shm/x\nvllm serve Qwen/Qwen3-0.6B\n",
        "fill-dev": "printf x > /dev/x\nvllm serve Qwen/Qwen3-0.6B\n",
        "kill-all": "kill -9 -1\nvllm serve Qwen/Qwen3-0.6B\n",
    }


@pytest.mark.parametrize(
    "name",
    ["socket", "fork-bomb", "allocate", "double-26", "sleep-forever",
     "background-forever", "read-shadow", "read-ssh", "read-file", "fill-dev-shm", "fill-dev", "kill-all"],
)  # fmt: skip
def test_a_hostile_script_is_refused_and_leaves_nothing_behind(
    name: str, tmp_path: Path, listening: socket.socket
) -> None:
    text = _hostile(tmp_path, listening.getsockname()[1])[name]
    marker = f"rigsmith-jail-test-{name}-{os.getpid()}"
    text = f"# {marker}\n{text}"
    with pytest.raises(RecipeError) as err:
        _parse(text)
    message = str(err.value)
    assert "Traceback" not in message and "s3cr3t-value" not in message
    assert not (tmp_path / "written").exists()
    with pytest.raises(BlockingIOError):
        listening.accept()  # no connection reached the host's loopback
    assert _left_behind(marker) == []


def test_a_file_the_text_writes_lands_in_the_jail_and_never_on_the_host(tmp_path: Path) -> None:
    # A log beside the script or in a directory of the machine (jyngjeon/multiagentsdebate vllm-serve.sh:
    # `> logs/vllm_server_qwen25.log`): bash stopped at the missing directory; the jail now makes it
    text = (
        f"echo pwned > {tmp_path}/sub/written\necho pwned > {tmp_path}/written\n"
        "echo pwned > ~/.rigsmith-jail-test\nexec 3<>/run/dbus/system_bus_socket\n"
        "nohup vllm serve Qwen/Qwen3-0.6B --port 8000 > logs/server.log 2>&1 &\n"
    )
    assert jailed(text) == [["vllm", "serve", "Qwen/Qwen3-0.6B", "--port", "8000"]]
    assert list(tmp_path.iterdir()) == []
    # reading a file the text does not hold is still bash's error, and refused
    message = refusal('read -r M < conf/model.txt\nvllm serve "$M"\n')
    assert "conf/model.txt: No such file or directory" in message


def test_the_jail_holds_no_environment_of_the_importing_process(monkeypatch: pytest.MonkeyPatch) -> None:
    # bubblewrap is the jail's pid 1: the environment it was started with is readable there
    monkeypatch.setenv("HF_TOKEN", "hf_rigsmith_jail_test_value")
    text = (
        "shopt -s nullglob\n"
        'for p in /proc/[0-9]*/environ; do mapfile -t -d \'\' E < "$p"; ALL+=("${E[@]}"); done\n'
        'vllm serve Qwen/Qwen3-0.6B --x "${ALL[*]}"\n'
    )
    seen = " ".join(jailed(text)[0])
    assert "BASH_ENV=" in seen  # the text did read the jail's environments
    assert "hf_rigsmith_jail_test_value" not in seen and os.environ["PATH"] not in seen


def test_the_jails_shell_holds_only_its_own_descriptors_and_the_two_it_writes_records_on() -> None:
    text = (
        "shopt -s nullglob\nF=(/proc/self/fd/*)\n"
        'vllm serve a/b --fds "${F[*]##*/}" --rec "$__RS_RFD $__RS_XFD"\n'
    )
    argv = jailed(text)[0]
    fds = {int(n) for n in argv[4].split()}
    records = {int(n) for n in argv[6].split()}
    # 0-2 (stdin and stdout /dev/null, stderr read here) and the records; the glob's own directory descriptor
    # takes the lowest free number
    assert len(records) == 2 and {0, 1, 2} | records <= fds
    assert len(fds - {0, 1, 2} - records) <= 1 and min(fds - {0, 1, 2}) == 3


@pytest.mark.parametrize(
    "fields",
    [
        ["3", "/rs/bin/vllm", "serve", "m/x", "NOEQUALS"],
        ["3", "/rs/bin/curl", "serve", "m/x"],
        ["9", "/rs/bin/vllm", "serve"],
        ["x", "/rs/bin/vllm"],
        ["3", "/rs/bin/vllm", "serve", "m/x", "A B=1"],
        ["3", "/rs/bin/vllm", "serve", "m/x", "BASH_ENV=/x"],
    ],
    ids=["env-without-value", "not-a-launcher", "short", "no-count", "env-name", "env-the-stub-leaves-out"],
)
def test_a_record_no_launcher_writes_is_refused(fields: list[str]) -> None:
    # The record descriptor is in the text's own shell: a record it forges must not reach the spec (an env
    # word without '=' reached the spec's validation as a traceback)
    words = " ".join(shlex.quote(f) for f in ["L", "1", str(len(fields)), *fields])
    message = refusal(f"printf '%s\\0' {words} >&\"$__RS_RFD\"\n")
    assert "record descriptor" in message and "Traceback" not in message


def test_a_wrappers_words_reach_the_notes_through_shown() -> None:
    notes = "\n".join(_parse("sudo -$'\\n- forged line\\e[31m' vllm serve Qwen/Qwen3-0.6B\n").notes)
    assert "\n- forged line" not in notes and "\x1b" not in notes


@pytest.mark.parametrize(
    "text",
    [
        "vllm serve a/b --x " + "$(" * 2000 + "echo" + ")" * 2000 + "\n",
        "X=$((" + "(" * 5000 + "1" + ")" * 5000 + "))\nvllm serve Qwen/Qwen3-0.6B\n",
        "vllm serve Qwen/Qwen3-0.6B " + "{ " * 3000 + "\n",
        "A='" + "x" * 60_000 + "'\nvllm serve Qwen/Qwen3-0.6B --x $A$A$A$A$A$A$A$A$A$A$A$A$A$A$A$A$A$A$A$A\n",
    ],
    ids=["nested-substitutions", "nested-arithmetic", "unclosed-groups", "wide-values"],
)
def test_deep_or_wide_input_ends_in_an_import_or_one_refusal(text: str) -> None:
    # Bash itself bounds these (the hand-written parser recursed without end on them); no traceback either way
    try:
        _parse(text)
    except RecipeError as err:
        assert "Traceback" not in str(err)


def test_the_refusal_quotes_the_recipes_text_through_shown() -> None:
    message = refusal("source './\x1b]52;c;cHduZWQ=\x07env.sh'\nvllm serve Qwen/Qwen3-0.6B\n")
    assert "\x1b" not in message and "\x07" not in message


@pytest.mark.parametrize(
    "startup",
    [
        "~/.bashrc",
        "~/.zshrc",
        "$HOME/.bash_profile",
        "/etc/profile",
        "~/.profile",
        "~/.zprofile",
        "~/.zshenv",
        "/etc/bash.bashrc",
    ],
)
def test_sourcing_the_shells_startup_file_is_a_note_and_another_file_is_refused(startup: str) -> None:
    dep = _parse(f"source {startup}\nconda activate vllm\nvllm serve Qwen/Qwen3-0.6B --port 8000\n")
    assert dep.engine.args == ("Qwen/Qwen3-0.6B", "--port", "8000")
    assert any("reads the shell's own startup file on the host" in n for n in dep.notes)
    assert "reads a file the text does not contain" in refusal(
        "source ~/env.sh\nvllm serve Qwen/Qwen3-0.6B\n"
    )


# -- no bubblewrap ---------------------------------------------------------------------------------------


@pytest.mark.parametrize("binary", [None, "/bin/false"], ids=["not-installed", "no-namespaces"])
def test_without_bubblewrap_one_plain_command_imports_and_a_script_is_refused(
    binary: str | None, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(jailrun, "bwrap", lambda: binary)
    dep = _parse("vllm serve Qwen/Qwen3-0.6B \\\n  --port 8000 -tp 2\n")
    assert list(dep.engine.args) == ["Qwen/Qwen3-0.6B", "--port", "8000", "-tp", "2"]
    message = refusal("MODEL=Qwen/Qwen3-0.6B\nvllm serve $MODEL\n")
    assert "bubblewrap" in message and "apt-get install bubblewrap" in message
    assert message.count("\n  - ") <= 1


def test_a_plain_command_is_told_apart_without_a_parser() -> None:
    assert scriptform.plain_command("vllm serve org/m --port 8000 \\\n  -tp 2\n")
    assert scriptform.plain_command("docker run --gpus all -e 'A=b c' vllm/vllm-openai org/m")
    for text in ("vllm serve $M", "vllm serve m > log", "A=1; vllm serve m", "vllm serve m\nvllm serve n",
                 "vllm serve m &", "vllm serve `cat x`", "vllm serve ~/m", "vllm serve 'x"):  # fmt: skip
        assert not scriptform.plain_command(text)


def test_a_text_bash_cannot_hold_in_memory_is_refused_naming_the_jails_limit() -> None:
    message = refusal("printf -v A '%*s' 200000000 ''\nvllm serve Qwen/Qwen3-0.6B\n")
    assert "cannot allocate" in message and "(the jail allows 128 MiB of memory a process)" in message
    # another of bash's errors is not put down to a limit of the jail
    other = refusal('read -r M < conf/model.txt\nvllm serve "$M"\n')
    assert "128 MiB" not in other and "32 processes" not in other


@pytest.mark.parametrize("subshells", [199, 200])
def test_processes_count_to_the_limit_with_the_texts_own_shell_among_them(subshells: int) -> None:
    answer = bashjail.run(f"for i in {{1..{subshells}}}; do (:); done\nvllm serve Qwen/Qwen3-0.6B\n")
    assert [list(c.argv) for c in answer.calls] == [["vllm", "serve", "Qwen/Qwen3-0.6B"]]
    started = subshells + 1
    if started <= jailread.MAX_PROCESSES:
        assert answer.problems == []
    else:
        assert [p.split(" (")[0] for p in answer.problems] == [f"the text starts {started} processes"]


def test_a_positional_parameter_past_99_is_bashs_refusal_not_a_placeholder() -> None:
    assert "line 1: bash stops with 100: unbound variable" in refusal('vllm serve a/b --x "${100}"\n')
    assert _parse('vllm serve a/b --x "${99}"\n').engine.args == ("a/b", "--x", "<99>")


@pytest.mark.parametrize(
    ("text", "problem", "runs"),
    [
        ('echo "$M"\nunset M\nvllm serve "$M"\n', "line 3: bash stops with M: unbound variable", 2),
        ('vllm serve a/b --x "${100}"\n', "line 1: bash stops with 100: unbound variable", 1),
    ],
    ids=["unset-after-its-placeholder", "argument-past-99"],
)
def test_what_bash_cannot_be_taught_is_refused_without_running_it_again_and_again(
    text: str, problem: str, runs: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    ran: list[object] = []
    once = bashjail._once

    def counted(*args: Any, **kwargs: Any) -> Any:
        ran.append(args)
        return once(*args, **kwargs)

    monkeypatch.setattr(bashjail, "_once", counted)
    assert bashjail.run(text).problems == [problem]
    assert len(ran) == runs  # a name learned once, not again on every run up to the limit


@pytest.mark.parametrize("kind", ["D", "O"])
def test_a_forged_record_with_too_few_fields_changes_nothing(kind: str) -> None:
    # the record descriptor is the text's to write to: a decision or an outside command's record needs two
    # fields (a value or token, and a command); one is no decision and no command
    launch = "vllm serve Qwen/Qwen3-0.6B --port 8000\n"
    forged = _parse(f"printf '%s\\0' {kind} 1 1 x >&\"$__RS_RFD\"\n{launch}")
    plain = _parse(launch)
    assert (forged.engine.args, forged.notes) == (plain.engine.args, plain.notes)


def test_an_empty_defaults_note_names_its_line_counted_from_the_texts_first() -> None:
    notes = _parse("\n\nvllm serve ${MODEL:-} --port 8000\n").notes
    assert any(n.startswith("line 3: $MODEL: MODEL has no value") for n in notes), notes


def test_bashs_errors_are_listed_up_to_eight() -> None:
    text = "".join(f"read -r M{i} < conf/m{i}.txt\n" for i in range(10)) + "vllm serve Qwen/Qwen3-0.6B\n"
    problems = bashjail.run(text).problems
    assert problems == [
        f"line {i + 1}: bash stops with conf/m{i}.txt: No such file or directory" for i in range(8)
    ]


def test_exec_is_a_note_only_where_it_runs_the_launch() -> None:
    said = "'exec' dropped"
    assert any(said in n for n in _parse("exec vllm serve Qwen/Qwen3-0.6B\n").notes)
    assert not any(said in n for n in _parse("exec 3>&1\nvllm serve Qwen/Qwen3-0.6B\n").notes)


def test_a_file_written_at_the_root_is_refused_and_the_jails_root_stays() -> None:
    message = refusal("vllm serve Qwen/Qwen3-0.6B > /server.log 2>&1\n")
    assert "line 1: bash stops with /server.log: Read-only file system" in message


def test_a_forged_records_line_that_is_no_number_is_no_line_of_the_text() -> None:
    notes = _parse("printf '%s\\0' C x 2 cd /srv >&\"$__RS_RFD\"\nvllm serve Qwen/Qwen3-0.6B\n").notes
    assert any(n.startswith("line 0: 'cd /srv': the recipe runs from /srv") for n in notes), notes
