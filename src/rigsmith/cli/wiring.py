"""What every task shares: the project it acts on and its default deployment, consent prompts, and
RigsmithError turned into Invoke's Exit (one message, exit 1)."""

from __future__ import annotations

import functools
import inspect
import os
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any, Literal, ParamSpec, TypeVar

import yaml
from invoke.context import Context
from invoke.exceptions import Exit

from rigsmith.cli.pipe import BROKEN_PIPE, quiet_stdout, reader_gone
from rigsmith.errors import RigsmithError, shown, shown_lines
from rigsmith.project import NEWEST_IMPORT, Project, find_root, newest_import

P = ParamSpec("P")
R = TypeVar("R")


def project(c: Context | None = None) -> Project:
    """The checkout the command runs in (RIGSMITH_ROOT overrides, for tests and scripts), with its default
    deployment: RIGSMITH_DEPLOYMENT, else the newest import (what ``import-recipe`` wrote last, while
    invoke.yaml names what it named then), else Invoke's config value ``rigsmith.deployment``
    (invoke.yaml)."""
    root = project_root()
    named = os.environ.get("RIGSMITH_DEPLOYMENT", "").strip()
    if named:
        return Project(root, named, "RIGSMITH_DEPLOYMENT")
    value = configured_default(c)
    newest = newest_import(root, value)
    if newest:
        return Project(root, newest, f"the newest import ({root / NEWEST_IMPORT})")
    return Project(root, value, f"rigsmith.deployment in {root / 'invoke.yaml'}" if value else None)


def project_root() -> Path:
    """The project the command acts on: RIGSMITH_ROOT, else the nearest project upward from the working
    directory (:func:`rigsmith.project.find_root`). Its invoke.yaml is the ``rigsmith`` command's project
    config (rigsmith/cli/program.py)."""
    env = os.environ.get("RIGSMITH_ROOT")
    return Path(env).resolve() if env else find_root()


def configured_default(c: Context | None) -> str | None:
    """The default deployment invoke.yaml names (Invoke loaded the one beside the tasks.py it found, the
    ``rigsmith`` command the project's; another RIGSMITH_ROOT has its own), None when none."""
    return _invoke_yaml(project_root()) if os.environ.get("RIGSMITH_ROOT") else _config_value(c)


def _config_value(c: Context | None) -> str | None:
    if c is None:
        return None
    section = c.config.get("rigsmith") or {}
    value = section.get("deployment") if hasattr(section, "get") else None
    return str(value) if value else None


def _invoke_yaml(root: Path) -> str | None:
    section = read_invoke_yaml(root).get("rigsmith")
    value = section.get("deployment") if isinstance(section, dict) else None
    return str(value) if value else None


def read_invoke_yaml(root: Path) -> dict[str, Any]:
    """``root``'s invoke.yaml, the project config Invoke loads: {} when there is none (or it is empty); a
    RigsmithError naming the file when it is not a YAML mapping, where Invoke's own loader would end in a
    traceback."""
    path = root / "invoke.yaml"
    try:
        data = yaml.safe_load(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        return {}
    except (OSError, ValueError, yaml.YAMLError) as err:  # ValueError: not UTF-8
        raise RigsmithError(f"cannot read {path}: {err}", hint="fix or remove the file") from None
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise RigsmithError(
            f"{path} holds a YAML {type(data).__name__}, not a mapping of settings",
            hint="write it as `rigsmith: {deployment: NAME}`, or remove the file",
        )
    return data


def check_invoke_yaml(root: Path) -> None:
    """Before Invoke loads ``root``'s invoke.yaml: one error message (exit 1) for a file it would fail on."""
    try:
        read_invoke_yaml(root)
    except RigsmithError as err:
        raise as_exit(err) from None


def as_exit(err: RigsmithError) -> Exit:
    """The one way an error reaches the terminal (exit 1): whatever foreign words it quotes, printable."""
    return Exit(f"error: {shown_lines(str(err))}", code=1)


def interactive() -> bool:
    """True when stdin is a terminal; False for a pipe, /dev/null and a closed stdin (``<&-``: Python's
    sys.stdin is None then)."""
    stdin = sys.stdin
    try:
        return stdin is not None and stdin.isatty()
    except (ValueError, OSError):  # closed or detached stream
        return False


def confirm() -> Callable[[str], bool] | None:
    """A y/N prompt when stdin is a terminal, else None (the writer then refuses to change files)."""
    if not interactive():
        return None

    def ask(question: str) -> bool:
        sys.stderr.write(f"{shown_lines(question)} [y/N] ")
        sys.stderr.flush()
        return sys.stdin.readline().strip().lower() in ("y", "yes")

    return ask


def prompt() -> Callable[[Any], str | None] | None:
    """A question with a default when stdin is a terminal (Enter takes the default), else None (an import
    then keeps its defaults and leaves its guesses as placeholders). The question is foreign text."""
    if not interactive():
        return None

    def ask(q: Any) -> str | None:
        default = f" [{shown(q.default)}]" if q.default else ""
        sys.stderr.write(f"{shown(q.question)}{default} ({q.key}): ")
        sys.stderr.flush()
        line = sys.stdin.readline().strip()
        return line or q.default

    return ask


def command_line(fn: Callable[..., Any], given: dict[str, Any]) -> str:
    """``invoke NAME --flag value …`` as the user typed it, near enough: the flags that differ from their
    defaults (what the lock history records as the command of a change)."""
    words = ["invoke", fn.__name__.replace("_", "-")]
    for name, param in inspect.signature(fn).parameters.items():
        value = given.get(name, param.default)
        if name == "c" or value == param.default or value is None:
            continue
        flag = "--" + name.replace("_", "-")
        words += [flag] if value is True else [flag, str(value)]
    return " ".join(words)


def user_errors(fn: Callable[P, R]) -> Callable[P, R]:
    """Turn RigsmithError into invoke's Exit (message on stderr, exit 1), never a traceback; lock changes
    made meanwhile are recorded as made by this command."""

    @functools.wraps(fn)
    def wrapper(*args: P.args, **kwargs: P.kwargs) -> R:
        from rigsmith.resolving.lock import lockhistory  # stdlib + the writer: nothing heavy

        try:
            with lockhistory.because(command_line(fn, dict(kwargs))):
                return fn(*args, **kwargs)
        except RigsmithError as err:
            raise as_exit(err) from None
        except KeyboardInterrupt:
            raise Exit("interrupted", code=130) from None
        except BrokenPipeError:
            if not reader_gone():
                raise
            quiet_stdout()  # `rigsmith lock --history | head -1`: a normal end, clean-up included
            raise Exit(code=BROKEN_PIPE) from None

    return wrapper


def echo(msg: Any) -> None:
    """Print a status line."""
    print(msg, flush=True)


def side(ours: bool, theirs: bool) -> Literal["ours", "theirs"] | None:
    """``--ours`` / ``--theirs``: whose value settles a conflicting merge (None: ask, or refuse)."""
    if ours and theirs:
        raise Exit("error: --ours and --theirs exclude each other; pick one", code=1)
    return "ours" if ours else "theirs" if theirs else None
