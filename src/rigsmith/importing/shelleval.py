# Over 500 lines: the evaluator's steps (expansion, assignments, exports, tests, commands, bash -c) read and
# write one state (the variables, the exports, the commands kept); split apart they would hand that state
# back and forth on every word. The tokens and the statements are their own modules (shelllex, shellparse).

"""A safe shell subset, evaluated and never executed: a pasted script → the one command it runs.

People paste scripts, not commands: ``MODEL=…`` then ``vllm serve $MODEL``, ``export CUDA_VISIBLE_DEVICES=…``,
``nohup vllm serve … > log 2>&1 &``, ``source venv/bin/activate && vllm serve …``, ``$ `` prompts,
``bash -c '…'``, ``if [ "${NVLINK:-0}" = 1 ]; then … fi``. This module reads such a text the way bash
would, for the small subset whose meaning is known without running anything:

- literal assignments and ``export`` earlier in the text; ``$VAR`` / ``${VAR}`` with ``:-`` ``-`` ``:=``
  ``=`` ``:?`` ``?`` ``:+`` ``+``, field splitting of unquoted values as bash does it;
- ``$HOME``, ``$PWD``, ``~``, ``$(…)`` and a variable passed into the env (``-e NAME=$NAME``) are left as
  written (the importer keeps them, as before); any other variable the text never sets becomes the
  placeholder ``<NAME>`` the user fills, never an empty string;
- ``cd``, ``source …/bin/activate``, ``conda activate``, ``set -e``, ``echo``, ``wait`` are noted and dropped;
  ``nohup``, a trailing ``&``, redirections and ``| tee`` around the serve command likewise;
- ``bash -c BODY`` / ``sh -c BODY`` runs BODY under the same rules;
- ``if``/``elif``/``else`` whose test compares values known at import takes bash's branch.

Anything else (loops, ``case``, arrays, arithmetic, a ``source`` of a file the text does not hold, a test
on a value only the running machine knows) is refused naming it. Every step beyond what bash itself does
on the text is a note; where bash would break on the text (a comment after ``\\``), the step is an *ask*:
taken only with consent (``--yes``). The result is the **interpreted text**: the command as bash would run
it, quoted, which the importer parses and which bash, run on it, splits into exactly the spec's argv.

Pure: nothing here starts a process, reads a file or looks at the environment.
"""

from __future__ import annotations

import re
import shlex
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import PurePosixPath

from rigsmith.importing.shelllex import Lit, Param, Part, Sub, Word, lex
from rigsmith.importing.shellparse import (
    If,
    Node,
    Simple,
    after_eq,
    compare,
    dq,
    keyword,
    lead,
    nodes_of,
    simples_of,
    strip_prompts,
)

#: Variables the importer keeps as written: the home and working directory at deploy time.
_KEPT_VARS = frozenset({"HOME", "PWD"})
_SHELLS = frozenset({"bash", "sh", "dash", "zsh"})
_LOOPS = frozenset({"for", "while", "until", "select", "case", "function"})
#: The word that ends each compound command the evaluator refuses (what follows it is skipped).
_CLOSERS = {"for": "done", "while": "done", "until": "done", "select": "done", "case": "esac"}
_ASSIGN_RE = re.compile(r"([A-Za-z_][A-Za-z0-9_]*)(\+?)=")
_PY_RE = re.compile(r"^python3?(\.\d+)?$")
_IFS = " \t\n"
#: Between two arguments of ``"$@"``: a field boundary no quoting removes.
_FIELD_BREAK = "\x00"


@dataclass(frozen=True)
class Unknown:
    """A variable whose value the text does not give (the reason names where it would come from)."""

    why: str


Value = str | Unknown


@dataclass
class Evaluated:
    """The interpreted text and what it took to get there."""

    text: str
    changed: bool = False
    notes: list[str] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)
    #: Steps beyond bash that need consent; when accepted they are also in ``notes``.
    asks: list[str] = field(default_factory=list)
    #: The placeholder tokens written for variables with no value (``<MODEL>``), which the user fills.
    placeholders: list[str] = field(default_factory=list)


