"""Doctor and lifecycle across the nodes of a multi-node deployment (the spec's ``cluster`` section).

Entry points: ``doctor.diagnose_project`` (each node's own doctor table, then the cluster view),
``lifecycle.build`` with ``lifecycle.preflight`` / ``up`` / ``status`` / ``wait`` / ``down`` /
``logs_argv`` (head first both ways, each node from its own run.sh and stop.sh),
``noderun`` (one ``Host`` per node: this machine, ``ssh -o BatchMode=yes``, or a test's namespace) and
``portcheck.head_port_problems`` (a real bind of each of the head's ports before ``up``).
"""
