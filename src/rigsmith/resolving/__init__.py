"""Resolving and pinning: what a deployment runs, found and fixed to exact bytes before anything starts.

One package a capability, each ``__init__`` naming its entry points:

- :mod:`.model` — the model at a Hub commit, every file hashed (``invoke pin``, ``fetch-model``);
- :mod:`.image` — the engine image pinned by digest or built (``invoke pin``, ``build``);
- :mod:`.fit` — each rank's GPU memory from the checkpoint's headers, and the layouts that fit the rig
  (``invoke fit``, ``--propose``, ``--apply``);
- :mod:`.lock` — ``rigsmith.lock`` and its history (``invoke lock``, ``pin --repin``, ``rollback``).

:mod:`.netfail` tells a network failure that means "no route", for the Hub and registry adapters alike.
"""
