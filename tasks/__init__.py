"""rigsmith's Invoke tasks. Wiring only: flags in, library call, RigsmithError out as Exit.

Each area lives in its own module; this collection puts their tasks at the top level so the CLI
names are flat (`invoke deploy`, `invoke fetch-model`, …).
"""

from invoke.collection import Collection

from tasks import bundle, deploy, fit, images, models, ops, recipes

ns = Collection()
for _module in (recipes, deploy, models, fit, images, ops, bundle):
    for _task in Collection.from_module(_module).tasks.values():
        # Invoke would give each flag its first free letter (`wait -i` = --timeout, `deploy -e` =
        # --pve-version): long flags only, so no letter means something surprising.
        _task.auto_shortflags = False
        ns.add_task(_task)
