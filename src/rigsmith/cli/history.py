"""invoke lock (history and diffs of rigsmith.lock), invoke rollback, invoke upgrade. Wiring only.

rigsmith.resolving (pydantic) loads inside the tasks: invoke imports every task module for every command.
"""

from __future__ import annotations

import re

from invoke.context import Context
from invoke.tasks import task

from rigsmith.cli.flags import DEPLOYMENT, MEMLOCK, OUT, RUN_TARGET, helps, seconds, whole
from rigsmith.cli.ops import _ops
from rigsmith.cli.wiring import echo, project, user_errors
from rigsmith.digits import ascii_digits
from rigsmith.errors import RigsmithError


def lock_numbers(text: str) -> tuple[int, int | None]:
    """``--diff`` value: ``N`` (against the current lock) or ``N M`` / ``N,M`` / ``N..M``."""
    words = [w for w in re.split(r"[\s,]+|\.\.", text.strip()) if w]
    if not 1 <= len(words) <= 2 or not all(ascii_digits(w) for w in words):
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
    from rigsmith.resolving.lock import lockdiff

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


@task(
    help={
        **helps(DEPLOYMENT, RUN_TARGET, OUT, MEMLOCK),
        "to": "the recorded lock to restore (default: the last-known-good the running upgrade kept, else the "
        "newest earlier entry that ran; `invoke lock --history` lists them)",
    }
)
@user_errors
def rollback(
    c: Context,
    deployment: str | None = None,
    to: str | None = None,
    target: str = "podman",
    out: str | None = None,
    memlock: str | None = None,
) -> None:
    """Restore a recorded lock with its model files, artifacts and image, and restart on it."""
    from rigsmith.operating.upgrade import rollback as rollbackmod

    n = rollbackmod.rollback(
        _ops(c, target, out),
        deployment=deployment,
        to=whole("--to", to) if to is not None else None,
        memlock=MEMLOCK.value(memlock),
    )
    echo(f"rollback: running on lock {n}")


@task(
    help={
        **helps(DEPLOYMENT, RUN_TARGET, OUT, MEMLOCK),
        "threshold": "bench regression (decode tok/s down or TTFT up, in %) that rolls back (default 10)",
        "wait_timeout": "seconds the new engine gets to pass the readiness gates (default: 2x the recipe's "
        "first-boot time)",
        "max_tokens": "tokens per bench request (default 128)",
        "prompt_words": "bench prompt length in words (default 512)",
    }
)
@user_errors
def upgrade(
    c: Context,
    deployment: str | None = None,
    threshold: str = "10",
    target: str = "podman",
    out: str | None = None,
    memlock: str | None = None,
    wait_timeout: str | None = None,
    max_tokens: str = "128",
    prompt_words: str | None = None,
) -> None:
    """Repin, fetch, build, restart and bench; roll back by itself when a gate or the bench fails."""
    from rigsmith.operating.bench import bench as benchmod
    from rigsmith.operating.upgrade import upgrade as upgrademod

    pct = seconds("--threshold", threshold)
    if not 0 < pct < 100:
        raise RigsmithError(f"--threshold {threshold} is not a percentage between 0 and 100", hint="e.g. 10")
    opts = upgrademod.Options(
        threshold=pct / 100,
        memlock=MEMLOCK.value(memlock),
        wait_timeout=seconds("--wait-timeout", wait_timeout) if wait_timeout is not None else None,
        max_tokens=whole("--max-tokens", max_tokens),
        prompt_words=whole("--prompt-words", prompt_words)
        if prompt_words is not None
        else benchmod.DEFAULT_PROMPT_WORDS,
    )
    upgrademod.upgrade(_ops(c, target, out), deployment=deployment, options=opts)
