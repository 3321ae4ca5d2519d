"""Terminal prompts in a pasted text (``$ ``, ``(venv) $ ``, ``user@host:~# ``, the ``> `` of a continued
line) and the output a pasted session shows after a prompted command: removed before bash reads the text
(bash would run ``$`` as a command), line numbers unchanged, each removal a note."""

from __future__ import annotations

import re
from collections.abc import Sequence

#: Prompts at the start of a logical line: ``$ ``, ``(venv) $ ``, ``user@host:~/x$ ``, ``root@host:~# ``.
_PROMPT_RE = re.compile(
    r"^(?P<p>[ \t]*(?:\([\w.-]+\)[ \t]*)?(?:(?:[\w.-]+@[\w.-]+(?::[^\s$#]*)?[$#])|\$)[ \t]+)(?=\S)"
)
_LAUNCH_WORD_RE = re.compile(
    r"^(?:\S+/)?(?:vllm|docker|podman|python3?(?:\.\d+)?|nohup|sudo|exec)\b|^[A-Z_]+="
)


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


#: ``<placeholder>`` written as a word of the command (``--max-model-len <n_of_tokens>``, ``<args...>``):
#: outside quotes, after a blank or ``=``, up to a blank or the line's end.
_WORD_PLACEHOLDER_RE = re.compile(r"(?<=[ \t=])<([A-Za-z_][A-Za-z0-9_ .-]*)>(?=[ \t]|\\?$)", re.M)


def quote_placeholders(text: str) -> tuple[str, list[str]]:
    """``text`` with each ``<placeholder>`` word single-quoted, so bash reads it as the word the author
    wrote and not as a redirection from a file; one note per line where it did so."""
    out: list[str] = []
    notes: list[str] = []
    for no, line in enumerate(text.split("\n"), 1):
        found: list[str] = []

        def quoted(m: re.Match[str], line: str = line, found: list[str] = found) -> str:
            before = line[: m.start()]
            if before.count('"') % 2 or before.count("'") % 2:
                return m.group(0)  # inside quotes: already a word
            found.append(m.group(0))
            return f"'{m.group(0)}'"

        out.append(_WORD_PLACEHOLDER_RE.sub(quoted, line))
        if found:
            notes.append(
                f"line {no}: {', '.join(found)} is a placeholder written in the text (bash would read '<' as "
                "a redirection); read as the word itself"
            )
    return "\n".join(out), notes


def join_blank_continuations(text: str) -> tuple[str, list[str]]:
    """``text`` with each blank line right after a ``\\`` continuation, and before an indented line or an
    option, written as a continuation itself (a web-page paste artifact; line numbers unchanged)."""
    lines = text.split("\n")
    joined: list[int] = []
    for i, line in enumerate(lines):
        body = line.rstrip("\r")
        if not body.endswith("\\") or body.endswith("\\\\"):
            continue
        j = i + 1
        while j < len(lines) and not lines[j].strip():
            j += 1
        if j > i + 1 and j < len(lines) and lines[j][:1] in (" ", "\t", "-"):
            for k in range(i + 1, j):
                lines[k] = " \\"
            joined.append(i + 1)
    if not joined:
        return text, []
    return "\n".join(lines), [
        f"the published text has a blank line after the '\\' on line(s) {', '.join(map(str, joined))} (a "
        "web-page paste artifact); a shell would end the command at the first one. Imported as one command, "
        "the way the author wrote it"
    ]
