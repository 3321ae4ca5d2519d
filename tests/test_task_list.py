"""What every command shows before it does anything: `invoke --list` lines that end at a full stop, a
word when the tasks would run another checkout's (or an installed) rigsmith, "did you mean" for a
mistyped flag or task (issue 27), and a quiet end when the reader of the output goes away (issue 36)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest
import yaml
from invoke.util import helpline

from rigsmith.cli import ns
from rigsmith.cli.program import program
from tests.support.common import REPO, invoke_cli, make_seed_project, rigsmith_cli

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


def test_an_older_rigsmith_first_on_the_path_is_one_message(tmp_path: Path) -> None:
    """A rigsmith from before the CLI moved into it (no rigsmith.cli) found first: what to do, exit 1."""
    other = tmp_path / "older" / "rigsmith"
    shutil.copytree(REPO / "src" / "rigsmith", other, ignore=shutil.ignore_patterns("__pycache__", "cli"))
    out = _list_with(f"{other.parent}{os.pathsep}{REPO}", RIGSMITH_USE_INSTALLED="1")
    assert out.returncode == 1 and out.stdout == "" and "Traceback" not in out.stderr, out.stderr
    assert out.stderr.startswith(f"error: these tasks ({REPO}) import rigsmith from {other}, which has no ")
    assert f"pip install -e {REPO}" in out.stderr


def test_a_checkout_with_no_rigsmith_installed_runs_its_own() -> None:
    """No rigsmith importable at all (a checkout nobody ran `pip install -e` in): `python -S` leaves out the
    .pth files that hold the editable install, the libraries stay on PYTHONPATH. tasks.py puts the
    checkout's src/ on the path, without a word; the tasks are the same."""
    libs = sorted({sysconfig.get_paths()["purelib"], sysconfig.get_paths()["platlib"]})
    env = {k: v for k, v in os.environ.items() if k != "RIGSMITH_USE_INSTALLED"}
    env["PYTHONPATH"] = os.pathsep.join(libs)
    found = "import importlib.util; print(importlib.util.find_spec('rigsmith'))"
    bare = subprocess.run(
        [sys.executable, "-S", "-c", found], cwd=REPO, env=env, capture_output=True, text=True, check=True
    )
    assert bare.stdout == "None\n"  # the premise: nothing to import without tasks.py's help
    out = subprocess.run(
        [sys.executable, "-S", "-m", "invoke", "-r", str(REPO), "--list"],
        cwd=REPO, env=env, capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    assert out.returncode == 0 and out.stderr == "", out.stderr
    assert out.stdout == invoke_cli(None, "--list").stdout


def test_rigsmith_reads_the_invoke_yaml_of_the_project_it_acts_on(tmp_path: Path) -> None:
    """Installed from a wheel, the rigsmith command has no checkout beside its code: it reads the invoke.yaml
    of the project found upward from the working directory (as `invoke` reads the one beside the tasks.py it
    finds), here one naming another default than this checkout's."""
    project = make_seed_project(tmp_path).root  # two deployments: a bare command needs the default
    (project / "invoke.yaml").write_text("rigsmith:\n  deployment: flash-next-int4-3x3090\n")
    below = project / "deployments" / "notes"
    below.mkdir()
    env = {k: v for k, v in os.environ.items() if not k.startswith("RIGSMITH_")}
    env["PYTHONPATH"] = str(REPO / "src")
    out = subprocess.run(
        [sys.executable, "-m", "rigsmith", "next"],
        cwd=below, env=env, stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=120,
        check=False,
    )  # fmt: skip
    assert out.returncode == 0, out.stderr
    assert out.stdout.splitlines()[0] == "flash-next-int4-3x3090:"


@pytest.mark.parametrize(
    "text",
    ["rigsmith: [\n", "- flash-next-int4-3x3090\n", "rigsmith: {deployment: x}\n\xff\n".encode("latin-1")],
    ids=["not-yaml", "a-list", "not-utf8"],
)
@pytest.mark.parametrize("cmd", ["rigsmith", "invoke"])
def test_a_broken_invoke_yaml_is_one_message(cmd: str, text: str | bytes, tmp_path: Path) -> None:
    """The project's invoke.yaml is the user's file: one that is no YAML mapping is one message naming it,
    exit 1, from both commands (Invoke's own loader ends in a traceback on it)."""
    project = make_seed_project(tmp_path).root
    yml = project / "invoke.yaml"
    yml.write_bytes(text if isinstance(text, bytes) else text.encode())
    shutil.copy(REPO / "tasks.py", project / "tasks.py")  # a checkout of its own, for `invoke`
    env = {k: v for k, v in os.environ.items() if not k.startswith("RIGSMITH_")}
    env.update(PYTHONPATH=str(REPO / "src"), RIGSMITH_USE_INSTALLED="1")  # its own src/ is not there
    argv = ["-m", "rigsmith"] if cmd == "rigsmith" else ["-m", "invoke", "-r", str(project)]
    out = subprocess.run(
        [sys.executable, *argv, "next"], cwd=project, env=env, stdin=subprocess.DEVNULL, capture_output=True,
        text=True, timeout=120, check=False,
    )  # fmt: skip
    assert out.returncode == 1 and out.stdout == "", out.stderr
    assert out.stderr.startswith(f"error: cannot read {yml}: ") or out.stderr.startswith(
        f"error: {yml} holds a YAML list, not a mapping of settings"
    ), out.stderr
    assert "Traceback" not in out.stderr and "hint: " in out.stderr


@pytest.mark.parametrize(
    ("argv", "meant"),
    [
        (["deploy", "--target", "podman", "--chek"], "Did you mean --check?"),
        (["up", "--memlok", "host"], "Did you mean --memlock?"),
        (["up", "--dep", "x"], "Did you mean --deployment?"),  # the start of a flag
        (["fetch-model", "--dest=/tmp/m", "--dry_run"], "`rigsmith --help fetch-model` lists its flags."),
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
    out = rigsmith_cli(None, *argv)
    assert out.returncode == 1 and out.stdout == ""
    assert meant in out.stderr and "Traceback" not in out.stderr, out.stderr
    assert out.stderr.count("\n") == 1, out.stderr  # one line: invoke's own words, then ours


def test_invoke_keeps_its_own_parse_error() -> None:
    # `invoke` is Invoke's own program (no suggestions), and still one line, no traceback, status 1
    out = invoke_cli(None, "deploy", "--target", "podman", "--chek")
    assert out.returncode == 1 and out.stdout == "" and out.stderr == "No idea what '--chek' is!\n"


def test_no_suggestion_that_is_not_near() -> None:
    # build has no --target, and none of its flags is near it: no guess, only where the flags are listed
    out = rigsmith_cli(None, "build", "--target", "podman")
    assert out.returncode == 1 and "Did you mean" not in out.stderr
    assert "`rigsmith --help build` lists its flags." in out.stderr


def test_the_suggested_flag_is_one_the_task_takes(capsys: pytest.CaptureFixture[str]) -> None:
    prog = program()
    with pytest.raises(SystemExit) as ended:
        prog.run(["rigsmith", "bench", "--prompt-word", "20"])
    assert ended.value.code == 1
    assert "Did you mean --prompt-words?" in capsys.readouterr().err
    assert "--prompt-words" in prog.parser.contexts["bench"].flags


def test_rigsmith_and_invoke_run_the_same_tasks_with_the_same_default(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """Both commands list the same tasks, and rigsmith reads the checkout's invoke.yaml as invoke does (a
    Program with its own namespace loads no project config by itself): the same rigsmith.deployment."""
    ours, theirs = rigsmith_cli(None, "--list"), invoke_cli(None, "--list")
    assert ours.returncode == theirs.returncode == 0
    assert ours.stdout.splitlines()[1:] == theirs.stdout.splitlines()[1:]  # after "Subcommands:"/"Available…"
    assert rigsmith_cli(None, "--version").stdout == "rigsmith 0.1.0\n"
    prog = program()
    prog.run(["rigsmith", "--list"], exit=False)
    capsys.readouterr()
    shipped = yaml.safe_load((REPO / "invoke.yaml").read_text(encoding="utf-8"))["rigsmith"]["deployment"]
    assert prog.config.rigsmith.deployment == shipped


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
    with pytest.raises(SystemExit) as ended:
        program().run(["rigsmith", *argv])
    assert ended.value.code == 1
    err = capsys.readouterr().err
    assert "Traceback" not in err and err.strip()


#: The two commands as a user runs them: Invoke's own, and the rigsmith console script's entry.
COMMANDS = {
    "invoke": [sys.executable, "-m", "invoke", "-r", str(REPO)],
    "rigsmith": [sys.executable, "-c", "from rigsmith.cli.program import main; main()"],
}


def _gone_reader(cmd: str, argv: list[str], **env: str) -> subprocess.CompletedProcess[str]:
    """The command writing into a pipe whose reader is already gone (its end closed before the command
    starts): the first write fails, whenever it comes."""
    read_end, write_end = os.pipe()
    os.close(read_end)
    full = {**os.environ, "PYTHONPATH": f"{REPO / 'src'}:{REPO}", "RIGSMITH_ROOT": str(REPO), **env}
    try:
        return subprocess.run(
            [*COMMANDS[cmd], *argv],
            cwd=REPO, env=full, stdout=write_end, stderr=subprocess.PIPE, text=True, timeout=120, check=False,
        )  # fmt: skip
    finally:
        os.close(write_end)


@pytest.mark.parametrize("buffered", [True, False], ids=["buffered", "unbuffered"])
@pytest.mark.parametrize(
    ("cmd", "argv"),
    [
        ("invoke", ["--list"]),
        ("invoke", ["--help", "deploy"]),
        ("rigsmith", ["--help"]),
        ("rigsmith", ["--list"]),
        ("rigsmith", ["--help", "deploy"]),
        ("invoke", ["next", "--deployment", "flash-next-merlin-4x3090"]),  # a task's own output
        ("rigsmith", ["next", "--deployment", "flash-next-merlin-4x3090"]),
    ],
)
def test_a_reader_that_went_away_ends_the_command_quietly(cmd: str, argv: list[str], buffered: bool) -> None:
    """`… | head -1` whose head is gone before the command writes: status 141, as a command SIGPIPE ended
    reports to a shell, and nothing on stderr. Buffered, the write fails at the interpreter's last flush;
    unbuffered (PYTHONUNBUFFERED, as in many containers) at the first print."""
    proc = _gone_reader(cmd, argv, PYTHONUNBUFFERED="" if buffered else "1")
    assert proc.stderr == "" and proc.returncode == 141, proc.stderr


@pytest.mark.parametrize(
    "line",
    [
        "invoke --list | head -1",
        "invoke --help deploy | head -1",
        "rigsmith --help | head -1",
        "rigsmith --list | head -1",
    ],
)
def test_piped_into_head_in_a_shell(line: str, tmp_path: Path) -> None:
    """The pipeline itself, in bash: head prints the first line and leaves; the command ends with nothing
    on stderr and a status a shell expects (0 when its output was all in the pipe before head left, 141
    when a write came after: which one depends on how far the command got before head left)."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "rigsmith").write_text(f'#!/bin/sh\nexec {sys.executable} -m rigsmith "$@"\n')
    (bin_dir / "rigsmith").chmod(0o755)
    (bin_dir / "invoke").write_text(f'#!/bin/sh\nexec {sys.executable} -m invoke "$@"\n')
    (bin_dir / "invoke").chmod(0o755)
    env = {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}", "PYTHONPATH": f"{REPO / 'src'}:{REPO}"}
    env["PYTHONUNBUFFERED"] = "1"
    script = f'{line}; echo "status=${{PIPESTATUS[0]}}"'
    out = subprocess.run(
        ["bash", "-c", script], cwd=REPO, env=env, capture_output=True, text=True, timeout=120, check=False
    )
    first, status = out.stdout.splitlines()
    assert first.startswith(("Available tasks:", "Usage: ", "Subcommands:")), out.stdout
    assert status in ("status=0", "status=141") and out.stderr == "", out.stderr
