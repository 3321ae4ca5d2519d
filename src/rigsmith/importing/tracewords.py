"""The words of a command as bash's ``set -x`` trace prints it, quotes removed: how the jail's readers
(``jailread``, ``blanks``) learn what bash assigned and ran. Pure."""

from __future__ import annotations

import re

#: One word of bash's trace as ``set -x`` quotes it (one space between words): bare, '…' (``'\''`` for a
#: quote), $'…' (control characters) or a backslashed character. Possessive and at C speed: a trace line
#: can be megabytes (``A="$A$A"``), and shlex, which reads a character at a time in Python, took minutes
#: on one.
_TRACE_WORD_RE = re.compile(r"(?:[^ '\\$]++|\$'(?:[^'\\]|\\.)*+'|'[^']*+'|\\.|\$)++", re.S)
_TRACE_PART_RE = re.compile(r"\$'((?:[^'\\]|\\.)*)'|'([^']*)'|\\(.)|([^'\\$]+|\$)", re.S)
_ANSI_C = dict(zip("abeEfnrtv", "\a\b\x1b\x1b\f\n\r\t\v", strict=True))
_ANSI_C_RE = re.compile(r"(\\(?:[0-7]{1,3}|.))", re.S)


def trace_words(cmd: str) -> list[str]:
    """The words of a command as bash's trace printed it, quotes removed."""
    return [_TRACE_PART_RE.sub(_unquoted, m.group()) for m in _TRACE_WORD_RE.finditer(cmd)]


def _unquoted(m: re.Match[str]) -> str:
    ansi, single, escaped, plain = m.groups()
    if ansi is not None:  # its octal escapes are bytes (U+0080 is $'\302\200')
        return b"".join(map(_ansi_c, _ANSI_C_RE.split(ansi))).decode(errors="replace")
    return next(part for part in (single, escaped, plain) if part is not None)


def _ansi_c(piece: str) -> bytes:
    """A piece of a $'…' word split at its escapes: an escape's bytes, or the text between them (bash
    writes a byte it cannot print as three octal digits, never as \\x)."""
    if not piece.startswith("\\"):  # a text piece: the split leaves no backslash outside an escape
        return piece.encode()
    code = piece[1:]
    if re.fullmatch(r"[0-7]+", code):
        return bytes([int(code, 8) & 0xFF])
    return _ANSI_C.get(code, code).encode()
