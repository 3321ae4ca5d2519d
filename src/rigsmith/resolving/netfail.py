"""Which network failures mean "no route", shared by the Hub and registry adapters (pure).

Connection refused, no route to the network or host, and a name that does not resolve are not transient:
retrying them only makes an offline run slow (issue 11: 4 × 5 nested retries took 110 s before the
error). A timeout, a reset or a 5xx still is.
"""

from __future__ import annotations

import errno
import socket

_UNREACHABLE_ERRNOS = frozenset({errno.ECONNREFUSED, errno.ENETUNREACH, errno.EHOSTUNREACH})


def unreachable(exc: BaseException) -> bool:
    """True when ``exc`` (or what it wraps, through ``__cause__``/``__context__``) says the endpoint cannot
    be reached at all: connection refused, no route to the network or host, or a name that does not
    resolve."""
    seen: set[int] = set()
    cur: BaseException | None = exc
    while cur is not None and id(cur) not in seen:
        seen.add(id(cur))
        if isinstance(cur, socket.gaierror):
            return True
        if isinstance(cur, OSError) and cur.errno in _UNREACHABLE_ERRNOS:
            return True
        cur = cur.__cause__ or cur.__context__
    return False
