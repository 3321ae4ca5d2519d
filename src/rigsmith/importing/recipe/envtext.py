"""The env string grammar of seed-format recipes (``A=1 B=2 | C=<placeholder> (note)``)."""

from __future__ import annotations

import re

from rigsmith import spec as specmod
from rigsmith.importing.recipe.envvars import mapped_secret, secret_ref, secret_var
from rigsmith.secretenv import is_secret_name

# -- env string grammar (seed 003) -------------------------------------------------------------------

_ENV_TOKEN_RE = re.compile(r"([A-Za-z_][A-Za-z0-9_]*)=((?:<[^<>]*>|[^\s<])+)")


def parse_env_text(text: str) -> tuple[list[specmod.EnvVar], list[str], list[str]]:
    """The recipe's env string → (variables, env notes, problems).

    Grammar (seed 003): segments split by `` | ``; each holds ``NAME=value`` items separated by spaces
    (a value may contain ``<placeholder with spaces>``) and optional ``(annotation)``. An annotation of a
    one-variable segment is that variable's note; otherwise it is an env note. An ``Opt-in:`` tail holds
    ``;``-separated ``NAME=value description`` items, imported as opt-in variables that start disabled.
    """
    problems: list[str] = []
    notes: list[str] = []
    out: list[specmod.EnvVar] = []
    main, sep, tail = text.partition("Opt-in:")
    main = main.strip()
    if sep and main.endswith("."):
        main = main[:-1].rstrip()
    for idx, segment in enumerate(s for s in main.split(" | ") if s.strip()):
        annotations = [a.strip() for a in _parens(segment)]
        bare = _strip_parens(segment)
        found = _ENV_TOKEN_RE.findall(bare)
        leftover = _ENV_TOKEN_RE.sub("", bare).strip()
        if leftover:
            problems.append(
                f"env segment {idx + 1} ({segment.strip()!r}): cannot read {leftover!r}; write NAME=value"
            )
        note = "; ".join(annotations) if annotations and len(found) == 1 else None
        if annotations and len(found) != 1:
            notes.extend(annotations)
        out += [_entry(name, value, note, "env", notes) for name, value in found]
    if sep:
        items = [s.strip() for s in tail.split(";") if s.strip()]
        for idx, item in enumerate(items):
            if idx == len(items) - 1 and item.endswith("."):
                item = item[:-1].rstrip()
            m = re.match(r"([A-Za-z_][A-Za-z0-9_]*)=((?:<[^<>]*>|[^\s<])+)\s*(.*)$", item, re.DOTALL)
            if not m:
                problems.append(f"env Opt-in item {idx + 1} ({item!r}): write NAME=value description")
                continue
            note = m.group(3).strip() or None
            out.append(_entry(m.group(1), m.group(2), note, "env Opt-in", notes, opt_in=True, enabled=False))
    return out, notes, problems


def _entry(
    name: str, value: str, note: str | None, where: str, notes: list[str], **flags: bool
) -> specmod.EnvVar:
    """One variable of the env string: a secret's value lifted out (said in ``notes``), else kept, marked
    secret when its name says so."""
    other = secret_ref(name, value)
    if other is not None:
        return mapped_secret(name, other, note, where, notes, **flags)
    lifted = secret_var(name, value, note, where, **flags)
    if lifted is not None:
        notes.append(lifted[1])
        return lifted[0]
    return specmod.EnvVar(name=name, value=value, note=note, secret=is_secret_name(name), **flags)


def _annotation_spans(text: str) -> list[tuple[int, int]]:
    """Spans of ``(annotation)``: a ``(`` that starts a word (so ``$(id)`` in a value is not one)."""
    spans, depth, start = [], 0, 0
    for i, ch in enumerate(text):
        if ch == "(" and (depth or i == 0 or text[i - 1].isspace()):
            if depth == 0:
                start = i
            depth += 1
        elif ch == ")" and depth:
            depth -= 1
            if depth == 0:
                spans.append((start, i + 1))
    return spans


def _parens(text: str) -> list[str]:
    return [text[a + 1 : b - 1] for a, b in _annotation_spans(text)]


def _strip_parens(text: str) -> str:
    out, last = [], 0
    for a, b in _annotation_spans(text):
        out.append(text[last:a])
        last = b
    out.append(text[last:])
    return "".join(out)
