"""Shared wiring for tasks: project root, consent prompt, error translation."""

from __future__ import annotations

import functools
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any, ParamSpec, TypeVar

from invoke import Exit

from rigsmith.errors import RigsmithError
from rigsmith.project import Project, find_root

P = ParamSpec("P")
R = TypeVar("R")


def project() -> Project:
    """The checkout the command runs in (RIGSMITH_ROOT overrides, for tests and scripts)."""
    import os

    env = os.environ.get("RIGSMITH_ROOT")
    return Project(Path(env).resolve() if env else find_root())


def confirm() -> Callable[[str], bool] | None:
    """A y/N prompt when stdin is a terminal, else None (the writer then refuses to change files)."""
    if not sys.stdin.isatty():
        return None

    def ask(question: str) -> bool:
        sys.stderr.write(f"{question} [y/N] ")
        sys.stderr.flush()
        return sys.stdin.readline().strip().lower() in ("y", "yes")

    return ask


def user_errors(fn: Callable[P, R]) -> Callable[P, R]:
    """Turn RigsmithError into invoke's Exit (message on stderr, exit 1), never a traceback."""

    @functools.wraps(fn)
    def wrapper(*args: P.args, **kwargs: P.kwargs) -> R:
        try:
            return fn(*args, **kwargs)
        except RigsmithError as err:
            raise Exit(f"error: {err}", code=1) from None
        except KeyboardInterrupt:
            raise Exit("interrupted", code=130) from None

    return wrapper


def echo(msg: Any) -> None:
    """Print a status line."""
    print(msg, flush=True)
