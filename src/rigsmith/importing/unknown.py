"""One rule for a value a recipe uses but never sets, in scripts and compose files alike (issue 35): the
placeholder ``<NAME>`` (``<1>`` for ``$1``) that the user fills in before deploy."""

from __future__ import annotations


def placeholder(name: str) -> str:
    """The placeholder for the variable or positional parameter ``name``."""
    return f"<{name}>"
