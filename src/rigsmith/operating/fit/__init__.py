"""``invoke fit`` against a real (or described) rig: the pure estimate of ``resolving.fit.fit`` held against
each GPU's total and used memory, and the layouts ``resolving.fit.propose`` ranks shown and applied.

Entry points: ``report.fit_gpus`` / ``report.render`` / ``report.overall`` (per-GPU need, has, headroom,
verdict; ``report.fit_check`` is doctor's fit row), ``layoutmenu.propose`` / ``layoutmenu.render`` /
``layoutmenu.apply`` (``fit --propose`` and ``fit --apply N``: the recipe's layout beside the top
proposals), ``rigsource.from_flags`` / ``rigsource.load`` (a rig you do not have: ``--vram-gib``,
``--rig FILE``), ``observed.record`` / ``observed.last`` (the KV-cache size the engine itself logged at
``invoke wait``) and ``pastruns`` (what earlier boots and bench runs here say: calibration, faster layout).
"""
