"""Two published shapes that are not a command alone:

- **A recipe card** as the site shows it (seed 003): a title line, the command, then ``env: '…'`` and
  ``notes: "…"`` lines (YAML scalars), maybe followed by the reader's own text. It is the recipe JSON's
  fields laid out as text, so it is read into those fields and imported exactly like the JSON form.
- **A record without a command** (seed 000: an experiment write-up): one paragraph says there is no launch
  command. Where its lines name vLLM flags and values (``max-model-len 262144``, ``PP=3 / TP=1``,
  ``gpu-mem-util 0.97``), the command they describe is built from the flag table and shown; it is
  imported only when the user confirms it (``--yes``), and the spec's notes say it was proposed.

Pure: text in, fields or a proposal out.
"""

from __future__ import annotations

import re
import shlex
from dataclasses import dataclass, field
from typing import Any

import yaml

from rigsmith.importing import vllmflags
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

#: How records shorten flag names; other names are matched against the flag table and the value flags below.
SHORTHANDS = {
    "gpu-mem-util": "--gpu-memory-utilization",
    "gpu-memory-util": "--gpu-memory-utilization",
    "gpu-util": "--gpu-memory-utilization",
    "mem-util": "--gpu-memory-utilization",
    "tp": "--tensor-parallel-size",
    "pp": "--pipeline-parallel-size",
    "dp": "--data-parallel-size",
    "ep": "--enable-expert-parallel",
}
#: vLLM flags that take one value, as a record names them without dashes (``max-num-seqs 4``).
VALUE_FLAGS = frozenset(
    [
        "--max-model-len",
        "--max-num-seqs",
        "--max-num-batched-tokens",
        "--gpu-memory-utilization",
        "--kv-cache-memory",
        "--kv-cache-dtype",
        "--block-size",
        "--swap-space",
        "--cpu-offload-gb",
        "--max-cudagraph-capture-size",
        "--num-speculative-tokens",
        "--dtype",
        "--seed",
    ]
)
#: Phrases for a boolean flag switched off or on.
PHRASES = (
    (re.compile(r"\bprefix[ -]caching (?:OFF|off|disabled)\b"), "--no-enable-prefix-caching"),
    (re.compile(r"\bprefix[ -]caching (?:ON|on|enabled)\b"), "--enable-prefix-caching"),
    (re.compile(r"\benforce[ -]eager\b"), "--enforce-eager"),
)
_MODEL_RE = re.compile(
    r"\bModel:\s*(?P<repo>[A-Za-z0-9][\w.-]*/[\w.-]+)(?:\s*@\s*rev(?:ision)?\s*(?P<rev>[0-9a-f]{40}))?"
)
_VALUE_RE = re.compile(
    r"(?<![\w-])(?P<dash>--)?(?P<name>[A-Za-z][A-Za-z0-9-]*)\s*[= ]\s*(?P<value>\d+(?:\.\d+)?)\b"
)
_EXPLICIT_RE = re.compile(r"(?<![\w-])(?P<flag>--[a-z][a-z0-9-]+)(?P<rest>[ \t]*[^,\n]*)")


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
    prose = [ln for ln in lines if not _PROGRAM_RE.match(ln.split()[0])]
    return bool(lines) and len(prose) * 2 >= len(lines)


@dataclass
class Proposal:
    """The command a record's prose describes: its words, and the lines each came from."""

    argv: list[str] = field(default_factory=list)
    sources: list[str] = field(default_factory=list)
    skipped: list[str] = field(default_factory=list)

    @property
    def text(self) -> str:
        return shlex.join(self.argv)


def _flag(name: str) -> str | None:
    """The canonical vLLM flag a record's spelling names (``max-model-len``, ``TP``, ``gpu-mem-util``)."""
    low = name.lower()
    if low in SHORTHANDS:
        return SHORTHANDS[low]
    flag = vllmflags.lookup("--" + low)
    if flag is not None and flag.kind in ("value", "bool"):
        return flag.name
    return "--" + low if "--" + low in VALUE_FLAGS else None


def propose(text: str) -> Proposal | None:
    """The ``vllm serve`` command the record's lines describe, or None when they name no model."""
    model = _MODEL_RE.search(text)
    if model is None:
        return None
    out = Proposal(argv=["vllm", "serve", model.group("repo")], sources=[model.group(0)])
    if model.group("rev"):
        out.argv += ["--revision", model.group("rev")]
    seen: set[str] = set()
    for m in _VALUE_RE.finditer(text):
        flag = _flag(m.group("name"))
        known = vllmflags.lookup(flag) if flag is not None else None
        if flag is None or flag in seen or (known is not None and known.kind == "bool"):
            continue
        seen.add(flag)
        out.argv += [flag, m.group("value")]
        out.sources.append(m.group(0).strip())
    for m in _EXPLICIT_RE.finditer(text):
        flag, rest = m.group("flag"), m.group("rest").strip()
        if flag in seen or _flag(flag[2:]) in seen:
            continue
        if rest and not rest.startswith("("):
            out.skipped.append(f"{flag} {rest}")
            continue
        seen.add(flag)
        out.argv.append(flag)
        out.sources.append(flag)
    for pattern, flag in PHRASES:
        if (p := pattern.search(text)) and flag not in seen:
            seen.add(flag)
            out.argv.append(flag)
            out.sources.append(p.group(0))
    return out
