"""The questions a record leaves open, and the reading's ledger. Pure.

A record states some values only in shorthand or leaves them to the reader (the host directory its
publisher generalized, the port behind a proxy, the image its truncated digest names, the variable behind
"PLE mmap"). Each is an :class:`Ask`: ``--answers FILE`` or the terminal answers it; an ask with a default
takes the default unanswered (said in the notes); a guess unanswered is left a placeholder (or, where no
placeholder can stand, listed in ``not_taken``), so ``deploy`` refuses until the user decides.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from rigsmith import spec as specmod


@dataclass(frozen=True)
class Ask:
    """One question: ``key`` is how ``--answers`` names it (``network.port``, ``env.PLE mmap``)."""

    key: str
    question: str
    default: str | None = None
    #: True: the default is rigsmith's guess, taken only when the user accepts it.
    guess: bool = False


#: Answers an ask: the user's words, or None (no terminal and no answer given).
Answer = Callable[[Ask], str | None]


def no_answer(_ask: Ask) -> str | None:
    return None


@dataclass
class Reading:
    """What a record says, item by item: the command, env, spec fields, notes and what was not taken."""

    title: str | None = None
    repo: str | None = None
    argv: list[str] = field(default_factory=list)
    env: list[specmod.EnvVar] = field(default_factory=list)
    env_notes: list[str] = field(default_factory=list)
    #: Spec data laid over the built deployment, by dotted path (``network.listen``, ``benchmarks``).
    fields: dict[str, Any] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)
    not_taken: list[dict[str, str]] = field(default_factory=list)
    placeholders: dict[str, str | None] = field(default_factory=dict)
    asked: list[tuple[Ask, str | None]] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)
    answer: Answer = no_answer

    def ask(self, ask: Ask) -> str | None:
        """The answer to ``ask`` (stripped; None when none was given), recorded."""
        got = self.answer(ask)
        got = got.strip() if isinstance(got, str) and got.strip() else None
        self.asked.append((ask, got))
        return got

    def skip(self, item: str, why: str) -> None:
        self.not_taken.append({"item": item, "why": why})

    def set(self, path: str, value: Any) -> None:
        self.fields[path] = value


def top_split(text: str, sep: str = ",") -> list[str]:
    """``text`` split on ``sep`` outside (), [] and {} (items of a record's list)."""
    out, depth, cur = [], 0, ""
    for ch in text:
        depth += ch in "([{"
        depth -= ch in ")]}"
        if ch == sep and depth <= 0:
            out.append(cur.strip())
            cur = ""
        else:
            cur += ch
    return [x for x in [*out, cur.strip()] if x]
