"""What ``~`` means: one home, decided once per command (issue 24).

The spec's ``~/`` paths (model.local_dir, mounts, secondary models) name the home of the user who runs
rigsmith. Under ``sudo`` (``sudo invoke up --target quadlet`` installs a system-wide unit) that is still
the user who typed the command (``SUDO_USER``), not root: the model they fetched under ``~/models`` is
there, and a render as root must find the same place. ``deploy`` writes the home out explicitly in every
target (no run-time ``$HOME`` in run.sh, no ``%h`` in a system-wide quadlet unit, the same path in pct.conf,
provision.sh, compose and the pod spec), and ``fetch-model`` fetches there.
"""

from __future__ import annotations

import os
import pwd
from collections.abc import Callable, Mapping


def invoking_home(
    env: Mapping[str, str] | None = None,
    euid: int | None = None,
    lookup: Callable[[str], str] | None = None,
) -> str:
    """The home of the user who invoked rigsmith: SUDO_USER's when root runs it under sudo, else $HOME
    (the password database's entry when unset)."""
    env = os.environ if env is None else env
    euid = os.geteuid() if euid is None else euid
    lookup = lookup or (lambda user: pwd.getpwnam(user).pw_dir)
    sudo_user = env.get("SUDO_USER")
    if euid == 0 and sudo_user and sudo_user != "root":
        try:
            return lookup(sudo_user)
        except KeyError:
            pass
    return env.get("HOME") or pwd.getpwuid(euid).pw_dir


def expand(path: str, home: str) -> str:
    """``~/x`` → ``{home}/x`` and ``~`` → ``home``; every other path unchanged."""
    if path == "~":
        return home
    if path.startswith("~/"):
        return home.rstrip("/") + "/" + path[2:]
    return path
