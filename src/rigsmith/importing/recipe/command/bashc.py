"""A container that runs ``bash -c SCRIPT`` (compose ``entrypoint: [bash, -c, …]``, ``docker run IMAGE
bash -c …``): the script run by bash in the jail (:mod:`rigsmith.importing.bashjail`), and the container's
command replaced by the one command the script launches, its exports becoming the container's env.
"""

from __future__ import annotations

import shlex
from collections.abc import Sequence
from pathlib import PurePosixPath

from rigsmith.importing import bashjail
from rigsmith.importing.prompts import quote_placeholders
from rigsmith.importing.recipe.launch import Launch

SHELLS = frozenset({"bash", "sh", "dash", "zsh"})


def is_shell_c(argv: Sequence[str]) -> bool:
    """Whether ``argv`` runs a shell script: ``bash -c SCRIPT …`` (any shell of :data:`SHELLS`)."""
    return len(argv) > 2 and PurePosixPath(argv[0]).name in SHELLS and argv[1] == "-c"


def script_argv(
    argv: Sequence[str], where: str, launch: Launch
) -> tuple[list[str], list[tuple[str, str]]] | None:
    """The argv the container's ``bash -c SCRIPT [ARG0 ARGS…]`` launches (its ``"$@"`` are ARGS) and the
    variables the script exports for it; None with the reasons in ``launch.problems`` when bash cannot run
    it here or it launches no single command."""
    why = bashjail.unavailable()
    if why is not None:
        launch.problems.append(
            f"{where}: the {argv[0]} -c script needs bash in the bubblewrap sandbox to read, and {why}; "
            "install bubblewrap (apt-get install bubblewrap)"
        )
        return None
    script, _ = quote_placeholders(argv[2])
    answer = bashjail.run(shlex.join(["bash", "-c", script, *argv[3:]]))
    if answer.problems:
        launch.problems += [f"{where}: the {argv[0]} -c script: {p}" for p in answer.problems]
        return None
    launch.notes += [f"{where}: in the {argv[0]} -c script: {n}" for n in answer.notes]
    if len(answer.calls) != 1:
        ran = [bashjail.named(a) for _, a in answer.outside]
        what = f" (it runs {', '.join(ran[:4])}, which the text does not hold or is not vLLM)" if ran else ""
        launch.problems.append(
            f"{where}: the {argv[0]} -c script launches {len(answer.calls)} vLLM commands{what}; rigsmith "
            "imports the one vLLM command a container runs — keep that one"
        )
        return None
    call = answer.calls[0]
    launch.made_placeholders += [p for p in answer.placeholders if p not in launch.made_placeholders]
    return list(call.argv), list(call.env)
