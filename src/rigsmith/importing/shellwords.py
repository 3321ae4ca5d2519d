"""POSIX word splitting of published command text, without expanding anything.

Why not ``shlex.split`` alone: it keeps ``\\<newline>`` as a literal newline word instead of joining the
lines, keeps the backslash in ``"\\$"`` (POSIX drops it), and cannot tell a comment that swallows a line
continuation from one that does not. Those are exactly the quirks published vLLM commands have, so this
scanner walks the text once, splits words the way a POSIX shell does (quotes removed, nothing expanded),
and records every place where a shell would do something other than what the author evidently meant.
``shlex.join``/``shlex.quote`` stay the way argv is turned back into text.

Pure: text in, :class:`Script` out.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

#: ``<placeholder>`` tokens as recipes write them (same grammar as the spec's placeholders).
PLACEHOLDER_RE = re.compile(r"<[A-Za-z_][A-Za-z0-9_ .-]*>")
_BLANKS = " \t"
_OPERATOR_CHARS = ";&|"


@dataclass(frozen=True)
class Word:
    """One shell word: its text after quote removal, the line it starts on, and whether a shell would
    have expanded part of it (``$``, backticks outside single quotes)."""

    text: str
    line: int
    expands: bool = False


@dataclass(frozen=True)
class Command:
    """One simple command (a logical line): its words and the comment that ends it, if any."""

    words: tuple[Word, ...]
    line: int
    comment: str | None = None

    @property
    def argv(self) -> list[str]:
        """The words as plain strings."""
        return [w.text for w in self.words]


@dataclass
class Script:
    """What the scanner found: commands, stand-alone comments, problems (refusals) and notes."""

    commands: list[Command] = field(default_factory=list)
    comments: list[tuple[int, str]] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)


def _line_end(text: str, i: int) -> int:
    j = text.find("\n", i)
    return len(text) if j < 0 else j


# Over 80 lines on purpose: a single-pass scanner whose states (word, quotes, comment, continuation) share
# one cursor; split into functions they would pass (i, line, words) back and forth on every character.
def scan(text: str) -> Script:
    """Split ``text`` into commands and words like a POSIX shell would, expanding nothing.

    Line continuations (``\\`` + newline) join lines; CRLF line ends count as LF outside quotes; a
    ``#`` at the start of a word starts a comment; ``<name>`` at the start of a word is a placeholder,
    not a redirection. Everything a shell would read differently from the author's evident intent is
    reported in ``problems`` (with its line); harmless repairs are reported in ``notes``.
    """
    out = Script()
    n = len(text)
    i = 0
    line = 1
    words: list[Word] = []
    cmd_line = 1
    cur: list[str] | None = None
    cur_line = 1
    cur_expands = False
    blank_after: list[int] = []

    def end_word() -> None:
        nonlocal cur, cur_expands
        if cur is not None:
            words.append(Word("".join(cur), cur_line, cur_expands))
        cur = None
        cur_expands = False

    def start_word() -> list[str]:
        nonlocal cur, cur_line, cmd_line
        if cur is None:
            if not words:
                cmd_line = line
            cur = []
            cur_line = line
        return cur

    def end_command(comment: str | None = None) -> None:
        nonlocal words, cmd_line
        end_word()
        if words:
            out.commands.append(Command(tuple(words), cmd_line, comment))
        elif comment is not None:
            out.comments.append((line, comment))
        words = []

    while i < n:
        c = text[i]
        if c == "\r" and text.startswith("\n", i + 1):
            i += 1
            continue
        if c in _BLANKS:
            end_word()
            i += 1
            continue
        if c == "\n":
            end_command()
            line += 1
            i += 1
            continue
        if c == "#" and cur is None:
            j = _line_end(text, i)
            comment = text[i + 1 : j].rstrip("\r").strip()
            if comment.endswith("\\") and words:
                # On a standalone comment line (the command already ended) the '\\' continues nothing.
                out.problems.append(
                    f"line {line}: the comment '#{text[i + 1 : j].rstrip()}' ends with '\\', but a comment "
                    "swallows the line continuation: a shell ends the command here and runs the next line "
                    "on its own. Move the comment off the command (or delete it) and import again"
                )
            if words:
                end_command(comment)
            else:
                out.comments.append((line, comment))
            i = j
            continue
        if c == "\\":
            nxt = text[i + 1 : i + 2]
            if nxt == "\n" or (nxt == "\r" and text.startswith("\n", i + 2)):
                before = text[i - 1] if i > 0 else " "
                i += 2 if nxt == "\n" else 3
                line += 1
                first_blank = line
                while i < n:
                    j = _line_end(text, i)
                    if text[i:j].strip(" \t\r") or j >= n:
                        break
                    i = j + 1
                    line += 1
                if line != first_blank:
                    blank_after.append(first_blank - 1)
                nxt_char = text[i : i + 1]
                if (
                    cur is not None
                    and before not in _BLANKS
                    and nxt_char
                    and nxt_char not in _BLANKS + "\r\n"
                ):
                    glued = "".join(cur) + text[i : _line_end(text, i)].split(" ", 1)[0]
                    out.problems.append(
                        f"line {line - 1}: no space before the '\\' and line {line} starts at column 0, so a "
                        f"shell glues them into one word ({glued!r}); add a space before the '\\'"
                    )
                continue
            if nxt in (" ", "\t"):
                rest = text[i + 1 : _line_end(text, i)].strip(" \t\r")
                if not rest or rest.startswith("#"):
                    what = "then a comment" if rest else "then the end of the line"
                    out.problems.append(
                        f"line {line}: '\\' is followed by a space ({what}), so it escapes the space, not "
                        "the newline: a shell ends the command here and runs the next line as a separate "
                        "command. Put the '\\' last on the line (move any comment away) and import again"
                    )
            if nxt == "":
                start_word().append("\\")
                i += 1
                continue
            start_word().append(nxt)
            i += 2
            continue
        if c == "'":
            j = text.find("'", i + 1)
            if j < 0:
                out.problems.append(f"line {line}: a single quote (') is never closed")
                break
            start_word().append(text[i + 1 : j])
            line += text.count("\n", i, j)
            i = j + 1
            continue
        if c == '"':
            buf = start_word()
            k = i + 1
            closed = False
            while k < n:
                ch = text[k]
                if ch == "\\" and k + 1 < n and text[k + 1] in '$`"\\\n':
                    if text[k + 1] == "\n":
                        line += 1
                    else:
                        buf.append(text[k + 1])
                    k += 2
                    continue
                if ch == '"':
                    closed = True
                    break
                if ch in "$`":
                    cur_expands = True
                if ch == "\n":
                    line += 1
                buf.append(ch)
                k += 1
            if not closed:
                out.problems.append(f'line {line}: a double quote (") is never closed')
                break
            i = k + 1
            continue
        if c in _OPERATOR_CHARS:
            j = i
            while j < n and text[j] in _OPERATOR_CHARS:
                j += 1
            op = text[i:j]
            what = "runs the command in the background" if op == "&" else "chains another command"
            out.problems.append(
                f"line {line}: the shell operator {op!r} {what}; rigsmith imports exactly one command. "
                f"Remove {op!r} and whatever it chains"
            )
            end_word()
            i = j
            continue
        if c in "<>":
            m = PLACEHOLDER_RE.match(text, i)
            if c == "<" and m:
                start_word().append(m.group(0))
                i = m.end()
                continue
            out.problems.append(
                f"line {line}: {c!r} is a shell redirection here; quote it if it belongs to a value, or "
                "remove the redirection"
            )
            start_word().append(c)
            i += 1
            continue
        if c in "()" and cur is None:
            out.problems.append(
                f"line {line}: an unquoted {c!r} is shell syntax (a subshell or function), not part of one "
                "command"
            )
            i += 1
            continue
        if (c == "$" and text.startswith("(", i + 1)) or c == "`":
            close = ")" if c == "$" else "`"
            k = i + (2 if c == "$" else 1)
            depth = 1
            while k < n and depth:
                if c == "$" and text[k] == "(":
                    depth += 1
                elif text[k] == close:
                    depth -= 1
                k += 1
            start_word().append(text[i:k])
            line += text.count("\n", i, k)
            cur_expands = True
            i = k
            continue
        if c == "$":
            cur_expands = True
        start_word().append(c)
        i += 1
    end_command()
    if blank_after:
        lines = ", ".join(str(x) for x in blank_after)
        out.notes.append(
            f"the published text has a blank line after the '\\' on line(s) {lines} (a web-page paste "
            "artifact); a shell would end the command at the first one. Imported as one command, the way "
            "the author wrote it"
        )
    return out


def split(text: str) -> list[str]:
    """Words of one command; raises ValueError naming every problem if the text is not exactly one."""
    script = scan(text)
    problems = list(script.problems)
    if len(script.commands) > 1:
        problems.append(f"{len(script.commands)} commands where one was expected")
    if problems:
        raise ValueError("; ".join(problems))
    return script.commands[0].argv if script.commands else []
