"""The `invoke` command with "did you mean" for a mistyped flag or task name.

Invoke's parser stops at the first word it does not know with "No idea what '--tagret' is!", and its
Program prints that and exits 1: there is no hook between the two. :class:`SuggestingProgram` is a Program
whose task parsing adds the nearest flags of the task being parsed (or the nearest task names) to that
error. The `invoke` command runs ``invoke.main.program``, a plain Program made before any collection is
loaded; :func:`adopt` (called when tasks/ is loaded) makes that one instance a SuggestingProgram. Nothing
else in invoke changes, and a Program made elsewhere (a test's ``Program(namespace=ns)``) stays as it is.
"""

from __future__ import annotations

import difflib
import functools
import os
import re
import sys
from collections.abc import Callable
from typing import Any, TypeVar

from invoke.exceptions import ParseError
from invoke.parser.context import ParserContext
from invoke.program import Program

#: The unknown word in invoke's parse error (invoke/parser/parser.py, ParseMachine.handle).
_UNKNOWN = re.compile(r"^No idea what '(?P<word>.*)' is!$")


def _near(word: str, names: list[str]) -> list[str]:
    """The names ``word`` probably meant: those it begins (``--dep`` → ``--deployment``), then the closest
    by difflib. Compared without the leading dashes (they would make every flag look alike) and in the
    form invoke gives names (``--dry_run`` is ``--dry-run``, ``fetch_model`` is ``fetch-model``)."""
    bare = {n.lstrip("-"): n for n in names}
    typed = word.split("=", 1)[0].lstrip("-").replace("_", "-")
    begun = [n for b, n in bare.items() if len(typed) >= 3 and b.startswith(typed)]
    close = [bare[b] for b in difflib.get_close_matches(typed, list(bare), n=3, cutoff=0.7)]
    return list(dict.fromkeys([*begun, *close]))[:3]


def suggestion(word: str, task: ParserContext | None, tasks: list[str], core: ParserContext) -> str:
    """What to say after "No idea what WORD is!": the nearest flags of ``task`` (invoke's own, such as
    --help, when none of the task's is near) for a flag, the nearest task names otherwise; a flag-looking
    word the task took as a positional value (``deploy --tagret podman``: target ``--tagret``) the same
    way; then where the full list is. Empty when there is nothing to say."""
    task = task if task is not None and task.name else None  # the core context has no name
    own = [*task.flags, *task.inverse_flags] if task is not None else []
    core_flags = [*core.flags, *core.inverse_flags]
    parts = []
    for arg in task.positional_args if task is not None else []:
        if isinstance(arg.value, str) and arg.value.startswith("-"):
            near = _near(arg.value, own)
            if near:
                parts.append(
                    f"{arg.value!r} was taken as the {arg.name} (not a flag): did you mean {near[0]}?"
                )
    if word.startswith("-"):
        near = _near(word, own) or _near(word, core_flags)
    else:
        near = [f"--{word}"] if f"--{word}" in own else []
        near = [*near, *_near(word, tasks)]
    if near:
        parts.append(f"Did you mean {' or '.join(near)}?")
    if task is not None:
        parts.append(f"`invoke --help {task.name}` lists its flags.")
    elif not word.startswith("-"):
        parts.append("`invoke --list` lists the tasks.")
    return " ".join(parts)


F = TypeVar("F", bound=Callable[..., Any])

#: The exit status of a command whose reader went away (128 + SIGPIPE), as a shell reports a killed one.
BROKEN_PIPE = 141


def _reader_gone(fn: F) -> F:
    """``fn`` where a closed stdout (``invoke --list | head``) ends the command quietly instead of with a
    BrokenPipeError traceback: stdout is pointed at /dev/null (so the interpreter's last flush at exit
    fails on nothing) and the exit status is 141, as for a command killed by SIGPIPE (Python's
    documented recipe, "Note on SIGPIPE" in the signal module)."""

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return fn(*args, **kwargs)
        except BrokenPipeError:
            devnull = os.open(os.devnull, os.O_WRONLY)
            os.dup2(devnull, sys.stdout.fileno())
            sys.exit(BROKEN_PIPE)

    return wrapper  # type: ignore[return-value]


class SuggestingProgram(Program):
    """A Program whose "No idea what X is!" says which flag or task was probably meant, and that ends
    quietly when its reader goes away (the methods that print, called after :func:`adopt`)."""

    print_help = _reader_gone(Program.print_help)
    print_task_help = _reader_gone(Program.print_task_help)
    list_tasks = _reader_gone(Program.list_tasks)
    execute = _reader_gone(Program.execute)

    def parse_tasks(self) -> None:
        try:
            super().parse_tasks()
        except ParseError as err:
            found = _UNKNOWN.match(str(err))
            if found is None:
                raise
            tasks = sorted(self.collection.task_names) if self.collection is not None else []
            extra = suggestion(found["word"], err.context, tasks, self.initial_context)
            if not extra:
                raise
            raise ParseError(f"{err} {extra}", err.context) from None


def adopt() -> None:
    """Make the running `invoke` command's Program (``invoke.main.program``) a :class:`SuggestingProgram`.

    Only that exact instance, and only when it is a plain Program: the class changes, its state (the
    parsed core flags, the config) stays. Not loaded as the `invoke` command (``import tasks`` in a test,
    a console script of its own): nothing to do."""
    main = sys.modules.get("invoke.main")
    program = getattr(main, "program", None)
    if type(program) is Program:
        program.__class__ = SuggestingProgram
