"""Two published shapes that are not a command alone:

- **A recipe card** as the site shows it (seed 003): a title line, the command, then ``env: '…'`` and
  ``notes: "…"`` lines (YAML scalars), maybe followed by the reader's own text. It is the recipe JSON's
  fields laid out as text, so it is read into those fields and imported exactly like the JSON form.
- **A record without a command** (seed 000: an experiment write-up): :func:`is_record` tells it apart;
  :mod:`.record.form` reads it item by item.

Pure: text in, fields out.
"""

from __future__ import annotations

import re
from typing import Any

import yaml

from rigsmith.importing.prompts import strip_prompts

_FIELD_RE = re.compile(r"^(env|notes):[ \t]+['\"]", re.MULTILINE)
#: A line that starts a launch command (after a prompt, sudo, NAME=value prefixes or a path).
_LAUNCH_LINE_RE = re.compile(
    r"(?m)^[ \t]*(?:[^\n]*(?:[{;]|&&|\|\|)[ \t]+)?"  # after `f() {`, `;`, `&&`, `||` on the line too
    r"(?:\S*[$#>][ \t]+)?(?:sudo[ \t]+|nohup[ \t]+|exec[ \t]+|env[ \t]+)*"
    r"(?:[A-Za-z_]\w*=\S*[ \t]+)*(?:\S*/)?"
    r"(?:vllm\b|python3?(?:\.\d+)?[ \t]+(?:-\S+[ \t]+)*-m[ \t]+vllm|docker[ \t]+run\b|podman[ \t]+run\b"
    r"|(?:ba)?sh[ \t]+-c\b|uv[ \t]+run\b)"
)

#: A first word that could name a program or a shell word (lowercase, a path, an option, an assignment).
_PROGRAM_RE = re.compile(r"^[a-z0-9_./~$\[\]{}()-][\w./~$=:@+,-]*$|^[A-Z_][A-Z0-9_]*=")


#: A list item of prose: a bullet or a number, then a word (``- Host: …``, ``2. The cache …``).
_LIST_ITEM_RE = re.compile(r"^(?:[-*•]|\d+[.)])\s+[A-Z][a-z]")


def is_card(text: str) -> bool:
    """Whether ``text`` is a recipe card: an ``env:`` and a ``notes:`` line, and a command before them."""
    names = {m.group(1) for m in _FIELD_RE.finditer(text)}
    return names == {"env", "notes"}


def card_fields(text: str) -> tuple[dict[str, Any], list[str], list[str]]:
    """The card as the recipe JSON's fields (title, command, env, notes), notes on what else the text
    holds, and problems."""
    first = _FIELD_RE.search(text)
    assert first is not None
    head = [p.strip() for p in re.split(r"\n[ \t]*\n", text[: first.start()]) if p.strip()]
    data: dict[str, Any] = {}
    problems: list[str] = []
    extra: list[str] = []
    if len(head) >= 2:
        data["title"], data["command"] = head[0], "\n\n".join(head[1:])
    elif head:
        data["command"] = head[0]
    rest = text[first.start() :].split("\n")
    for no, line in enumerate(rest, text.count("\n", 0, first.start()) + 1):
        m = re.match(r"^(env|notes):[ \t]", line)
        if m:
            try:
                value = yaml.safe_load(line)[m.group(1)]
            except (yaml.YAMLError, TypeError):
                problems.append(f"line {no}: the card's {m.group(1)}: line is not one quoted value")
                continue
            data[m.group(1)] = value
        elif line.strip():
            extra.append(f"line {no}: {line.strip()}")
    notes = [
        "read as a recipe card: title, command, env: and notes: (the recipe JSON's fields, laid out as text)"
    ]
    if extra:
        notes.append("text after the card, not imported: " + " | ".join(extra))
    return data, notes, problems


def is_record(text: str) -> bool:
    """Whether ``text`` is prose with no launch command: no line starts a launcher, and most lines start
    like a sentence or a list item (``Pipeline …``, ``• Date: …``, ``1. …``), not like a program name
    (``hf jobs run``, ``for m in …`` stay shell text, refused or read as such)."""
    text = strip_prompts(text)[0]
    if _LAUNCH_LINE_RE.search(text):
        return False
    lines = [ln.strip() for ln in text.splitlines() if ln.strip()]
    prose = [ln for ln in lines if _LIST_ITEM_RE.match(ln) or not _PROGRAM_RE.match(ln.split()[0])]
    return bool(lines) and len(prose) * 2 >= len(lines)
