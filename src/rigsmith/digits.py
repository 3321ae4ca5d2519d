"""Numbers in foreign text (recipes, specs, tool output): ASCII digits only.

``str.isdigit()`` also holds for ``²``, which ``int()`` then refuses (a ValueError from a recipe's ``-p ²``),
and for ``٣``, which ``int()`` reads as 3 while vLLM, podman and shells do not. Imports nothing: the CLI's
start-up reads it too.
"""

from __future__ import annotations


def ascii_digits(text: str) -> bool:
    """Whether ``text`` is one or more ASCII digits: what ``int()`` and every tool downstream read alike."""
    return text.isascii() and text.isdigit()
