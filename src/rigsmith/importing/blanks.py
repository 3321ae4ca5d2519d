"""A blank a script's author left to fill (issue 35): ``MODEL_PATH=""`` and later ``--model $MODEL_PATH``.

bash word-splits the empty value away, so the launch reads ``--model --trust-remote-code``: vLLM stops on
it, and the text means "write the model here". The rule, read from bash's own runs (``bashjail``), never
from a parser of ours: a variable that bash's trace shows assigned only the empty string (``NAME=``), whose
value, once the text has assigned it, stands as the value of a flag that takes one (``vllmflags``), where
the run with the empty value left that flag without one (the next word is an option, or none, or the empty
word), is the placeholder ``<NAME>`` the user fills. An empty accumulator (``ARGS=""; ARGS+=" --x"``) or
an empty variable that is not a flag's value (``$EXTRA`` at the end of the command) stays as bash runs it.
Pure: the jail's runs are ``bashjail``'s.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence

from rigsmith.importing import vllmflags
from rigsmith.importing.tracewords import trace_words
from rigsmith.importing.unknown import placeholder

_DECLARE = ("export", "local", "declare", "readonly", "typeset")
_ASSIGN_RE = re.compile(r"([A-Za-z_][A-Za-z0-9_]*)(\+?)=(.*)", re.S)


def empty_assigned(trace: Iterable[tuple[int, str]], reserved: Iterable[str]) -> dict[str, int]:
    """The names bash's trace shows assigned, each time, the empty string (``NAME=``), with the line of
    the first; a name ever given a value or appended to (``NAME+=…``) is not one."""
    empty: dict[str, int] = {}
    valued: set[str] = set()
    for line, cmd in trace:
        words = trace_words(cmd)
        if words and words[0] in _DECLARE:
            words = [w for w in words[1:] if not w.startswith("-")]
        for word in words:
            m = _ASSIGN_RE.fullmatch(word)
            if m is None:
                break  # the command itself: its words are arguments, not assignments
            name, plus, value = m.groups()
            if value or plus:
                valued.add(name)
            else:
                empty.setdefault(name, line)
    skip = set(reserved)
    return {n: at for n, at in empty.items() if n not in valued and n not in skip and not n.startswith("__")}


def _takes_value(word: str) -> bool:
    """An option word that takes a value as vLLM's parser reads it (not ``--x=v``, not a boolean)."""
    if not vllmflags.is_option(word) or "=" in word:
        return False
    flag = vllmflags.lookup(word)
    return flag is None or flag.kind != "bool"


def left_blank(name: str, plain: Sequence[str], filled: Sequence[str]) -> str | None:
    """The flag whose value ``<name>`` is in the ``filled`` run's argv where the ``plain`` run (the empty
    value) left that flag without one, or None."""
    token = placeholder(name)
    for i, word in enumerate(filled):
        if word.startswith("--") and word.endswith("=" + token):  # --flag=<NAME>: plain had --flag=
            flag = word[: -len(token)]
            k = sum(1 for w in filled[:i] if w.startswith(flag))
            same = [w for w in plain if w.startswith(flag)]
            if k < len(same) and same[k] == flag:
                return flag[:-1]
        elif word == token and i > 0 and _takes_value(filled[i - 1]):
            flag = filled[i - 1]
            at = [j for j, w in enumerate(plain) if w == flag]
            k = list(filled[: i - 1]).count(flag)
            if k < len(at) and (
                at[k] + 1 == len(plain) or plain[at[k] + 1] == "" or vllmflags.is_option(plain[at[k] + 1])
            ):
                return flag
    return None


def blanks(
    candidates: Mapping[str, int], plain: Sequence[Sequence[str]], filled: Sequence[Sequence[str]]
) -> dict[str, tuple[int, str]]:
    """Of ``candidates`` (name → line of its empty assignment), those the runs show to be blanks: name →
    (line, flag). The runs' launches are compared one by one (a different count: none)."""
    if len(plain) != len(filled):
        return {}
    out: dict[str, tuple[int, str]] = {}
    for name, line in candidates.items():
        for a, b in zip(plain, filled, strict=True):
            if (flag := left_blank(name, a, b)) is not None:
                out[name] = (line, flag)
                break
    return out


def note(name: str, line: int, flag: str, secret: bool) -> str:
    """The one line that says what became of a blank."""
    then = (
        f"{name} names a secret, whose value the spec never holds: the host's environment gives it at run "
        f"time (the note on {flag} says which variable)"
        if secret
        else f"it is the placeholder {placeholder(name)}, which you fill in before deploy"
    )
    return (
        f"line {line}: {name} is assigned only the empty string, and bash then leaves {flag} without its "
        f"value: a blank the text leaves to fill; {then}"
    )
