"""Recipe form (b): command text — ``vllm serve``, ``python -m vllm…``, ``docker run`` / ``podman run``."""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Mapping, Sequence
from pathlib import PurePosixPath

from rigsmith import spec as specmod
from rigsmith.importing import multinode, shellwords
from rigsmith.importing.recipe import raycluster
from rigsmith.importing.recipe.command.dockerrun import docker_run
from rigsmith.importing.recipe.envvars import env_var, merge_env
from rigsmith.importing.recipe.launch import Launch
from rigsmith.importing.recipe.tables import (
    _ASSIGN_RE,
    _PYTHON_RE,
    LAUNCHERS,
    SHELL_KEYWORDS,
    _words,
)

# -- format (b): shell command text ------------------------------------------------------------------


def _is_assignment(word: str) -> bool:
    return bool(_ASSIGN_RE.match(word))


#: Commands that run the next one in the same process tree and change nothing rigsmith carries: dropped with
#: a note. Value: the wrapper's options that take a value (``uv run --with vllm vllm serve …``).
WRAPPERS: Mapping[tuple[str, ...], frozenset[str]] = {
    ("sudo",): _words("-u --user -g --group -C -D --chdir"),
    ("exec",): frozenset(),
    ("uv", "run"): _words(
        "--with --with-editable --with-requirements --python -p --project --directory --env-file --extra "
        "--group --index --default-index --index-url --extra-index-url --package --module -m"
    ),
}


def _wrapper(argv: Sequence[str]) -> int:
    """How many leading words of ``argv`` are a wrapper (``sudo``, ``exec``, ``uv run [opts]``), else 0."""
    for head, value_opts in WRAPPERS.items():
        if tuple(argv[: len(head)]) != head:
            continue
        i = len(head)
        while i < len(argv) and argv[i].startswith("-") and argv[i] not in ("-m", "--module"):
            i += 2 if argv[i] in value_opts else 1
        return i
    return 0


def _is_launcher(argv: Sequence[str]) -> bool:
    if not argv:
        return False
    argv = argv[_wrapper(argv) :]
    base = PurePosixPath(argv[0]).name if argv else ""
    return base in ("vllm", "docker", "podman") or bool(_PYTHON_RE.match(base))


def _sort_lines(
    script: shellwords.Script, launch: Launch
) -> tuple[list[specmod.EnvVar], list[shellwords.Command]]:
    """The script's lines: ``export``s (env), commands that may launch the engine, and what is neither
    (a note or, for control flow and orphaned options, a problem on ``launch``)."""
    exported: list[specmod.EnvVar] = []
    candidates: list[shellwords.Command] = []
    for cmd in script.commands:
        if cmd.argv == ["$"]:  # a prompt alone (`$ # comment`): nothing runs
            if cmd.comment:
                launch.notes.append(f"comment (line {cmd.line}): {cmd.comment}")
            continue
        if cmd.argv[0] == "$" and len(cmd.words) > 1:
            # A documentation prompt (`$ docker run …`, as in vLLM's older docs), not a word of the command.
            launch.notes.append(
                f"line {cmd.line}: the shell prompt '$ ' before the command is not part of it"
            )
            cmd = dataclasses.replace(cmd, words=cmd.words[1:])
        argv = cmd.argv
        if argv[0] in SHELL_KEYWORDS:
            launch.problems.append(
                f"line {cmd.line}: shell control flow ({argv[0]!r}): this is a script, not one command; "
                "import the vllm serve (or docker run) line on its own"
            )
        elif argv[0] == "export":
            for w in cmd.words[1:]:
                m = _ASSIGN_RE.match(w.text)
                if not m:
                    launch.problems.append(
                        f"line {cmd.line}: 'export {w.text}' sets no value; write NAME=value"
                    )
                    continue
                exported.append(env_var(m.group(1), m.group(2), cmd.comment, launch, f"line {cmd.line}"))
        elif all(_is_assignment(a) for a in argv):
            launch.notes.append(
                f"line {cmd.line}: shell variable(s) {', '.join(a.split('=', 1)[0] for a in argv)} set "
                "without export (not passed to vLLM): not imported"
            )
        elif argv[0].startswith("-") and candidates:
            launch.problems.append(
                f"line {cmd.line} starts with the option {argv[0]!r}, but the line before it does not "
                "continue with '\\', so a shell runs it as a separate command; add the missing '\\' line "
                "continuations"
            )
        else:
            candidates.append(cmd)
    return exported, candidates


def _command_words(
    main: shellwords.Command, launch: Launch
) -> tuple[list[shellwords.Word], list[specmod.EnvVar]]:
    """The launch command's words without its ``NAME=value`` prefix (returned as env) and wrappers."""
    words = list(main.words)
    prefix: list[specmod.EnvVar] = []
    while words and _is_assignment(words[0].text):
        m = _ASSIGN_RE.match(words[0].text)
        assert m is not None
        prefix.append(env_var(m.group(1), m.group(2), None, launch, f"line {main.line}"))
        words.pop(0)
    if skip := _wrapper([w.text for w in words]):
        wrapper = " ".join(w.text for w in words[:skip])
        launch.notes.append(
            f"line {main.line}: '{wrapper}' dropped (rigsmith's targets run the engine as needed)"
        )
        words = words[skip:]
    if main.comment:
        launch.notes.append(f"comment (line {main.line}): {main.comment}")
    if not words:
        launch.problems.append(f"line {main.line}: only variable assignments, no command")
        return [], prefix
    return words, prefix


