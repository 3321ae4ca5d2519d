"""``invoke doctor``: one go/no-go table of this host's facts against a deployment spec.

Entry points: ``doctor.diagnose`` (gather the facts the rendered plan needs and evaluate them),
``doctor.evaluate`` (pure: ``HostFacts`` + spec → rows) and ``doctor.render`` (the rich table). The rows
come from ``doctor`` itself (GPUs, squatters, CDI, shm, memlock, RAM, disk, P2P, model), ``podmanchecks``
(the podman that runs the artifacts: version, features, CDI versions, init, runtime, image),
``targetrows`` (the compose front-end, a Proxmox VE host for lxc) and ``drift`` (the model dir and image
against the lock; ``drift.gate`` is also what makes ``up`` refuse). The memory-fit row is ``fit.report``'s.
"""
