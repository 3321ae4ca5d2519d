"""INI-like outputs as ordered (section, key, value) entries; quoting for systemd/quadlet values.

Templates only lay the entries out (templates/systemd/unit-file.j2 for quadlet's .container and the CT's
.service; pct.conf is joined in Python); what goes in and in which order is decided by the target modules.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence

from rigsmith.render import LINE_BREAKS

Entry = tuple[str, str, str]

#: Used with fullmatch: a `^…$` match also accepts a trailing newline, which must never come out bare.
_SAFE_WORD = re.compile(r"[A-Za-z0-9_@+=:,./-]+")
_C_ESCAPES = {
    "\\": "\\\\",
    '"': '\\"',
    "\n": "\\n",
    "\t": "\\t",
    "\r": "\\r",
    "\a": "\\a",
    "\b": "\\b",
    "\f": "\\f",
    "\v": "\\v",
}


def specifiers(text: str) -> str:
    """Escape systemd specifiers and variable expansion: ``%`` → ``%%``, ``$`` → ``$$``."""
    return text.replace("%", "%%").replace("$", "$$")


def systemd_word(word: str) -> str:
    """One word of a systemd command line / quadlet ``Exec=``, ``Environment=``, ``Label=`` list.

    Bare when only safe characters; otherwise double-quoted with C escapes (systemd.syntax(7)), and in every
    case ``%``/``$`` doubled so neither systemd nor quadlet expands anything the recipe wrote.
    """
    if word and _SAFE_WORD.fullmatch(word):
        return word
    out = []
    for ch in specifiers(word):
        if ch in _C_ESCAPES:
            out.append(_C_ESCAPES[ch])
        elif ord(ch) < 0x20 or ord(ch) == 0x7F:
            out.append(f"\\x{ord(ch):02x}")
        elif ch in LINE_BREAKS:  # NEL, U+2028, U+2029: kept off the unit's own lines (quadlet unescapes \u)
            out.append(f"\\u{ord(ch):04x}")
        else:
            out.append(ch)
    return '"' + "".join(out) + '"'


def systemd_words(words: Iterable[str]) -> str:
    """A systemd command line from argv."""
    return " ".join(systemd_word(w) for w in words)


def sections(entries: Sequence[Entry]) -> list[tuple[str, list[tuple[str, str]]]]:
    """Group entries by section, sections in first-appearance order, keys in entry order."""
    order: list[str] = []
    grouped: dict[str, list[tuple[str, str]]] = {}
    for section, key, value in entries:
        if section not in grouped:
            order.append(section)
            grouped[section] = []
        grouped[section].append((key, value))
    return [(s, grouped[s]) for s in order]
