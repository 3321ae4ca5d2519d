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


def _only_comments(rest: str) -> bool:
    """Whether ``rest`` of a text holds no command: only blank lines and comment lines."""
    return all(not ln.strip() or ln.lstrip().startswith("#") for ln in rest.splitlines())


def _line_end(text: str, i: int) -> int:
    j = text.find("\n", i)
    return len(text) if j < 0 else j


def scan(text: str) -> Script:
    """Split ``text`` into commands and words like a POSIX shell would, expanding nothing.

    Line continuations (``\\`` + newline) join lines; CRLF line ends count as LF outside quotes; a
    ``#`` at the start of a word starts a comment; ``<name>`` at the start of a word is a placeholder,
    not a redirection. Everything a shell would read differently from the author's evident intent is
    reported in ``problems`` (with its line); harmless repairs are reported in ``notes``.
    """
    scanner = _Scanner(text)
    scanner.run()
    return scanner.out


class _Scanner:
    """One pass over the text: a cursor (``i``, ``line``), the command's words so far and the word being
    read (``cur``); each state of the shell's reading (comment, backslash, quotes, operators, substitutions)
    is a method that moves the cursor past what it read."""

    def __init__(self, text: str) -> None:
        self.text = text
        self.n = len(text)
        self.out = Script()
        self.i = 0
        self.line = 1
        self.words: list[Word] = []
        self.cmd_line = 1
        self.cur: list[str] | None = None
        self.cur_line = 1
        self.cur_expands = False
        self.blank_after: list[int] = []

    def end_word(self) -> None:
        if self.cur is not None:
            self.words.append(Word("".join(self.cur), self.cur_line, self.cur_expands))
        self.cur = None
        self.cur_expands = False

    def start_word(self) -> list[str]:
        if self.cur is None:
            if not self.words:
                self.cmd_line = self.line
            self.cur = []
            self.cur_line = self.line
        return self.cur

    def end_command(self, comment: str | None = None) -> None:
        self.end_word()
        if self.words:
            self.out.commands.append(Command(tuple(self.words), self.cmd_line, comment))
        elif comment is not None:
            self.out.comments.append((self.line, comment))
        self.words = []

    def run(self) -> None:
        text = self.text
        while self.i < self.n:
            c = text[self.i]
            if c == "\r" and text.startswith("\n", self.i + 1):
                self.i += 1
            elif c in _BLANKS:
                self.end_word()
                self.i += 1
            elif c == "\n":
                self.end_command()
                self.line += 1
                self.i += 1
            elif c == "#" and self.cur is None:
                self.comment()
            elif c == "\\":
                self.backslash()
            elif c in "'\"":
                if not (self.single_quote() if c == "'" else self.double_quote()):
                    break
            elif c in _OPERATOR_CHARS:
                self.operator()
            elif c in "<>":
                self.angle(c)
            elif c in "()" and self.cur is None:
                self.out.problems.append(
                    f"line {self.line}: an unquoted {c!r} is shell syntax (a subshell or function), not part "
                    "of one command"
                )
                self.i += 1
            elif (c == "$" and text.startswith("(", self.i + 1)) or c == "`":
                self.substitution(c)
            else:
                if c == "$":
                    self.cur_expands = True
                self.start_word().append(c)
                self.i += 1
        self.end_command()
        if self.blank_after:
            lines = ", ".join(str(x) for x in self.blank_after)
            self.out.notes.append(
                f"the published text has a blank line after the '\\' on line(s) {lines} (a web-page paste "
                "artifact); a shell would end the command at the first one. Imported as one command, the way "
                "the author wrote it"
            )

    def comment(self) -> None:
        text, i, line = self.text, self.i, self.line
        j = _line_end(text, i)
        comment = text[i + 1 : j].rstrip("\r").strip()
        if comment.endswith("\\") and self.words and not _only_comments(text[j:]):
            # On a standalone comment line (the command already ended) the '\\' continues nothing; nor does
            # it where only comments follow to the end (the command ends there, as its author left it).
            self.out.problems.append(
                f"line {line}: the comment '#{text[i + 1 : j].rstrip()}' ends with '\\', but a comment "
                "swallows the line continuation: a shell ends the command here and runs the next line "
                "on its own. Move the comment off the command (or delete it) and import again"
            )
        if self.words:
            self.end_command(comment)
        else:
            self.out.comments.append((line, comment))
        self.i = j

    def backslash(self) -> None:
        text, i = self.text, self.i
        nxt = text[i + 1 : i + 2]
        if nxt == "\n" or (nxt == "\r" and text.startswith("\n", i + 2)):
            self.continuation(nxt)
            return
        if nxt in (" ", "\t"):
            rest = text[i + 1 : _line_end(text, i)].strip(" \t\r")
            if not rest or rest.startswith("#"):
                what = "then a comment" if rest else "then the end of the line"
                self.out.problems.append(
                    f"line {self.line}: '\\' is followed by a space ({what}), so it escapes the space, not "
                    "the newline: a shell ends the command here and runs the next line as a separate "
                    "command. Put the '\\' last on the line (move any comment away) and import again"
                )
        if nxt == "":
            self.start_word().append("\\")
            self.i += 1
            return
        self.start_word().append(nxt)
        self.i += 2

    def continuation(self, nxt: str) -> None:
        """``\\`` + newline: the lines joined; blank lines after it (a paste artifact) skipped and noted; a
        word glued to the next line's first word refused."""
        text, n = self.text, self.n
        before = text[self.i - 1] if self.i > 0 else " "
        self.i += 2 if nxt == "\n" else 3
        self.line += 1
        first_blank = self.line
        while self.i < n:
            j = _line_end(text, self.i)
            if text[self.i : j].strip(" \t\r") or j >= n:
                break
            self.i = j + 1
            self.line += 1
        if self.line != first_blank:
            self.blank_after.append(first_blank - 1)
        nxt_char = text[self.i : self.i + 1]
        if self.cur is not None and before not in _BLANKS and nxt_char and nxt_char not in _BLANKS + "\r\n":
            glued = "".join(self.cur) + text[self.i : _line_end(text, self.i)].split(" ", 1)[0]
            self.out.problems.append(
                f"line {self.line - 1}: no space before the '\\' and line {self.line} starts at column 0, so "
                f"a shell glues them into one word ({glued!r}); add a space before the '\\'"
            )

    def single_quote(self) -> bool:
        """A single-quoted part of a word; False when the quote is never closed."""
        j = self.text.find("'", self.i + 1)
        if j < 0:
            self.out.problems.append(f"line {self.line}: a single quote (') is never closed")
            return False
        self.start_word().append(self.text[self.i + 1 : j])
        self.line += self.text.count("\n", self.i, j)
        self.i = j + 1
        return True

    def double_quote(self) -> bool:
        """A double-quoted part of a word (POSIX's backslash rules inside); False when never closed."""
        text, n = self.text, self.n
        buf = self.start_word()
        k = self.i + 1
        while k < n:
            ch = text[k]
            if ch == "\\" and k + 1 < n and text[k + 1] in '$`"\\\n':
                if text[k + 1] == "\n":
                    self.line += 1
                else:
                    buf.append(text[k + 1])
                k += 2
                continue
            if ch == '"':
                self.i = k + 1
                return True
            if ch in "$`":
                self.cur_expands = True
            if ch == "\n":
                self.line += 1
            buf.append(ch)
            k += 1
        self.out.problems.append(f'line {self.line}: a double quote (") is never closed')
        return False

    def operator(self) -> None:
        j = self.i
        while j < self.n and self.text[j] in _OPERATOR_CHARS:
            j += 1
        op = self.text[self.i : j]
        what = "runs the command in the background" if op == "&" else "chains another command"
        self.out.problems.append(
            f"line {self.line}: the shell operator {op!r} {what}; rigsmith imports exactly one command. "
            f"Remove {op!r} and whatever it chains"
        )
        self.end_word()
        self.i = j

    def angle(self, c: str) -> None:
        """``<name>`` at the start of a word is a placeholder; any other ``<``/``>`` a redirection."""
        m = PLACEHOLDER_RE.match(self.text, self.i)
        if c == "<" and m:
            self.start_word().append(m.group(0))
            self.i = m.end()
            return
        self.out.problems.append(
            f"line {self.line}: {c!r} is a shell redirection here; quote it if it belongs to a value, or "
            "remove the redirection"
        )
        self.start_word().append(c)
        self.i += 1

    def substitution(self, c: str) -> None:
        """``$(…)`` or a backtick substitution, kept whole (nested parentheses counted), not expanded."""
        text, i = self.text, self.i
        close = ")" if c == "$" else "`"
        k = i + (2 if c == "$" else 1)
        depth = 1
        while k < self.n and depth:
            if c == "$" and text[k] == "(":
                depth += 1
            elif text[k] == close:
                depth -= 1
            k += 1
        self.start_word().append(text[i:k])
        self.line += text.count("\n", i, k)
        self.cur_expands = True
        self.i = k


def split(text: str) -> list[str]:
    """Words of one command; raises ValueError naming every problem if the text is not exactly one."""
    script = scan(text)
    problems = list(script.problems)
    if len(script.commands) > 1:
        problems.append(f"{len(script.commands)} commands where one was expected")
    if problems:
        raise ValueError("; ".join(problems))
    return script.commands[0].argv if script.commands else []
