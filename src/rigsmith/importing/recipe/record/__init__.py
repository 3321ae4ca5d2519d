"""A prose record read as a record (seed 000: an experiment notebook with no launch command): :mod:`.form`
reads it item by item with the word tables of :mod:`.tables` and the ``Env:`` shorthand of :mod:`.env`,
:mod:`.ask` keeps the open questions and the ledger of what was not taken, and :mod:`.spec` turns the
reading into the launch the spec is built from. Entry points: ``spec.launch_of`` and ``spec.apply`` (via
``recipe.parse``).
"""