# -- expansion -----------------------------------------------------------------------------------------


@dataclass
class _Expanded:
    """A word after expansion: its fields, or None when it holds something kept as written."""

    fields: list[str] | None
    changed: bool
    #: The word for the interpreted text, when ``changed`` and ``fields`` is None (double-quoted mix).
    mixed: str = ""
    placeholders: list[str] = field(default_factory=list)


class _Evaluator:
    def __init__(self, accept: bool) -> None:
        self.accept = accept
        self.vars: dict[str, Value] = {}
        self.exported: list[str] = []
        self.notes: list[str] = []
        self.problems: list[str] = []
        self.made: list[str] = []
        self.changed = False
        #: (line, text) of each command kept for the interpreted text.
        self.kept: list[tuple[int, str]] = []
        self.positional: list[str] | None = None
        #: The text being evaluated (prompts stripped): an untouched word is handed on as written there.
        self.source = ""
        #: Leave every variable the text never sets as written (a multi-node block: the importer maps
        #: ``$MASTER_IP`` and the like onto the cluster's nodes itself).
        self.keep_unknown = False
        self.launchers = 0

    def _src(self, word: Word) -> str:
        return self.source[word.start : word.end]

    # -- values ------------------------------------------------------------------------------------

    def _lookup(self, p: Param) -> Value | None:
        """The variable's value; None when the text never sets it."""
        if p.name.isdigit() and self.positional is not None:
            idx = int(p.name)
            return self.positional[idx] if idx < len(self.positional) else None
        return self.vars.get(p.name)

    def _param(self, p: Param, line: int, env_ctx: bool, out: list[tuple[str, bool]], ph: list[str]) -> bool:
        """Append the expansion of ``p`` to ``out`` as (char, splittable) pairs; False when it is kept as
        written (the caller then emits the word as it is)."""
        value = self._lookup(p)
        if p.name in ("@", "*") and self.positional is not None:
            args = self.positional[1:]
            if p.name == "@" and p.quoted:  # "$@": one field per argument
                for idx, arg in enumerate(args):
                    if idx:
                        out.append((_FIELD_BREAK, True))
                    out.extend((c, False) for c in arg)
            else:
                self._put(" ".join(args), p.quoted, out)
            return True
        if p.name in ("@", "*", "#", "?", "!", "$", "-"):
            self.problems.append(
                f"line {line}: {p.src} is a value only the running shell knows (the script's arguments or "
                "state); rigsmith evaluates nothing at run time — write the values out"
            )
            return True
        if isinstance(value, Unknown):
            self.problems.append(f"line {line}: {p.src} needs the value of {p.name}, which {value.why}")
            return True
        is_set = value is not None
        null = not value
        if p.op:
            colon = p.op.startswith(":")
            missing = (not is_set) or (colon and null)
            kind = p.op[-1]
            if kind in "-=" and missing:
                assert p.arg is not None
                default = self._arg(p.arg, line, ph)
                if default is None:
                    return False
                if not is_set:
                    self.notes.append(
                        f"line {line}: {p.name} is not set in the text, so {p.src} is its default "
                        f"{default!r} "
                        "(as bash would run it with an environment that does not set it either)"
                    )
                if kind == "=":
                    self.vars[p.name] = default
                self._put(default, p.quoted, out)
                return True
            if kind == "+":
                alt = "" if missing else self._arg(p.arg or (), line, ph)
                if alt is None:
                    return False
                self._put(alt, p.quoted, out)
                return True
            if kind == "?" and missing:
                message = self._arg(p.arg or (), line, ph) or "parameter null or not set"
                return self._placeholder(p, line, out, ph, f"the text requires it ({message})")
        if value is None:
            if p.name in _KEPT_VARS or env_ctx or self.keep_unknown:
                return False
            return self._placeholder(p, line, out, ph, "the text uses it but never sets it")
        self._put(value, p.quoted, out)
        return True

    def _placeholder(self, p: Param, line: int, out: list[tuple[str, bool]], ph: list[str], why: str) -> bool:
        token = f"<{p.name}>"
        ph.append(token)
        self.made.append(token)
        self.notes.append(
            f"line {line}: {p.src}: {p.name} has no value ({why}); it is the placeholder {token}, which you "
            "fill in before deploy"
        )
        out.extend((c, False) for c in token)
        return True

    def _put(self, value: str, quoted: bool, out: list[tuple[str, bool]]) -> None:
        out.extend((c, not quoted) for c in value)

    def _arg(self, parts: Sequence[Part], line: int, ph: list[str]) -> str | None:
        chars: list[tuple[str, bool]] = []
        for part in parts:
            if isinstance(part, Lit):
                chars.extend((c, False) for c in part.text)
            elif isinstance(part, Param):
                if not self._param(part, line, False, chars, ph):
                    return None
            else:
                return None
        return "".join(c for c, _ in chars)

    def expand(self, word: Word, *, env_ctx: bool = False, split: bool = True) -> _Expanded:
        """``word`` as bash expands it (no pathname expansion), or kept as written where it must be."""
        if word.plain is not None:
            return _Expanded([word.plain], False)
        chars: list[tuple[str, bool]] = []
        ph: list[str] = []
        kept = False
        any_param = False
        for part in word.parts:
            if isinstance(part, Lit):
                chars.extend((c, False) for c in part.text)
            elif isinstance(part, Param):
                before = len(self.problems)
                if self._param(part, word.line, env_ctx, chars, ph):
                    any_param = True
                    if len(self.problems) > before:
                        return _Expanded(None, False)
                else:
                    kept = True
                    chars.extend((c, False) for c in part.src)  # placeholder position, not used
            else:
                kept = True
        if not any_param:
            return _Expanded(None, False)  # nothing known to expand: the word as written
        self.changed = True
        if kept:
            return _Expanded(None, True, mixed=self._mixed(word, ph), placeholders=ph)
        if not split:
            return _Expanded(["".join(c for c, _ in chars)], True, placeholders=ph)
        fields: list[str] = []
        cur: list[str] = []
        had = False  # the current field has a character or a quoted (possibly empty) part
        for c, splittable in chars:
            if c == _FIELD_BREAK and splittable:
                fields.append("".join(cur))
                cur, had = [], False
            elif splittable and c in _IFS:
                if cur or had:
                    fields.append("".join(cur))
                cur, had = [], False
            else:
                cur.append(c)
                had = True
        if cur or had:
            fields.append("".join(cur))
        if not fields and any(isinstance(p, Lit | Param) and p.quoted for p in word.parts):
            fields = [""]
        return _Expanded(fields, True, placeholders=ph)

    def _mixed(self, word: Word, ph: list[str]) -> str:
        """The word for the interpreted text when part of it stays as written: double-quoted, the known
        values escaped, the kept parts (``$HOME``, ``$(…)``) as they were."""
        out: list[str] = []
        for part in word.parts:
            if isinstance(part, Lit):
                out.append(dq(part.text))
            elif isinstance(part, Param):
                chars: list[tuple[str, bool]] = []
                if self._param(part, word.line, True, chars, ph):
                    out.append(dq("".join(c for c, _ in chars)))
                else:
                    out.append(part.src)
            else:
                out.append(part.src)
        return '"' + "".join(out) + '"'

    # -- statements --------------------------------------------------------------------------------

    def run(self, nodes: Sequence[Node]) -> None:
        closing: list[str] = []  # inside a loop or case (refused once): skip to its end
        for node in nodes:
            kw = keyword(node) if isinstance(node, Simple) else None
            if closing:
                if kw in _CLOSERS.values():
                    closing.pop() if kw == closing[-1] else None
                elif kw in _CLOSERS:
                    closing.append(_CLOSERS[kw])
                continue
            if isinstance(node, If):
                self._if(node)
            else:
                self._simple(node)
                if kw in _CLOSERS:
                    closing.append(_CLOSERS[kw])

    def _if(self, node: If) -> None:
        self.changed = True
        if _is_guard(node):
            # `if <port busy>; then echo …; exit 1; fi`: a check that stops the script on the machine; what
            # runs when it passes is the rest of the text.
            self.notes.append(
                f"line {node.line}: a guard (if … then echo/exit … fi) that stops the script when its test "
                "holds on the machine; not imported — the rest of the text is what runs when it passes"
            )
            return
        for idx, (test, body) in enumerate(node.branches):
            if test is None:
                self.notes.append(
                    f"line {node.line}: if … else: no test is true, bash takes the 'else' branch"
                )
                self.run(body)
                return
            verdict = self._test(test)
            if verdict is None:
                return
            if verdict:
                which = "the 'then' branch" if idx == 0 else f"the 'elif' branch of line {test.line}"
                shown = self.source[test.words[0].start : test.words[-1].end]
                self.notes.append(
                    f"line {test.line}: the test '{shown}' is true at import; bash takes {which}"
                )
                self.run(body)
                return
        self.notes.append(
            f"line {node.line}: no test of the 'if' is true and there is no 'else': nothing runs"
        )

    def _test(self, test: Simple) -> bool | None:
        words = test.words
        texts = [w.plain if w.unquoted else None for w in words]
        if texts and (texts[0], texts[-1]) in (("[", "]"), ("[[", "]]")):
            inner = words[1:-1]
        elif texts and texts[0] == "test":
            inner = words[1:]
        else:
            shown = " ".join(w.plain or "…" for w in words)
            self.problems.append(
                f"line {test.line}: the test '{shown}' runs a command; rigsmith only decides tests that "
                "compare values the text sets ([ A = B ], [ -n A ], [ -z A ])"
            )
            return None
        values: list[str] = []
        for w in inner:
            e = self.expand(w, split=False)
            if e.fields is None or e.placeholders:
                name = next((p.name for p in w.parts if isinstance(p, Param)), w.plain or "?")
                self.problems.append(
                    f"line {test.line}: the 'if' test depends on {name}, which the text does not set; bash's "
                    "branch is known only on the running machine — set it in the text or keep the branch you "
                    "mean"
                )
                return None
            values.extend(e.fields or [""])
        negate = bool(values) and values[0] == "!" and inner[0].unquoted
        if negate:
            values = values[1:]
        result = compare(values)
        if result is None:
            self.problems.append(
                f"line {test.line}: the test [ {' '.join(values)} ] is not a comparison rigsmith decides "
                "(=, ==, !=, -n, -z, -eq/-ne/-lt/-le/-gt/-ge of numbers)"
            )
            return None
        return result != negate

    def _simple(self, s: Simple) -> None:
        words = list(s.words)
        kw = keyword(s)
        if kw in _LOOPS:
            self.problems.append(
                f"line {s.line}: shell control flow ({kw!r}): rigsmith evaluates straight-line scripts (and "
                "if/else on known values) only; import the vllm serve (or docker run) line on its own"
            )
            return
        if kw in ("then", "else", "elif", "fi", "do", "done", "esac", "{", "}"):
            self.problems.append(f"line {s.line}: {kw!r} without the 'if' (or loop) it belongs to")
            return
        if s.sep == "||":
            self.problems.append(
                f"line {s.line}: '||' runs the next command only when this one fails; rigsmith imports the "
                "command that runs — remove the '||' branch"
            )
        # leading assignments
        assigns: list[tuple[str, Word]] = []
        while words:
            m = _ASSIGN_RE.match(words[0].plain or lead(words[0]))
            if (
                not m
                or not words[0].parts
                or not isinstance(words[0].parts[0], Lit)
                or words[0].parts[0].quoted
            ):
                break
            assigns.append((m.group(1), words.pop(0)))
        if not words:
            self._assign_only(assigns, s)
            return
        head = words[0].plain if words[0].unquoted else None
        if head == "export":
            self._export(words[1:], s)
            return
        if head in ("cd", "pushd"):
            target = self.expand(words[1], split=False) if len(words) > 1 else None
            where = (target.fields or [words[1].plain or "?"])[0] if target else "~"
            self.changed = True
            self.notes.append(
                f"line {s.line}: 'cd {where}': the recipe runs from {where}; a relative path in the command "
                "is relative to it (rigsmith's targets run the engine in their own working directory)"
            )
            return
        if head in ("source", "."):
            self._source(words, s)
            return
        if (
            head in ("conda", "mamba", "micromamba")
            and len(words) > 1
            and words[1].plain in ("activate", "deactivate")
        ):
            self.changed = True
            self.notes.append(
                f"line {s.line}: '{' '.join(w.plain or '…' for w in words)}' selects a Python environment "
                "on the host; in a container the image's environment runs vLLM (for an LXC venv, set "
                "engine.venv)"
            )
            return
        if head == "set" and all(
            (w.plain or "").startswith(("-", "+")) or w.plain in ("pipefail", "errexit", "nounset", "xtrace")
            for w in words[1:]
        ):
            self.changed = True
            self.notes.append(
                f"line {s.line}: '{' '.join(w.plain or '' for w in words)}' (shell options) dropped"
            )
            return
        if head in ("echo", "printf", "wait", "sleep", "true", ":", "clear"):
            self.changed = True
            self.notes.append(f"line {s.line}: '{head}' changes nothing the engine runs; dropped")
            return
        self._command(assigns, words, s)

    def _assign_only(self, assigns: list[tuple[str, Word]], s: Simple) -> None:
        for name, word in assigns:
            value = self._assigned(name, word)
            self.vars[name] = value
        if assigns:
            self.changed = True
            names = ", ".join(n for n, _ in assigns)
            self.notes.append(
                f"line {s.line}: shell variable(s) {names} set for the script (used where the text expands "
                "them; not passed to vLLM unless exported)"
            )

    def _assigned(self, name: str, word: Word) -> Value:
        """The value an assignment word gives ``name`` (Unknown when it runs something)."""
        rest = after_eq(word)
        subs = [p for p in rest if isinstance(p, Sub)]
        if subs:
            return Unknown(
                f"is set on line {word.line} by {subs[0].kind} {subs[0].src}, which rigsmith never runs"
            )
        probe = Word(tuple(rest), word.start, word.end, word.line)
        e = self.expand(probe, split=False, env_ctx=True)
        if e.fields is None and e.changed is False and probe.plain is None:
            kept = "".join(p.src if not isinstance(p, Lit) else p.text for p in rest)
            return kept  # `$HOME/x`: kept as written, as the importer keeps it
        if e.fields is None:
            return Unknown(f"is set on line {word.line} from a value only the running machine knows")
        return e.fields[0] if e.fields else ""

    def _export(self, words: list[Word], s: Simple) -> None:
        out = []
        for w in words:
            m = _ASSIGN_RE.match(w.plain or lead(w))
            if m:
                value = self._assigned(m.group(1), w)
                self.vars[m.group(1)] = value
                out.append(self._assignment_text(m.group(1), w))
                self.exported.append(m.group(1))
            elif w.plain is not None and re.fullmatch(r"[A-Za-z_]\w*", w.plain):
                known = self.vars.get(w.plain)
                if isinstance(known, str):
                    self.changed = True
                    out.append(f"{w.plain}={shlex.quote(known)}")
                    self.exported.append(w.plain)
                else:
                    out.append(w.plain)  # the importer says what is missing
            else:
                out += self._emit(w, env_ctx=True)
        self.kept.append((s.line, "export " + " ".join(out)))

    def _assignment_text(self, name: str, word: Word) -> str:
        rest = after_eq(word)
        probe = Word(tuple(rest), word.start, word.end, word.line)
        e = self.expand(probe, split=False, env_ctx=True)
        if not e.changed:
            return self._src(word)
        if e.fields is not None:
            return f"{name}={shlex.quote(e.fields[0] if e.fields else '')}"
        return f"{name}={e.mixed}"

    def _source(self, words: list[Word], s: Simple) -> None:
        target = words[1].plain if len(words) > 1 else None
        self.changed = True
        if target is not None and (
            PurePosixPath(target).parts[-2:] == ("bin", "activate")
            or PurePosixPath(target).parts[-3:] == ("etc", "profile.d", "conda.sh")
        ):
            self.notes.append(
                f"line {s.line}: 'source {target}' activates a Python venv on the host; in a container the "
                "image's environment runs vLLM (for an LXC venv, set engine.venv to that venv)"
            )
            return
        self.problems.append(
            f"line {s.line}: '{words[0].plain} {target or '…'}' reads a file the text does not contain; "
            "rigsmith cannot see what it sets — paste what it sets into the text, or remove the line"
        )

    def _command(self, assigns: list[tuple[str, Word]], words: list[Word], s: Simple) -> None:
        """A command that runs: the serve command (wrappers, redirections, ``&`` and ``| tee`` dropped) or a
        ``bash -c`` body; any other is kept for the importer to judge."""
        texts = [w.plain for w in words]
        if texts[0] == "nohup":
            self.changed = True
            self.notes.append(f"line {s.line}: 'nohup' dropped (rigsmith's targets keep the server running)")
            words, texts = words[1:], texts[1:]
            if not words:
                return
        if texts[0] == "env" and len(words) > 1 and _ASSIGN_RE.match(words[1].plain or lead(words[1])):
            self.changed = True
            self.notes.append(f"line {s.line}: 'env NAME=value …' read as NAME=value before the command")
            words = words[1:]
            while words and (m := _ASSIGN_RE.match(words[0].plain or lead(words[0]))):
                assigns.append((m.group(1), words.pop(0)))
            texts = [w.plain for w in words]
            if not words:
                return
        exe = PurePosixPath(texts[0]).name if texts[0] else ""
        if exe in _SHELLS and len(words) > 2 and texts[1] == "-c":
            self._shell_c(assigns, words, s)
            return
        launcher = (
            exe in ("vllm", "docker", "podman") or bool(_PY_RE.match(exe)) or texts[0] in ("sudo", "exec")
        )
        if launcher:
            self.launchers += 1
            self._drop_around(s)
        elif s.redirs or s.pipe is not None or s.sep == "&":
            self.problems.append(
                f"line {s.line}: {texts[0] or 'a command'!r} with redirections, a pipe or '&' is not a vLLM "
                "launch command; remove it"
            )
            return
        parts = [self._assignment_text(n, w) for n, w in assigns]
        container = exe in ("docker", "podman")
        for w in words:
            sub = next((p for p in w.parts if isinstance(p, Sub)), None)
            always = ("arithmetic", "ANSI-C quoted string")  # no reading keeps these as written
            if sub is not None and (sub.kind in always or (launcher and not container)):
                self.problems.append(
                    f"line {s.line}: {sub.src} in the command is {sub.kind}, which only the running shell "
                    "computes (rigsmith never runs it); write the value out"
                )
        for idx, w in enumerate(words):
            # A variable the text never sets stays as written where the importer reads it from the host at
            # run time (`-e NAME=$NAME`, NAME=$X) and in a container command (its -v, -e and image).
            env_ctx = (
                container
                or bool(_ASSIGN_RE.match(lead(w).removeprefix("--env=")))
                or (idx > 0 and texts[idx - 1] in ("-e", "--env"))
            )
            parts += self._emit(w, env_ctx=env_ctx)
        self.kept.append((s.line, " ".join(parts)))

    def _emit(self, w: Word, *, env_ctx: bool) -> list[str]:
        """``w`` for the interpreted text: as written when nothing in it changed, else its fields quoted."""
        e = self.expand(w, env_ctx=env_ctx)
        if not e.changed:
            return [self._src(w)]
        if e.fields is not None:
            return [shlex.quote(f) for f in e.fields]
        return [e.mixed]

    def _drop_around(self, s: Simple) -> None:
        """Redirections, ``&`` and a ``| tee`` around the serve command: said and dropped."""
        if s.redirs:
            self.changed = True
            shown = " ".join(self.source[r.start : r.end] for r in s.redirs)
            self.notes.append(
                f"line {s.line}: redirection(s) '{shown}' dropped: the targets keep the engine's output in "
                "their own log (podman logs, journalctl)"
            )
        if s.sep == "&":
            self.changed = True
            self.notes.append(f"line {s.line}: the trailing '&' (run in the background) dropped")
        if s.pipe is not None:
            tail = s.pipe
            name = PurePosixPath(tail.words[0].plain or "").name if tail.words else ""
            if name == "tee" and tail.pipe is None:
                self.changed = True
                self.notes.append(
                    f"line {s.line}: '{s.pipe_op} tee …' dropped: the targets keep the engine's output in "
                    "their own log"
                )
                if tail.sep == "&":
                    self.notes.append(f"line {s.line}: the trailing '&' (run in the background) dropped")
            else:
                self.problems.append(
                    f"line {s.line}: the serve command's output is piped ('{s.pipe_op}') into "
                    f"{name or 'another command'!r}; rigsmith imports one command — remove the pipe"
                )

    def _shell_c(self, assigns: list[tuple[str, Word]], words: list[Word], s: Simple) -> None:
        body = self.expand(words[2], split=False)
        text = body.fields[0] if body.fields else words[2].plain
        if text is None:
            self.problems.append(
                f"line {s.line}: the script of '{words[0].plain} -c' holds shell syntax rigsmith does not "
                "evaluate"
            )
            return
        self.changed = True
        self.notes.append(
            f"line {s.line}: '{words[0].plain} -c SCRIPT': the script is read with the same rules as the "
            "text (the extra shell is dropped)"
        )
        args = [self.expand(w).fields for w in words[3:]]
        inner = _Evaluator(self.accept)
        inner.vars = {n: self.vars[n] for n in self.exported if n in self.vars}
        for name, word in assigns:
            inner.vars[name] = self._assigned(name, word)
        inner.positional = [f for a in args for f in (a or [])] or None
        sub = evaluate(text, accept=self.accept, _inner=inner)
        offset = s.line - 1
        self.notes += [f"in the -c script: {n}" for n in sub.notes]
        self.problems += [f"in the -c script of line {s.line}: {p}" for p in sub.problems]
        self.kept += [(ln + offset, t) for ln, t in inner.kept]
        self.made += inner.made
        exported_inner = [n for n in inner.exported if n not in self.exported]
        self.exported += exported_inner


