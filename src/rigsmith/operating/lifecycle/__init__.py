"""One deployment's life on this host: ``invoke up``, ``down``, ``status``, ``logs``, ``wait``, ``next`` and
``proxy-entry`` for the podman and quadlet targets.

Entry points: ``lifecycle.Ops`` (project, target, host, echo) with ``lifecycle.up`` / ``lifecycle.down`` /
``lifecycle.logs_argv`` (converge, act, re-check; a multi-node spec is handed to ``cluster.lifecycle``),
``status.status``, ``wait.wait`` (logs and ``/health`` until the readiness gates pass), ``verify``
(did the running container get the devices, env and limits the plan asked for), ``rootcause`` (doctor's
first failing row leads a failure), ``undo`` (what a failed start takes back), ``gpuholders`` (who still
holds a GPU after ``down``), ``keptflags.keep_flags`` (``--memlock`` and ``--image`` kept in the spec),
``nextcommand.stages`` / ``nextcommand.report`` (``invoke next``: where the deployment stands and the
command for the next step) and ``proxy.render`` (a llama-swap entry for the deployment).
"""
