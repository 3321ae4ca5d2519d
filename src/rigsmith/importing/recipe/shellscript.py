"""A container that runs ``bash -c SCRIPT`` (compose ``entrypoint: [bash, -c, …]``, ``docker run IMAGE
bash -c …``): the script read with the shell subset of :mod:`rigsmith.importing.shelleval`, and the
container's command replaced by the one command the script runs, its exports becoming the container's env.
"""

from __future__ import annotations

import shlex
from collections.abc import Sequence
from pathlib import PurePosixPath

from rigsmith.importing import shelleval, shellwords
from rigsmith.importing.recipe.launch import Launch
from rigsmith.importing.recipe.tables import _ASSIGN_RE

SHELLS = frozenset({"bash", "sh", "dash", "zsh"})


def is_shell_c(argv: Sequence[str]) -> bool:
    """Whether ``argv`` runs a shell script: ``bash -c SCRIPT …`` (any shell of :data:`SHELLS`)."""
    return len(argv) > 2 and PurePosixPath(argv[0]).name in SHELLS and argv[1] == "-c"


def script_argv(
    argv: Sequence[str], where: str, launch: Launch, *, accept: bool = False
) -> tuple[list[str], list[tuple[str, str]]] | None:
    """The argv the container's ``bash -c SCRIPT [ARG0 ARGS…]`` runs (its ``"$@"`` are ARGS) and the
    variables the script sets for it (``export``s, ``NAME=value`` prefixes); None with the reasons in
    ``launch.problems`` when the script is outside the subset or runs no single command."""
    ev = shelleval.evaluate(shlex.join(argv), accept=accept)
    problems = [*ev.problems, *([] if accept else ev.asks)]
    if problems:
        launch.problems += [f"{where}: the {argv[0]} -c script: {p}" for p in problems]
        return None
    launch.notes += [f"{where}: {n}" for n in ev.notes]
    commands = shellwords.scan(ev.text).commands
    runs = [c for c in commands if c.argv[0] != "export"]
    if len(runs) != 1:
        launch.problems.append(
            f"{where}: the {argv[0]} -c script runs {len(runs)} commands; rigsmith imports the one vLLM "
            "command a container runs — keep that one"
        )
        return None
    env: list[tuple[str, str]] = []
    for cmd in commands:
        words = cmd.argv[1:] if cmd is not runs[0] else list(runs[0].argv)
        while words and (m := _ASSIGN_RE.match(words[0])):
            env.append((m.group(1), m.group(2)))
            words.pop(0)
        if cmd is runs[0]:
            if words[:1] == ["exec"]:  # the script replaces itself with the command: the command runs
                words = words[1:]
            return words, env
    return None  # pragma: no cover - runs[0] is among commands
