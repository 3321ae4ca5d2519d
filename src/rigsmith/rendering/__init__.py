"""Rendering: spec + lock → one :class:`~.plan.RunPlan` → each target's artifacts — ``invoke deploy``,
:func:`.deploy.deploy`. Pure: the writer puts the files on disk.

- :mod:`.plan` holds the target-independent facts every artifact carries (argv, GPUs, mounts, shm, memlock,
  exposure), from :mod:`.decisions` (where the container's argv differs from the recipe's, and why),
  :mod:`.envpaths` and :mod:`.pathmounts` (paths a placeholder names, and their mounts) and :mod:`.optins`;
- :mod:`.validate` collects every problem of spec + lock + target at once;
- :mod:`.targets` turns the plan into podman scripts, quadlet units, compose files, LXC configs and
  Kubernetes manifests (``targets.find``); :mod:`.cluster` makes one plan per node;
- :mod:`.nextsteps` is what to run after the files are written.
"""
