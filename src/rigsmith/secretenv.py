"""Secrets in the environment rigsmith runs in: which names hold one, their values, and where a text would
carry one. One rule for the two places that need it: the import, where compose interpolation reads the
process environment and an env file (``importing/recipe/composeenv``), and the writer, which refuses any
file holding such a value whatever key or variable carries it (``rigsmith.writer``).

A name holds a secret when it is ``HF_TOKEN``, ends in ``_TOKEN`` or ``_KEY``, contains ``PASSWORD``,
``PASSWD``, ``SECRET`` or ``CREDENTIAL``, or has a ``TOKEN``/``KEY`` segment (``HF_TOKEN_RO``); case does
not matter. Its value is checked by value, not by name, with two exceptions written down here so the
check cannot refuse what is no secret:

- values shorter than :data:`MIN_LENGTH` (8) characters: ``1``, ``true``, ``none`` and short words appear
  in any file by chance, and a real token or key is longer;
- an absolute path to something that exists on this host (``GOOGLE_APPLICATION_CREDENTIALS=/…/key.json``,
  ``SSL_KEY=/etc/…``): the secret is the file's content, and a spec may well mount that file.

Stdlib only: the writer imports this, and the writer loads before anything heavy.
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable, Mapping

#: A variable name that holds a secret (the import's env rule and the writer's check both use it).
SECRET_NAME_RE = re.compile(
    r"(^|_)(TOKEN|KEY|API_KEY|ACCESS_KEY)(_|$)|PASSWORD|PASSWD|SECRET|CREDENTIAL", re.IGNORECASE
)
#: Values shorter than this are not searched for (see the module docstring).
MIN_LENGTH = 8


def is_secret_name(name: str) -> bool:
    """Whether the variable ``name`` holds a secret by its name."""
    return bool(SECRET_NAME_RE.search(name))


def _on_host(path: str) -> bool:
    try:
        return os.path.lexists(path)
    except (OSError, ValueError):
        return False


def values(environ: Mapping[str, str | None], exists: Callable[[str], bool] = _on_host) -> dict[str, str]:
    """Secret value → the first variable (sorted by name) that holds it, for every secret-named variable of
    ``environ`` whose value is checked by value: long enough, and not an absolute path that ``exists``
    (default: on this host; a pure caller passes ``lambda _: False`` and so checks paths too)."""
    out: dict[str, str] = {}
    for name in sorted(environ):
        value = environ[name]
        if not value or not is_secret_name(name) or len(value) < MIN_LENGTH:
            continue
        if value.startswith("/") and exists(value):
            continue
        out.setdefault(value, name)
    return out


def carried(text: str, secrets: Mapping[str, str]) -> list[str]:
    """The names of the variables whose secret value ``text`` holds (sorted, each once)."""
    return sorted({name for value, name in secrets.items() if value in text})
