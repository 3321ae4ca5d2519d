"""rigsmith's command line: Invoke tasks. Wiring only: flags in, library call, RigsmithError out as Exit.

Entry points: :data:`ns`, the task collection, and :func:`rigsmith.cli.program.main`, the ``rigsmith``
command (Invoke's Program over ``ns``). ``invoke …`` in a checkout loads the checkout's ``tasks.py``, which
exposes this ``ns``.

Each area lives in its own module (recipes, deploy, models, fit, images, ops, bundle, history, guide); this
collection puts their tasks at the top level so the CLI names are flat (``rigsmith deploy``, ``invoke
deploy``, ``rigsmith fetch-model``, …). The shared flags are rows in :mod:`rigsmith.cli.flags`; project
root, prompts and error translation are :mod:`rigsmith.cli.wiring`.

Every command, ``--list`` included, imports every task module, so the task modules import rigsmith's
areas (importing, resolving, rendering, operating, the spec's models) inside the task bodies: at module
level they took the CLI's import (``python3 -c 'import tasks'`` then) from 0.25 s to 1.26 s (medians of 7,
a loaded 2-core box). tests/test_startup.py keeps it so.
"""

from invoke.collection import Collection

from rigsmith.cli import bundle, deploy, fit, guide, history, images, models, ops, recipes

ns = Collection()
for _module in (recipes, deploy, models, fit, images, ops, bundle, history, guide):
    for _task in Collection.from_module(_module).tasks.values():
        # Invoke would give each flag its first free letter (`wait -i` = --timeout, `deploy -e` =
        # --pve-version): long flags only, so no letter means something surprising.
        _task.auto_shortflags = False
        ns.add_task(_task)
