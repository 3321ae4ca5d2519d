"""rigsmith's Invoke tasks. Wiring only: flags in, library call, RigsmithError out as Exit.

Each area lives in its own module; this collection puts their tasks at the top level so the CLI
names are flat (`invoke deploy`, `invoke fetch-model`, …).
"""

import sys

from invoke.collection import Collection

# Invoke turns off writing bytecode before it imports a tasks module (so a tasks.py anywhere leaves no
# __pycache__ behind). rigsmith is a package like any other: without its .pyc files every command compiled
# every module it imports, again (0.1–0.4 s on a 2-core box). PYTHONDONTWRITEBYTECODE / -B still win.
sys.dont_write_bytecode = bool(sys.flags.dont_write_bytecode)

from tasks import bundle, deploy, fit, guide, images, models, ops, recipes  # noqa: E402 (after the flag)

ns = Collection()
for _module in (recipes, deploy, models, fit, images, ops, bundle, guide):
    for _task in Collection.from_module(_module).tasks.values():
        # Invoke would give each flag its first free letter (`wait -i` = --timeout, `deploy -e` =
        # --pve-version): long flags only, so no letter means something surprising.
        _task.auto_shortflags = False
        ns.add_task(_task)