def _from_shell(text: str, made: Sequence[str] = ()) -> Launch:
    """``text``'s commands read as a launch; ``made`` are the placeholders bash made for unset variables."""
    script = shellwords.scan(text)
    launch = Launch(made_placeholders=list(made))
    launch.problems += script.problems
    launch.notes += script.notes
    for line, comment in script.comments:
        if comment:
            launch.notes.append(f"comment (line {line}): {comment}")
    exported, candidates = _sort_lines(script, launch)
    if (ray := _ray_cluster(candidates, exported, launch)) is not None:
        return ray
    launchers = [c for c in candidates if _is_launcher([a for a in c.argv if not _is_assignment(a)])]
    others = [c for c in candidates if c not in launchers]
    for c in others:
        launch.problems.append(
            f"line {c.line}: {c.argv[0]!r} is not a vLLM launch command (vllm serve, python -m "
            "vllm.entrypoints.openai.api_server, docker run or podman run); remove it"
        )
    group = multinode.node_args([c.argv for c in launchers]) if len(launchers) > 1 else None
    if group is not None:
        launch.node_args = group
    elif len(launchers) > 1:
        launch.problems.append(
            f"{len(launchers)} commands in one block (lines {', '.join(str(c.line) for c in launchers)}); "
            "rigsmith imports one command per deployment: keep the one this machine runs"
        )
    if not launchers:
        if not others and not launch.problems:
            launch.problems.append(
                "no command found: expected vllm serve, python -m vllm.entrypoints.openai.api_server, "
                "docker run or podman run"
            )
        return launch
    main = launchers[0]
    words, prefix = _command_words(main, launch)
    if not words:
        return launch
    base = PurePosixPath(words[0].text).name
    if base in ("docker", "podman"):
        if prefix:
            launch.problems.append(
                f"line {main.line}: {', '.join(e.name for e in prefix)} set before {base} run reach the "
                f"{base} client, not the container; pass them with -e NAME=value"
            )
        docker_run(words, launch, main.line)
    else:
        _launcher(words, launch, main.line)
    launch.env = merge_env([*exported, *prefix, *launch.env], launch)
    return launch


def _ray_cluster(
    candidates: Sequence[shellwords.Command], exported: Sequence[specmod.EnvVar], launch: Launch
) -> Launch | None:
    """``launch`` filled from a Ray cluster's commands, or None when the block starts no Ray node."""
    ray = raycluster.split(candidates, launch)
    if ray is None:
        return None
    if ray.complete:
        raycluster.apply(ray, launch)
    launch.env = merge_env([*exported, *launch.env], launch)
    return launch


def _launcher(words: Sequence[shellwords.Word], launch: Launch, line: int) -> None:
    exe = words[0].text
    base = PurePosixPath(exe).name
    rest = list(words[1:])
    if base == "vllm":
        if not rest or rest[0].text != "serve":
            sub = rest[0].text if rest else "(nothing)"
            launch.problems.append(
                f"line {line}: 'vllm {sub}' is not the server; rigsmith imports 'vllm serve MODEL ...'"
            )
            return
        launch.executable, launch.subcommand = LAUNCHERS["vllm"]
        rest = rest[1:]
    elif _PYTHON_RE.match(base):
        opts = _interpreter_options([w.text for w in rest])
        if opts:
            launch.notes.append(
                f"line {line}: the interpreter's own option(s) {' '.join(w.text for w in rest[:opts])!r} "
                "before -m dropped (they change how Python runs, not what vLLM serves)"
            )
            rest = rest[opts:]
        if [w.text for w in rest[:2]] != ["-m", "vllm.entrypoints.openai.api_server"]:
            launch.problems.append(
                f"line {line}: '{exe} {' '.join(w.text for w in rest[:2])}' is not vLLM's OpenAI server; "
                "expected python -m vllm.entrypoints.openai.api_server"
            )
            return
        launch.executable, launch.subcommand = LAUNCHERS["python"]
        launch.first_arg_positional_ok = False
        rest = rest[2:]
    else:  # pragma: no cover - _is_launcher filters these
        launch.problems.append(f"line {line}: unknown launcher {exe!r}")
        return
    launch.recipe_executable = exe
    launch.args = [w.text for w in rest]
    launch.arg_expands = [w.expands for w in rest]


def _interpreter_options(argv: Sequence[str]) -> int:
    """How many leading words are Python's own options (``-u``, ``-O``, ``-X dev``, ``-W ignore``)."""
    i = 0
    while i < len(argv) and argv[i] != "-m":
        if re.fullmatch(r"-[bBdEiIOPqsSuvx]+", argv[i]) or re.fullmatch(r"-[WX].+", argv[i]):
            i += 1
        elif argv[i] in ("-W", "-X") and i + 1 < len(argv):
            i += 2
        else:
            return 0
    return i if i < len(argv) else 0
