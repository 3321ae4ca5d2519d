"""Statements of a published shell text: prompts stripped, tokens grouped into simple commands,
pipelines and ``if`` blocks, and the small helpers on words the evaluator shares (:mod:`shelleval`).

Pure: tokens in, statements out.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass

from rigsmith.importing.shelllex import Lit, Op, Part, Redir, Word

#: Prompts at the start of a logical line: ``$ ``, ``(venv) $ ``, ``user@host:~/x$ ``, ``root@host:~# ``.
_PROMPT_RE = re.compile(
    r"^(?P<p>[ \t]*(?:\([\w.-]+\)[ \t]*)?(?:(?:[\w.-]+@[\w.-]+(?::[^\s$#]*)?[$#])|\$)[ \t]+)(?=\S)"
)
_LAUNCH_WORD_RE = re.compile(
    r"^(?:\S+/)?(?:vllm|docker|podman|python3?(?:\.\d+)?|nohup|sudo|exec)\b|^[A-Z_]+="
)

# -- prompts -----------------------------------------------------------------------------------------


def strip_prompts(text: str) -> tuple[str, list[str]]:
    """``text`` without terminal prompts (``$ ``, ``(venv) $ ``, ``user@host:~# ``, the ``> `` of a
    continued line), line numbers unchanged; and one note per prompt removed."""
    out, notes = [], []
    continued = prompted = False
    output: list[int] = []
    for no, line in enumerate(text.split("\n"), 1):
        m = _PROMPT_RE.match(line)
        if prompted and not continued and not m and line.strip() and not line.lstrip().startswith(">"):
            # a terminal session: what follows a prompted command (until the next prompt) is its output
            output.append(no)
            out.append("")
            continue
        if not continued and m:
            prompted = True
            notes.append(
                f"line {no}: the shell prompt {m.group('p').strip() + ' '!r} before the command is not "
                "part of it"
            )
            line = line[m.end("p") :]
        elif re.match(r"^[ \t]*>[ \t]+\S", line) and (
            continued or _LAUNCH_WORD_RE.match(line.lstrip("> \t"))
        ):
            notes.append(f"line {no}: the continuation prompt '>' is not part of the command")
            line = re.sub(r"^[ \t]*>", " ", line, count=1)
        continued = line.rstrip("\r").endswith("\\") and not line.rstrip("\r").endswith("\\\\")
        out.append(line)
    if output:
        notes.append(
            f"line(s) {_ranges(output)}: terminal output after a prompted command (a pasted session); "
            "not imported"
        )
    return "\n".join(out), notes


def _ranges(numbers: Sequence[int]) -> str:
    """``1-3, 7`` for [1, 2, 3, 7]."""
    spans: list[list[int]] = []
    for n in numbers:
        if spans and n == spans[-1][1] + 1:
            spans[-1][1] = n
        else:
            spans.append([n, n])
    return ", ".join(f"{a}-{b}" if a != b else str(a) for a, b in spans)


# -- statements ----------------------------------------------------------------------------------------


@dataclass
class Simple:
    """One simple command: its words, redirections, the operator after it and the command it pipes to."""

    words: list[Word]
    redirs: list[Redir]
    line: int
    sep: str = "\n"
    pipe: Simple | None = None
    pipe_op: str = ""


@dataclass
class If:
    """``if``/``elif``/``else``/``fi``: (test, body) per branch; test None for ``else``."""

    branches: list[tuple[Simple | None, list[Node]]]
    line: int


Node = Simple | If


def simples_of(tokens: Sequence[Word | Op | Redir]) -> list[Simple]:
    out: list[Simple] = []
    words: list[Word] = []
    redirs: list[Redir] = []
    line = 1
    for tok in tokens:
        if isinstance(tok, Word):
            if not words and not redirs:
                line = tok.line
            words.append(tok)
        elif isinstance(tok, Redir):
            if not words and not redirs:
                line = tok.line
            redirs.append(tok)
        else:
            if words or redirs:
                out.append(Simple(words, redirs, line, tok.text))
            elif tok.text != "\n" and out:
                out[-1].sep = tok.text if out[-1].sep == "\n" else out[-1].sep
            words, redirs = [], []
    if words or redirs:
        out.append(Simple(words, redirs, line, ""))
    # a keyword in command position starts its own command: `then vllm serve …`
    split: list[Simple] = []
    for s in out:
        if (
            s.words
            and s.words[0].plain in ("then", "else", "do")
            and s.words[0].unquoted
            and len(s.words) > 1
        ):
            split.append(Simple([s.words[0]], [], s.line, "\n"))
            split.append(Simple(s.words[1:], s.redirs, s.line, s.sep))
        else:
            split.append(s)
    # pipelines: `a | b` is one node
    piped: list[Simple] = []
    for s in split:
        if piped and piped[-1].sep in ("|", "|&"):
            head = piped[-1]
            while head.pipe is not None:
                head = head.pipe
            head.pipe, head.pipe_op = s, piped[-1].sep
            piped[-1].sep = s.sep
        else:
            piped.append(s)
    return piped


def keyword(s: Simple) -> str | None:
    w = s.words[0] if s.words else None
    return w.plain if w is not None and w.unquoted else None


def nodes_of(
    simples: list[Simple], i: int, stop: frozenset[str], problems: list[str]
) -> tuple[list[Node], int]:
    """Nodes from ``simples[i:]`` up to a command starting with a word in ``stop`` (returned index)."""
    out: list[Node] = []
    while i < len(simples):
        s = simples[i]
        kw = keyword(s)
        if kw in stop:
            return out, i
        if kw == "if":
            node, i = _if(simples, i, problems)
            if node is None:
                return out, len(simples)
            out.append(node)
            continue
        out.append(s)
        i += 1
    return out, i


def _if(simples: list[Simple], i: int, problems: list[str]) -> tuple[If | None, int]:
    start = simples[i]
    branches: list[tuple[Simple | None, list[Node]]] = []
    test: Simple | None = Simple(start.words[1:], start.redirs, start.line, start.sep)
    i += 1
    while True:
        if i >= len(simples) or keyword(simples[i]) != "then":
            if test is not None:
                problems.append(f"line {start.line}: 'if' without 'then'")
                return None, len(simples)
        else:
            i += 1
        body, i = nodes_of(simples, i, frozenset({"elif", "else", "fi"}), problems)
        branches.append((test, body))
        if i >= len(simples):
            problems.append(f"line {start.line}: 'if' is never closed with 'fi'")
            return None, i
        s = simples[i]
        kw = keyword(s)
        if kw == "fi":
            if len(s.words) > 1:
                problems.append(f"line {s.line}: words after 'fi' on the same command")
            return If(branches, start.line), i + 1
        if kw == "else":
            test = None
            i += 1
            body, i = nodes_of(simples, i, frozenset({"fi"}), problems)
            branches.append((None, body))
            if i >= len(simples):
                problems.append(f"line {start.line}: 'if' is never closed with 'fi'")
                return None, i
            return If(branches, start.line), i + 1
        test = Simple(s.words[1:], s.redirs, s.line, s.sep)  # elif
        i += 1


def compare(values: list[str]) -> bool | None:
    if len(values) == 1:
        return values[0] != ""
    if len(values) == 2 and values[0] in ("-n", "-z"):
        return (values[1] != "") == (values[0] == "-n")
    if len(values) == 3:
        a, op, b = values
        if op in ("=", "=="):
            return a == b
        if op == "!=":
            return a != b
        nums = {
            "-eq": int.__eq__,
            "-ne": int.__ne__,
            "-lt": int.__lt__,
            "-le": int.__le__,
            "-gt": int.__gt__,
            "-ge": int.__ge__,
        }
        if op in nums and re.fullmatch(r"-?\d+", a.strip()) and re.fullmatch(r"-?\d+", b.strip()):
            return bool(nums[op](int(a), int(b)))
    return None


def dq(text: str) -> str:
    return re.sub(r'([\\"$`])', r"\\\1", text)


def lead(word: Word) -> str:
    """The unquoted literal text the word starts with (``NAME=`` of ``NAME=$X``)."""
    out = []
    for p in word.parts:
        if not isinstance(p, Lit) or p.quoted:
            break
        out.append(p.text)
    return "".join(out)


def after_eq(word: Word) -> list[Part]:
    """The parts of an assignment word after its ``=``."""
    parts = list(word.parts)
    out: list[Part] = []
    seen = False
    for p in parts:
        if seen:
            out.append(p)
        elif isinstance(p, Lit) and "=" in p.text:
            rest = p.text.split("=", 1)[1]
            if rest:
                out.append(Lit(rest, p.quoted))
            seen = True
    return out
