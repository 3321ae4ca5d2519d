"""rigsmith's Invoke tasks. Wiring only: flags in, library call, RigsmithError out as Exit.

Each area lives in its own module; this collection puts their tasks at the top level so the CLI
names are flat (`rigsmith deploy`, `invoke deploy`, `rigsmith fetch-model`, …). The ``rigsmith`` command is
tasks/program.py; ``invoke`` in the checkout finds this package by itself.

Every command, ``--list`` included, imports every task module, so the task modules import rigsmith's
areas (importing, resolving, rendering, operating, the spec's models) inside the task bodies: at module
level they took ``python3 -c 'import tasks'`` from 0.25 s to 1.26 s (medians of 7, a loaded 2-core box).
tests/test_startup.py keeps it so.
"""

import importlib.util
import os
import sys
from pathlib import Path

from invoke.collection import Collection

#: Set (to anything) to run these tasks with a rigsmith other than this checkout's src/, on purpose.
USE_INSTALLED = "RIGSMITH_USE_INSTALLED"


def which_rigsmith() -> str | None:
    """A warning when the ``rigsmith`` these tasks would import is not this checkout's (a venv made with
    --system-site-packages, another checkout's ``pip install -e``), None when it is or the user chose it.

    Found without importing it (``find_spec``): every command, ``--list`` included, pays for this."""
    src = (Path(__file__).resolve().parents[1] / "src").resolve()
    spec = importlib.util.find_spec("rigsmith")
    origin = Path(spec.origin).resolve() if spec is not None and spec.origin else None
    if origin is not None and origin.is_relative_to(src):
        return None
    if os.environ.get(USE_INSTALLED):
        return None
    where = f"from {origin.parent}" if origin is not None else "nowhere (it is not importable)"
    return (
        f"warning: these tasks ({src.parent}) would run rigsmith {where}, not this checkout's {src}; "
        f"`pip install -e {src.parent}` in this environment makes it this checkout's, or set "
        f"{USE_INSTALLED}=1 to keep that one"
    )


_warning = which_rigsmith()  # before the task modules import rigsmith
if _warning:
    sys.stderr.write(_warning + "\n")

from tasks import bundle, deploy, fit, guide, history, images, models, ops, recipes  # noqa: E402 (after it)
from tasks._pipe import end_quietly_when_the_reader_goes  # noqa: E402

# Invoke's own `invoke` command prints --list and --help TASK with no hook: `| head` ends quietly anyway.
if "invoke.main" in sys.modules:
    end_quietly_when_the_reader_goes()

ns = Collection()
for _module in (recipes, deploy, models, fit, images, ops, bundle, history, guide):
    for _task in Collection.from_module(_module).tasks.values():
        # Invoke would give each flag its first free letter (`wait -i` = --timeout, `deploy -e` =
        # --pve-version): long flags only, so no letter means something surprising.
        _task.auto_shortflags = False
        ns.add_task(_task)
