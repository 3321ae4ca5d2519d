"""What every command shows before it does anything: `invoke --list` lines that end at a full stop, a
word when the tasks would run another checkout's (or an installed) rigsmith, and "did you mean" for a
mistyped flag or task (issue 27)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from invoke.util import helpline
from tasks import ns
from tasks._program import SuggestingProgram

from tests.support.common import REPO, invoke_cli

#: invoke --list prints a task's name in an ~18-column field: a help line this long fits 120 columns.
HELP_WIDTH = 100


def test_every_task_lists_one_whole_sentence() -> None:
    for name, task in ns.tasks.items():
        line = helpline(task.body)
        assert line and line.endswith("."), f"{name}: {line!r} does not end at a full stop"
        assert len(line) <= HELP_WIDTH, f"{name}: {len(line)} characters: {line!r}"
    out = invoke_cli(None, "--list", env={**os.environ, "COLUMNS": "80"})
    assert out.returncode == 0 and out.stderr == "", out.stderr
    blocks: dict[str, str] = {}
    for raw in out.stdout.splitlines()[2:]:
        if not raw.strip():
            continue
        if not raw.startswith("    "):  # "  name   help…": a new task
            name, _, text = raw.strip().partition(" ")
            blocks[name] = text.strip()
        else:
            blocks[name] += " " + raw.strip()
    assert set(blocks) == set(ns.tasks), set(blocks) ^ set(ns.tasks)
    assert all(text.endswith(".") for text in blocks.values()), blocks


def _list_with(pythonpath: str, **env: str) -> subprocess.CompletedProcess[str]:
    full = {k: v for k, v in os.environ.items() if k != "RIGSMITH_USE_INSTALLED"}
    full.update(PYTHONPATH=pythonpath, **env)
    return subprocess.run(
        [sys.executable, "-m", "invoke", "-r", str(REPO), "--list"],
        cwd=REPO, env=full, capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip


def test_tasks_say_when_they_would_run_another_rigsmith(tmp_path: Path) -> None:
    other = tmp_path / "elsewhere" / "rigsmith"  # another checkout's copy, found first on the path
    shutil.copytree(REPO / "src" / "rigsmith", other, ignore=shutil.ignore_patterns("__pycache__"))
    out = _list_with(f"{other.parent}{os.pathsep}{REPO}")
    assert out.returncode == 0
    assert f"would run rigsmith from {other}, not this checkout's {REPO / 'src'}" in out.stderr
    assert f"pip install -e {REPO}" in out.stderr and "RIGSMITH_USE_INSTALLED=1" in out.stderr
    chosen = _list_with(f"{other.parent}{os.pathsep}{REPO}", RIGSMITH_USE_INSTALLED="1")
    assert chosen.returncode == 0 and chosen.stderr == ""
    own = _list_with(f"{REPO / 'src'}{os.pathsep}{REPO}")
    assert own.returncode == 0 and own.stderr == ""


@pytest.mark.parametrize(
    ("argv", "meant"),
    [
        (["deploy", "--target", "podman", "--chek"], "Did you mean --check?"),
        (["up", "--memlok", "host"], "Did you mean --memlock?"),
        (["up", "--dep", "x"], "Did you mean --deployment?"),  # the start of a flag
        (["fetch-model", "--dest=/tmp/m", "--dry_run"], "`invoke --help fetch-model` lists its flags."),
        (
            ["deploy", "--tagret", "podman"],
            "'--tagret' was taken as the target (not a flag): did you mean --target?",
        ),
        (["fetch_model"], "Did you mean fetch-model?"),
        (["deplyo"], "Did you mean deploy?"),
        (["--lsit"], "Did you mean --list?"),
    ],
)
def test_a_mistyped_flag_or_task_gets_the_one_meant(argv: list[str], meant: str) -> None:
    out = invoke_cli(None, *argv)
    assert out.returncode == 1 and out.stdout == ""
    assert meant in out.stderr and "Traceback" not in out.stderr, out.stderr
    assert out.stderr.count("\n") == 1, out.stderr  # one line: invoke's own words, then ours


def test_no_suggestion_that_is_not_near() -> None:
    # build has no --target, and none of its flags is near it: no guess, only where the flags are listed
    out = invoke_cli(None, "build", "--target", "podman")
    assert out.returncode == 1 and "Did you mean" not in out.stderr
    assert "`invoke --help build` lists its flags." in out.stderr


def test_the_suggested_flag_is_one_the_task_takes(capsys: pytest.CaptureFixture[str]) -> None:
    prog = SuggestingProgram(namespace=ns, binary="invoke")
    with pytest.raises(SystemExit) as ended:
        prog.run(["invoke", "bench", "--prompt-word", "20"])
    assert ended.value.code == 1
    assert "Did you mean --prompt-words?" in capsys.readouterr().err
    assert "--prompt-words" in prog.parser.contexts["bench"].flags


@pytest.mark.parametrize(
    "argv",
    [
        ["deploy", "--tagret\nx", "podman"],
        ["deploy", "--target", "podman", "--dep\x85loyment", "x"],
        ["deploy", "--t\u00e9rget=\n", "podman"],
        ["deplo\ny"],
        ["deploy", "--tar\udcffget", "podman"],
        ["deploy", "--target", "podman", "--deployment=\udcff\n'\"", "--yess"],
        ["deploy", "-\x1b[31m"],
        ["deploy", "--target", "podman", "--" + "t" * 20_000],
        ["deploy", "--x' is!", "y"],
    ],
)
def test_odd_characters_in_a_mistyped_word_or_value_are_one_message(
    argv: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    """Line breaks, lone surrogates, escapes, quotes and huge words (issue 25 red team): the parse error
    and its suggestion, never a traceback."""
    prog = SuggestingProgram(namespace=ns, binary="invoke")
    with pytest.raises(SystemExit) as ended:
        prog.run(["invoke", *argv])
    assert ended.value.code == 1
    err = capsys.readouterr().err
    assert "Traceback" not in err and err.strip()


@pytest.mark.parametrize(
    "argv", [["--list"], ["--help", "deploy"], ["next", "--deployment", "flash-next-merlin-4x3090"]]
)
def test_a_reader_that_went_away_ends_the_command_quietly(argv: list[str]) -> None:
    """`invoke --list | head -1`: the reader is gone before the tasks write (its end of the pipe is closed
    before invoke starts), so the first write fails; the command ends with 141, as one killed by SIGPIPE
    would, and no traceback."""
    read_end, write_end = os.pipe()
    os.close(read_end)
    env = {**os.environ, "PYTHONPATH": f"{REPO / 'src'}:{REPO}", "RIGSMITH_ROOT": str(REPO)}
    try:
        proc = subprocess.run(
            [sys.executable, "-m", "invoke", "-r", str(REPO), *argv],
            cwd=REPO, env=env, stdout=write_end, stderr=subprocess.PIPE, text=True, timeout=120, check=False,
        )  # fmt: skip
    finally:
        os.close(write_end)
    assert "Traceback" not in proc.stderr and "BrokenPipeError" not in proc.stderr, proc.stderr
    assert proc.returncode == 141