#: Commands a guard's body may hold: it only reports and stops.
_GUARD_WORDS = frozenset({"echo", "printf", "exit", "return", ":"})


def _is_guard(node: If) -> bool:
    """An ``if`` with no ``else`` whose body only reports and exits."""
    (_test, body), *rest = node.branches
    return (
        not rest
        and bool(body)
        and all(isinstance(n, Simple) and keyword(n) in _GUARD_WORDS for n in body)
        and any(isinstance(n, Simple) and keyword(n) in ("exit", "return") for n in body)
    )


def evaluate(text: str, *, accept: bool = False, _inner: _Evaluator | None = None) -> Evaluated:
    """The one command ``text`` runs, as the interpreted text (see the module doc); ``text`` itself when
    it needs no interpretation (nothing changed)."""
    stripped, prompt_notes = strip_prompts(text)
    lexed = lex(stripped, accept=accept)
    ev = _inner or _Evaluator(accept)
    problems = list(lexed.problems)
    simples = simples_of(lexed.tokens)
    nodes, _ = nodes_of(simples, 0, frozenset(), problems)
    ev.source = stripped
    ev.run(nodes)
    if ev.launchers > 1 and _inner is None:
        # One command per node: the importer reads their shared variables as the cluster's own.
        ev = _Evaluator(accept)
        ev.source, ev.keep_unknown = stripped, True
        ev.run(nodes)
    result = Evaluated(text=text, problems=problems + ev.problems, asks=list(lexed.asks))
    changed = ev.changed or bool(prompt_notes) or (bool(lexed.asks) and accept)
    if not changed and not lexed.asks:
        return result
    result.changed = True
    result.notes = [*prompt_notes, *lexed.notes, *ev.notes]
    result.placeholders = list(dict.fromkeys(ev.made))
    if accept:
        result.notes += [f"accepted with --yes: {a}" for a in lexed.asks]
    result.notes += [f"comment (line {ln}): {c}" for ln, c in lexed.comments if c]
    lines: list[str] = []
    for line, cmd in ev.kept:
        while len(lines) < line - 1:
            lines.append("")
        lines.append(cmd)
    result.text = "\n".join(lines) + ("\n" if lines else "")
    return result
