"""The one error hierarchy. Only the CLI (rigsmith.cli) turns these into exit codes."""

from __future__ import annotations

import shlex
from collections.abc import Sequence


class RigsmithError(Exception):
    """Base for every error a user can act on. ``str(err)`` is the whole message."""

    def __init__(self, message: str, *, hint: str | None = None) -> None:
        self.message = message
        self.hint = hint
        super().__init__(message if hint is None else f"{message}\n  hint: {hint}")


#: The problems an error lists before it counts the rest: a text that repeats one mistake thousands of
#: times (a doubled variable) gets a screen, not half a megabyte.
LISTED = 20


def listed(lines: Sequence[str]) -> list[str]:
    """``lines`` up to :data:`LISTED`, and one line counting the ones left out."""
    if len(lines) <= LISTED:
        return list(lines)
    return [*lines[:LISTED], f"  … and {len(lines) - LISTED} more"]


class SpecError(RigsmithError):
    """A deployment spec is invalid. Carries every problem, each with its field path."""

    def __init__(
        self, source: str, problems: Sequence[tuple[str, str]], *, what: str = "deployment spec"
    ) -> None:
        self.source = source
        self.problems = list(problems)
        lines = [f"{source}: {len(self.problems)} problem(s) in the {what}"]
        lines += listed([f"  {path}: {msg}" for path, msg in self.problems])
        super().__init__("\n".join(lines))


class RecipeError(RigsmithError):
    """A recipe (URL, file, command text) cannot be imported as it stands. Its message and hint quote the
    recipe, so every line of them is kept printable (:func:`shown_lines`), whichever path built them."""

    def __init__(self, message: str, *, hint: str | None = None) -> None:
        super().__init__(shown_lines(message), hint=None if hint is None else shown_lines(hint))


class ConsentError(RigsmithError):
    """A write would change a file the user has, and consent was not given."""


class DriftError(RigsmithError):
    """``--check``: the generated files on disk differ from what would be rendered."""


class LockError(RigsmithError):
    """``rigsmith.lock`` lacks a pin a step needs, or is unreadable."""


class PreflightError(RigsmithError):
    """A host check failed before any side effect."""


class LockDriftError(PreflightError):
    """The model dir or the local image differs from what ``rigsmith.lock`` pins."""


class AdapterError(RigsmithError):
    """An external system (engine, registry, Hub, HTTP, subprocess) failed."""


def shown(text: str) -> str:
    """Another program's words (a subprocess's stderr, a node's answer over ssh) as rigsmith may print them:
    each character that is not printable (terminal escapes, carriage returns, line breaks) written as its
    Python escape, so foreign bytes cannot rewrite the user's terminal or forge a line of rigsmith's own."""
    return "".join(c if c.isprintable() else c.encode("unicode_escape").decode("ascii") for c in text)


def shown_lines(text: str) -> str:
    """A message that quotes foreign words, through :func:`shown` line by line: its own line breaks kept
    (the message's layout), every other character that is not printable escaped."""
    return "\n".join(shown(line) for line in text.split("\n"))


class CommandError(AdapterError):
    """A subprocess exited non-zero: quoted command, exit code and the tail of stderr."""

    def __init__(self, argv: Sequence[str], code: int, stderr: str, *, hint: str | None = None) -> None:
        self.argv = list(argv)
        self.code = code
        tail = "\n".join(stderr.strip().splitlines()[-15:])
        msg = f"command failed (exit {code}): {shlex.join(self.argv)}"
        if tail:
            msg += "\n" + "\n".join(f"  | {shown(line)}" for line in tail.splitlines())
        super().__init__(msg, hint=hint)
