"""invoke lock (history and diffs of rigsmith.lock), invoke rollback, invoke upgrade. Wiring only.

rigsmith.resolving (pydantic) loads inside the tasks: invoke imports every task module for every command.
"""

from __future__ import annotations

import re

from invoke.context import Context
from invoke.tasks import task

from rigsmith.errors import RigsmithError
from tasks._common import echo, project, user_errors


def lock_numbers(text: str) -> tuple[int, int | None]:
    """``--diff`` value: ``N`` (against the current lock) or ``N M`` / ``N,M`` / ``N..M``."""
    words = [w for w in re.split(r"[\s,]+|\.\.", text.strip()) if w]
    if not 1 <= len(words) <= 2 or not all(w.isdigit() for w in words):
        raise RigsmithError(
            f"--diff {text!r} is not one or two lock numbers",
            hint="e.g. --diff 3 (entry 3 against the current lock) or --diff '2 5'; "
            "`invoke lock --history` lists the numbers",
        )
    return int(words[0]), int(words[1]) if len(words) == 2 else None


@task(
    help={
        "history": "list every recorded rigsmith.lock: number, time, command, what changed (* = current)",
        "diff": "N, or 'N M': what changed from recorded lock N to M (default: the current lock) — model "
        "commit and files with sizes, secondary models, image and base digests, source commits, patches",
    }
)
@user_errors
def lock(c: Context, history: bool = False, diff: str | None = None) -> None:
    """Show rigsmith.lock's recorded history, or a readable diff between two recorded locks."""
    from rigsmith.resolving import lockdiff

    if not history and diff is None:
        raise RigsmithError("lock: nothing asked", hint="use --history, or --diff N [M]")
    path = project(c).lock_path
    if history:
        for line in lockdiff.history_lines(path):
            echo(line)
    if diff is not None:
        n, m = lock_numbers(diff)
        for line in lockdiff.diff_lines(path, n, m):
            echo(line)
