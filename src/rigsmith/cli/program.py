"""The ``rigsmith`` command: Invoke's :class:`~invoke.program.Program` over these tasks, as Invoke documents
for a distinct binary ("Reusing Invoke's CLI module as a distinct binary"), overriding three of Program's
documented methods:

- ``parse_tasks``, "did you mean": Invoke's parser stops at the first word it does not know with "No idea
  what '--tagret' is!"; the nearest flags of the task being parsed (or the nearest task names) are added to
  that one-line error.
- ``core_args``, bytecode: Invoke writes none unless ``--write-pyc`` (right for a loose tasks.py); rigsmith
  is a package whose every command would otherwise compile its modules again, so Python's own setting
  decides (PYTHONDONTWRITEBYTECODE / -B still turn it off).
- ``parse_collection``, invoke.yaml: a Program with its own namespace loads no project config; this one
  loads the invoke.yaml of the project the tasks act on (``rigsmith.deployment``): RIGSMITH_ROOT, else the
  nearest project upward from the working directory (:func:`rigsmith.project.find_root`), as ``invoke``
  reads the one beside the tasks.py it finds upward. In a checkout that is the checkout's invoke.yaml; with
  rigsmith installed from a wheel, the user's project's.

``invoke …`` in the checkout runs the same tasks through Invoke's own program (the checkout's tasks.py):
the same commands, flags and errors, without the suggestions (Invoke has no hook between its parser and its
error message). Both end quietly when the reader of their output goes away (``| head``): rigsmith/cli/pipe.py.
"""

from __future__ import annotations

import difflib
import re
import sys

from invoke.collection import Collection
from invoke.exceptions import ParseError
from invoke.parser.argument import Argument
from invoke.parser.context import ParserContext
from invoke.program import Program

import rigsmith
import rigsmith.cli
from rigsmith.cli.pipe import end_quietly_when_the_reader_goes
from rigsmith.cli.wiring import check_invoke_yaml, project_root

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


def suggestion(
    word: str, task: ParserContext | None, tasks: list[str], core: ParserContext, binary: str
) -> str:
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
        parts.append(f"`{binary} --help {task.name}` lists its flags.")
    elif not word.startswith("-"):
        parts.append(f"`{binary} --list` lists the tasks.")
    return " ".join(parts)


class RigsmithProgram(Program):
    """Invoke's Program with "did you mean" in its parse errors and Python's own bytecode setting."""

    def core_args(self) -> list[Argument]:
        args = super().core_args()
        for arg in args:
            if arg.name == "write-pyc":  # parse_core sets sys.dont_write_bytecode from it
                arg.default = not sys.flags.dont_write_bytecode
                arg.help = "Write .pyc files (default: as Python does; PYTHONDONTWRITEBYTECODE turns it off)."
        return args

    def parse_collection(self) -> None:
        super().parse_collection()
        root = project_root()
        check_invoke_yaml(root)  # the user's file: one message, not Invoke's traceback
        self.config.set_project_location(str(root))
        self.config.load_project()

    def parse_tasks(self) -> None:
        try:
            super().parse_tasks()
        except ParseError as err:
            found = _UNKNOWN.match(str(err))
            if found is None:
                raise
            names = sorted(self.collection.task_names) if self.collection is not None else []
            extra = suggestion(found["word"], err.context, names, self.initial_context, self.binary)
            if not extra:
                raise
            raise ParseError(f"{err} {extra}", err.context) from None


def program() -> RigsmithProgram:
    return RigsmithProgram(
        namespace=Collection.from_module(rigsmith.cli),
        version=rigsmith.__version__,
        name="rigsmith",
        binary="rigsmith",
        binary_names=["rigsmith"],
    )


def main() -> None:
    """The ``rigsmith`` console script (pyproject's [project.scripts])."""
    end_quietly_when_the_reader_goes()
    program().run()
