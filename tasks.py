"""``invoke …`` in this checkout: rigsmith's tasks (``rigsmith.cli``, the same as the ``rigsmith`` command)
run with this checkout's ``src/``. Invoke finds this file in the working directory or above it.

It says when the rigsmith these tasks would import is not this checkout's (:func:`which_rigsmith`), puts
``src/`` on the path when no rigsmith is importable at all (a checkout nobody ran ``pip install -e`` in),
and refuses in one message a rigsmith too old to hold the tasks and an invoke.yaml beside it that Invoke
would fail on. Nothing else lives here: the tasks, their flags and the ``rigsmith`` program are in
src/rigsmith/cli/.
"""

import importlib.util
import os
import sys
from pathlib import Path

from invoke.exceptions import Exit

#: Set (to anything) to run these tasks with a rigsmith other than this checkout's src/, on purpose.
USE_INSTALLED = "RIGSMITH_USE_INSTALLED"

#: This checkout's sources.
SRC = Path(__file__).resolve().parent / "src"


def _origin() -> Path | None:
    """Where ``import rigsmith`` would load it from, found without importing it (``find_spec``): every
    command, ``--list`` included, pays for this."""
    spec = importlib.util.find_spec("rigsmith")
    return Path(spec.origin).resolve() if spec is not None and spec.origin else None


def which_rigsmith() -> str | None:
    """A warning when the ``rigsmith`` these tasks would import is not this checkout's (a venv made with
    --system-site-packages, another checkout's ``pip install -e``), None when it is or the user chose it."""
    origin = _origin()
    if origin is None or origin.is_relative_to(SRC) or os.environ.get(USE_INSTALLED):
        return None
    return (
        f"warning: these tasks ({SRC.parent}) would run rigsmith from {origin.parent}, not this checkout's "
        f"{SRC}; `pip install -e {SRC.parent}` in this environment makes it this checkout's, or set "
        f"{USE_INSTALLED}=1 to keep that one"
    )


def _older_rigsmith() -> Exit:
    """The error for a rigsmith found first that has no ``rigsmith.cli`` (older than this checkout)."""
    origin = _origin()
    where = origin.parent if origin else "?"
    return Exit(
        f"error: these tasks ({SRC.parent}) import rigsmith from {where}, which has "
        f"no command line (rigsmith.cli): a rigsmith older than this checkout\n  hint: `pip install -e "
        f"{SRC.parent}` in this environment, or put {SRC} first on PYTHONPATH",
        code=1,
    )


if _origin() is None:  # no rigsmith installed: this checkout's is the one to run
    sys.path.insert(0, str(SRC))
_warning = which_rigsmith()  # before anything imports rigsmith
if _warning:
    sys.stderr.write(_warning + "\n")

try:
    from rigsmith.cli import ns
except ModuleNotFoundError as err:
    if err.name != "rigsmith.cli":
        raise
    raise _older_rigsmith() from None
from rigsmith.cli.pipe import end_quietly_when_the_reader_goes  # noqa: E402
from rigsmith.cli.wiring import check_invoke_yaml  # noqa: E402

# Invoke loads the invoke.yaml beside this file next, and ends in a traceback on one that is no YAML mapping.
check_invoke_yaml(SRC.parent)

# Invoke's own `invoke` command prints --list and --help TASK with no hook: `| head` ends quietly anyway.
if "invoke.main" in sys.modules:
    end_quietly_when_the_reader_goes()

__all__ = ["ns"]
