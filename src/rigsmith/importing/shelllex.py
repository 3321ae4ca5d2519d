"""Tokens of a published shell text, with the quoting kept: the input of :mod:`shelleval`.

:mod:`shellwords` splits one command into words (quotes removed, nothing expanded). To *evaluate* a script
— ``MODEL=…`` then ``vllm serve $MODEL``, ``nohup … > log 2>&1 &``, ``if [ … ]; then`` — the evaluator needs
more: which ``$`` is quoted (field splitting), where operators, redirections and comments are, and each
word's source span (an untouched word is handed on byte for byte). This lexer gives that and nothing
else; it expands, runs and reads nothing.

Pure: text in, :class:`Lexed` out.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from rigsmith.importing.shellwords import PLACEHOLDER_RE

_BLANKS = " \t"
_NAME_RE = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_SPECIAL_PARAMS = "@*#?$!-0123456789"
_REDIR_RE = re.compile(r"(?:&>>?|[0-9]*(?:>>|>\||<<<|<<-?|<>|>&|<&|>|<))")


@dataclass(frozen=True)
class Lit:
    """Literal characters; ``quoted`` when single-quoted, escaped or inside double quotes."""

    text: str
    quoted: bool


@dataclass(frozen=True)
class Param:
    """``$NAME`` / ``${NAME}`` / ``${NAME<op><arg>}``; ``op`` is ``""`` or one of ``:- - := = :? ? :+ +``."""

    name: str
    op: str
    arg: tuple[Part, ...] | None
    quoted: bool
    src: str


@dataclass(frozen=True)
class Sub:
    """Shell syntax the evaluator never runs: ``$(…)``, backticks, ``$((…))``, ``${#X}`` and the like."""

    kind: str  # "command substitution" | "arithmetic" | "parameter operation"
    quoted: bool
    src: str


Part = Lit | Param | Sub


@dataclass(frozen=True)
class Word:
    """One word: its parts, its source span and line."""

    parts: tuple[Part, ...]
    start: int
    end: int
    line: int

    @property
    def plain(self) -> str | None:
        """The word's text when it expands nothing, else None."""
        if all(isinstance(p, Lit) for p in self.parts):
            return "".join(p.text for p in self.parts if isinstance(p, Lit))
        return None

    @property
    def unquoted(self) -> bool:
        """Whether no part of the word was quoted (a keyword or operator-like word is only that then)."""
        return all(isinstance(p, Lit) and not p.quoted for p in self.parts)


@dataclass(frozen=True)
class Op:
    """A control operator (``;`` ``&&`` ``||`` ``|`` ``|&`` ``&`` ``;;``) or a line end (``\\n``)."""

    text: str
    line: int
    start: int


@dataclass(frozen=True)
class Redir:
    """A redirection operator and its target word (None for a here-document marker we refuse)."""

    op: str
    target: Word | None
    line: int
    start: int
    end: int


Token = Word | Op | Redir


@dataclass
class Lexed:
    """Tokens, comments (line, text, inside a command), refusals, notes and asks (what bash would do
    differently from what the author evidently meant, accepted only with consent)."""

    tokens: list[Token] = field(default_factory=list)
    comments: list[tuple[int, str]] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    asks: list[str] = field(default_factory=list)


class _Lexer:
    """One pass over the text; each ``_`` method consumes one construct from ``self.i``."""

    def __init__(self, text: str, accept: bool) -> None:
        self.text = text
        self.n = len(text)
        self.i = 0
        self.line = 1
        self.accept = accept
        self.out = Lexed()
        self.parts: list[Part] | None = None
        self.word_start = 0
        self.word_line = 1
        self.in_command = False  # words seen since the last operator / line end
        self.case_depth = 0  # inside `case … esac`, whose `)` are pattern ends, not syntax errors

    # -- words -------------------------------------------------------------------------------------

    def start(self) -> list[Part]:
        if self.parts is None:
            self.parts = []
            self.word_start = self.i
            self.word_line = self.line
        return self.parts

    def end_word(self) -> Word | None:
        if self.parts is None:
            return None
        word = Word(tuple(self.parts), self.word_start, self.i, self.word_line)
        self.parts = None
        if word.unquoted and word.plain in ("case", "esac") and (word.plain == "esac" or not self.in_command):
            self.case_depth += 1 if word.plain == "case" else -1 if self.case_depth else 0
        self.out.tokens.append(word)
        self.in_command = True
        return word

    def op(self, text: str, start: int) -> None:
        self.end_word()
        self.out.tokens.append(Op(text, self.line, start))
        self.in_command = False

    # -- the pass ----------------------------------------------------------------------------------

    def run(self) -> Lexed:
        text = self.text
        while self.i < self.n:
            c, before = text[self.i], self.i
            if c == "\r" and text.startswith("\n", self.i + 1):
                self.i += 1
            elif c in _BLANKS:
                self.end_word()
                self.i += 1
            elif c == "\n":
                self.op("\n", self.i)
                self.line += 1
                self.i += 1
            elif c == "#" and self.parts is None:
                self.comment()
            elif c == "\\":
                self.backslash()
            elif c == "'":
                if not self.single_quoted():
                    break
            elif c == '"':
                if not self.double_quoted():
                    break
            elif c in "$`":
                self.start().append(self.dollar(quoted=False))
            elif c in ";&|":
                self.operator()
            elif c in "<>":
                self.redirection()
            elif c in "()":
                self.paren(c)
            else:
                self.start().append(Lit(c, False))
                self.i += 1
            if self.i <= before:  # every step consumes text: one that did not would read it again forever
                self.out.problems.append(f"line {self.line}: cannot read {text[before : before + 12]!r}")
                break
        self.end_word()
        return self.out

    def comment(self) -> None:
        j = self.text.find("\n", self.i)
        j = self.n if j < 0 else j
        body = self.text[self.i + 1 : j].rstrip("\r")
        if body.rstrip().endswith("\\") and self.in_command:
            # The comment swallows the continuation: bash ends the command here and runs the next line on
            # its own. The author's intent (one command, the comment an aside) is plain; ask for it.
            self.out.asks.append(
                f"line {self.line}: the comment '#{body.rstrip()}' ends with '\\', but a comment swallows "
                "the line continuation: bash would end the command here and run the next line on its own. "
                "--yes imports the lines as one command, as if the comment were removed"
            )
            if self.accept:
                self.out.comments.append((self.line, body.strip().removesuffix("\\").strip()))
                self.i = j + 1
                self.line += 1
                return
        self.out.comments.append((self.line, body.strip()))
        self.i = j

    def backslash(self) -> None:
        text, i = self.text, self.i
        nxt = text[i + 1 : i + 2]
        if nxt == "\n" or (nxt == "\r" and text.startswith("\n", i + 2)):
            self.i += 2 if nxt == "\n" else 3
            self.line += 1
            first = self.line
            while self.i < self.n:  # blank lines after a continuation: a web-paste artifact
                j = text.find("\n", self.i)
                if j < 0 or text[self.i : j].strip(" \t\r"):
                    break
                self.i = j + 1
                self.line += 1
            if self.line != first:
                self.out.notes.append(
                    f"the published text has a blank line after the '\\' on line {first - 1} (a web-page "
                    "paste artifact); bash would end the command there. Imported as one command, the way the "
                    "author wrote it"
                )
            return
        if nxt in (" ", "\t"):
            j = text.find("\n", i)
            j = self.n if j < 0 else j
            rest = text[i + 1 : j].strip(" \t\r")
            if (
                j < self.n
                and (not rest or rest.startswith("#"))
                and (self.in_command or self.parts is not None)
            ):
                what = "then a comment" if rest else "then the end of the line"
                self.out.asks.append(
                    f"line {self.line}: '\\' is followed by a space ({what}), so it escapes the space, not "
                    "the newline: bash would end the command here and run the next line on its own. --yes "
                    "imports the lines as one command, as if the '\\' ended the line"
                )
                if self.accept:
                    self.end_word()
                    if rest:
                        self.out.comments.append((self.line, rest[1:].strip()))
                    self.i = j + 1
                    self.line += 1
                    return
        if nxt == "":
            self.start().append(Lit("\\", False))
            self.i += 1
            return
        self.start().append(Lit(nxt, True))
        self.i += 2

    def single_quoted(self) -> bool:
        j = self.text.find("'", self.i + 1)
        if j < 0:
            self.out.problems.append(f"line {self.line}: a single quote (') is never closed")
            return False
        self.start().append(Lit(self.text[self.i + 1 : j], True))
        self.line += self.text.count("\n", self.i, j)
        self.i = j + 1
        return True

    def double_quoted(self) -> bool:
        text = self.text
        parts = self.start()
        self.i += 1
        buf: list[str] = []

        def flush() -> None:
            if buf:
                parts.append(Lit("".join(buf), True))
                buf.clear()

        while self.i < self.n:
            ch = text[self.i]
            if ch == "\\" and self.i + 1 < self.n and text[self.i + 1] in '$`"\\\n':
                if text[self.i + 1] == "\n":
                    self.line += 1
                else:
                    buf.append(text[self.i + 1])
                self.i += 2
            elif ch == '"':
                flush()
                self.i += 1
                if not parts:
                    parts.append(Lit("", True))
                return True
            elif ch in "$`":
                flush()
                parts.append(self.dollar(quoted=True))
            else:
                if ch == "\n":
                    self.line += 1
                buf.append(ch)
                self.i += 1
        self.out.problems.append(f'line {self.line}: a double quote (") is never closed')
        return False

    def _matching(self, i: int, open_: str, close: str) -> int:
        """Index just past the ``close`` that matches the ``open_`` before ``i`` (quotes skipped)."""
        text, depth = self.text, 1
        while i < self.n and depth:
            ch = text[i]
            if ch == "\\":
                i += 2
                continue
            if ch == "'" and open_ != "`":
                k = text.find("'", i + 1)
                i = self.n if k < 0 else k + 1
                continue
            if ch == open_ and open_ != close:
                depth += 1
            elif ch == close:
                depth -= 1
            i += 1
        return i if depth == 0 else -1

    def dollar(self, *, quoted: bool) -> Part:
        text, i = self.text, self.i
        if text[i] == "`":
            end = self._matching(i + 1, "`", "`")
            return self._sub("command substitution", quoted, end)
        nxt = text[i + 1 : i + 2]
        if nxt == "'" and not quoted:  # $'…': bash's ANSI-C quoting (\n, \t, \x41 …), never guessed
            k = i + 2
            while k < self.n and text[k] != "'":
                k += 2 if text[k] == "\\" else 1
            return self._sub("ANSI-C quoted string", quoted, k + 1 if k < self.n else -1)
        if text.startswith("$((", i):  # past the second ')'; never closed stays -1 (0 would lex again)
            end = self._matching(i + 3, "(", ")")
            return self._sub("arithmetic", quoted, end + 1 if end >= 0 else -1)
        if nxt == "(":
            return self._sub("command substitution", quoted, self._matching(i + 2, "(", ")"))
        if nxt == "{":
            end = self._matching(i + 2, "{", "}")
            if end < 0:
                self.out.problems.append(f"line {self.line}: '${{' is never closed with '}}'")
                self.i = self.n
                return Lit(text[i:], quoted)
            return self._braced(i, end, quoted)
        m = _NAME_RE.match(text, i + 1)
        if m:
            self.i = m.end()
            return Param(m.group(0), "", None, quoted, text[i : m.end()])
        if nxt and nxt in _SPECIAL_PARAMS:
            self.i = i + 2
            return Param(nxt, "", None, quoted, text[i : i + 2])
        self.i = i + 1
        return Lit("$", quoted)

    def _sub(self, kind: str, quoted: bool, end: int) -> Part:
        start = self.i
        if end <= start:  # never closed (an end at or before the start would lex the same text again)
            self.out.problems.append(
                f"line {self.line}: the {kind} {self.text[start : start + 12]}… is never closed"
            )
            end = self.n
        self.line += self.text.count("\n", start, end)
        self.i = end
        return Sub(kind, quoted, self.text[start:end])

    def _braced(self, i: int, end: int, quoted: bool) -> Part:
        src = self.text[i:end]
        inner = src[2:-1]
        self.line += src.count("\n")
        self.i = end
        m = _NAME_RE.match(inner) or (re.match(r"[@*#?$!0-9-]", inner) if inner else None)
        if not m:
            return Sub("parameter operation", quoted, src)
        name, rest = m.group(0), inner[m.end() :]
        if not rest:
            return Param(name, "", None, quoted, src)
        op_m = re.match(r":[-=?+]|[-=?+]", rest)
        if not op_m:  # ${X#pat}, ${X/a/b}, ${X:1:2}, ${#X}, ${!X}: bash string operations
            return Sub("parameter operation", quoted, src)
        arg_text = rest[op_m.end() :]
        sub = _Lexer(arg_text, self.accept)
        arg = sub.word_parts(quoted)
        self.out.problems += [f"line {self.line}: in {src}: {p}" for p in sub.out.problems]
        return Param(name, op_m.group(0), tuple(arg), quoted, src)

    def word_parts(self, quoted: bool) -> list[Part]:
        """The whole text as the parts of one word (the argument of ``${X:-…}``): blanks are kept."""
        parts: list[Part] = []
        while self.i < self.n:
            c = self.text[self.i]
            if c == "\\" and self.i + 1 < self.n:
                parts.append(Lit(self.text[self.i + 1], True))
                self.i += 2
            elif c == "'" and not quoted:
                j = self.text.find("'", self.i + 1)
                j = self.n if j < 0 else j
                parts.append(Lit(self.text[self.i + 1 : j], True))
                self.i = j + 1
            elif c == '"':
                self.parts = None
                if not self.double_quoted():
                    break
                assert self.parts is not None
                parts += self.parts
                self.parts = None
            elif c in "$`":
                parts.append(self.dollar(quoted=quoted))
            else:
                parts.append(Lit(c, quoted))
                self.i += 1
        return parts

    def operator(self) -> None:
        text, i = self.text, self.i
        if text.startswith("&>", i):
            self.redirection()
            return
        for op in (";;", "&&", "||", "|&", ";", "&", "|"):
            if text.startswith(op, i):
                self.end_word()
                self.i += len(op)
                self.op(op, i)
                return

    def redirection(self) -> None:
        text, i = self.text, self.i
        if text[i] == "<" and self.parts is None and (m := PLACEHOLDER_RE.match(text, i)):
            self.start().append(Lit(m.group(0), False))
            self.i = m.end()
            return
        start = i
        fd = ""
        if self.parts is not None and all(isinstance(p, Lit) and not p.quoted for p in self.parts):
            fd = "".join(p.text for p in self.parts if isinstance(p, Lit))
            if fd.isdigit():
                start = self.word_start
                self.parts = None
            else:
                fd = ""
        self.end_word()
        m = _REDIR_RE.match(text, i)
        assert m is not None
        op = fd + m.group(0)
        self.i = m.end()
        line = self.line
        if op.endswith(("<<", "<<-")):
            self.out.problems.append(
                f"line {line}: a here-document ({op}) feeds text to a command; rigsmith imports one command "
                "line — import the text it feeds on its own"
            )
            self.i = self.n
            self.out.tokens.append(Redir(op, None, line, start, self.i))
            return
        while self.i < self.n and text[self.i] in _BLANKS:
            self.i += 1
        before = len(self.out.tokens)
        # the target: one word (`&1`, a file name)
        while self.i < self.n and text[self.i] not in _BLANKS + "\n;|&<>()":
            c = text[self.i]
            if c == "'":
                if not self.single_quoted():
                    break
            elif c == '"':
                if not self.double_quoted():
                    break
            elif c in "$`":
                self.start().append(self.dollar(quoted=False))
            else:
                self.start().append(Lit(c, False))
                self.i += 1
        if op.endswith("&") and text.startswith("-", self.i):
            self.start().append(Lit("-", False))
            self.i += 1
        target = None
        if self.parts is not None:
            target = Word(tuple(self.parts), self.word_start, self.i, line)
            self.parts = None
        del self.out.tokens[before:]
        self.out.tokens.append(Redir(op, target, line, start, self.i))
        self.in_command = True

    def paren(self, c: str) -> None:
        if self.case_depth:  # a case pattern's parentheses: the case itself is refused by name
            self.end_word()
            self.out.tokens.append(Op(c, self.line, self.i))
            self.i += 1
            return
        if self.parts is not None:
            so_far = "".join(p.text if isinstance(p, Lit) else p.src for p in self.parts)
            if c == "(" and re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*\+?=", so_far):
                what = f"an array assignment ({so_far}(…))"
                close = self._matching(self.i + 1, "(", ")")
                self.i = (self.n if close < 0 else close) - 1  # the array's words are part of the refusal
            else:
                what = f"an unquoted {c!r} inside the word {so_far + c!r}"
            self.out.problems.append(
                f"line {self.line}: {what} — bash stops with a syntax error here (or builds an array); quote "
                "the text if it belongs to a value, or remove it"
            )
        else:
            self.out.problems.append(
                f"line {self.line}: an unquoted {c!r} is shell syntax (a subshell, function or array), not "
                "part of one command"
            )
        self.end_word()
        self.i += 1


def lex(text: str, *, accept: bool = False) -> Lexed:
    """Tokens of ``text``; with ``accept`` the author's evident intent is taken where bash would break
    (the asks are still listed, so the caller records them)."""
    return _Lexer(text, accept).run()
