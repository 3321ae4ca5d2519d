"""Whether the head node's ports are free on this host right now (issue 15): a real bind per port.

The cluster's own collisions (the API port equal to Ray's) are a spec problem, found without a host by
:func:`rigsmith.rendering.cluster.port_problems`; this is the run-time half, for ``up``/``doctor`` on the
head before its container starts: another server already holding the API or Ray port fails late and
obscurely (Ray's GCS or uvicorn dies after the image loads), so it is named up front.
"""

from __future__ import annotations

import errno
import socket
from collections.abc import Mapping

from rigsmith import spec as specmod
from rigsmith.rendering import cluster


def busy(ports: Mapping[str, int], host: str = "0.0.0.0") -> list[tuple[str, int, str]]:
    """(what, port, why) for every port of ``ports`` that cannot be bound on ``host`` now.

    SO_REUSEADDR as a server sets it: a connection of an earlier run in TIME_WAIT does not count, a
    listener does (also one on another address of the host when ``host`` is the wildcard).
    """
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    out = []
    for what, port in ports.items():
        with socket.socket(family, socket.SOCK_STREAM) as s:
            s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            try:
                s.bind((host, port))
            except OSError as err:
                why = "in use" if err.errno == errno.EADDRINUSE else (err.strerror or str(err))
                out.append((what, port, why))
    return out


def head_port_problems(spec: specmod.Deployment, host: str = "0.0.0.0") -> list[tuple[str, str]]:
    """The head's ports (the API and Ray's or the data-parallel RPC port) that are not free here, by the
    spec field that sets each; empty for a single-node spec or when all are free."""
    if spec.cluster is None:
        return []
    return [
        (
            what,
            f"port {port} on {host} is {why}: stop what holds it (ss -ltnp 'sport = :{port}') or pick "
            "another port",
        )
        for what, port, why in busy(cluster.head_ports(spec), host)
    ]
