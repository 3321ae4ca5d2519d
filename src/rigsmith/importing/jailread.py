"""What bash did with a text in the import jail (issue 35), read from its answers for
:mod:`rigsmith.importing.bashjail`: the stubs' records (launches, wrappers, ``cd``, ``source``, the commands
outside the launchers, processes), bash's trace (``PS4`` with a marker and ``$LINENO``) and its errors.
From them: the launches handed on, the placeholders, the decisions on unknown values refused, the notes,
and what a new run needs (:class:`_State`). One run is :mod:`rigsmith.importing.jailrun`'s.
"""

from __future__ import annotations

import os
import re
import shlex
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import PurePosixPath

from rigsmith.digits import ascii_digits
from rigsmith.errors import shown
from rigsmith.importing.jailrun import _BASH, _FILES, CWD, MAX_OUTPUT, RUN_SECONDS, _Run
from rigsmith.importing.tracewords import trace_words
from rigsmith.importing.unknown import placeholder
from rigsmith.secretenv import is_secret_name

#: Processes (subshells, background jobs, command substitutions) a text may start before it is refused.
MAX_PROCESSES = 200
#: Stands for a NUL of the text while bash runs it (a private-use character).
_NUL = "\ue000"
_TOKEN_RE = re.compile(r"@@rigsmith-output-\d+@@")
#: A name assigned a command's output whole (``GPU_COUNT=$(… | awk …)``), as bash traces it.
_OUTPUT_SET_RE = re.compile(
    r"^(?:(?:export|local|declare|readonly|typeset) )?([A-Za-z_][A-Za-z0-9_]*)=(@@rigsmith-output-\d+@@)$"
)
#: A name read only through an empty default (``${1:-}``, ``${MODEL-}``, ``${X:-""}``): bash reports no
#: unbound variable for it, and the empty word would stand where the user fills a value.
_EMPTY_DEFAULT_RE = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*|[1-9][0-9]?):?-(?:\"\"|'')?\}")
_UNBOUND_RE = re.compile(r"^(\$?)([A-Za-z_][A-Za-z0-9_]*(?:\[[^]\s]*\])?|\d+): unbound variable$")
_REQUIRED_RE = re.compile(r"^([A-Za-z_][A-Za-z0-9_]*): ")
_MISSING_RE = re.compile(r"^(\S*/\S*): (?:No such file or directory|Read-only file system)$")
#: What bash traces before it decides: a test, a loop over words, arithmetic.
_DECIDING = ("'[' ", "[ ", "[[ ", "test ", "(( ", "for ", "select ", "let ")


@dataclass(frozen=True)
class Call:
    """One launcher run: its argv (``argv[0]`` the name or path it was called by), env and line."""

    line: int
    argv: tuple[str, ...]
    env: tuple[tuple[str, str], ...]


@dataclass
class Answer:
    """What bash did with the text."""

    calls: list[Call] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)
    #: Placeholder tokens that reach a launcher (``<MODEL>``), for the user to fill.
    placeholders: list[str] = field(default_factory=list)
    #: Each variable made a placeholder that reaches a launcher, and the line bash found it unbound on.
    unknown: dict[str, int] = field(default_factory=dict)
    #: Commands outside the launchers that bash ran (line, argv).
    outside: list[tuple[int, list[str]]] = field(default_factory=list)
    #: (line, command, value) of each ``case`` bash decided on.
    decided: list[tuple[int, str, str]] = field(default_factory=list)
    #: Each blank the text leaves to fill (``NAME=""``, :mod:`rigsmith.importing.blanks`): the line of its
    #: empty assignment and the flag bash left without a value.
    blanks: dict[str, tuple[int, str]] = field(default_factory=dict)


#: bash builtins whose own errors read ``NAME: message`` (never a variable's ``${NAME:?message}``).
_BUILTIN_WORDS = (
    "alias bg bind break builtin caller cd command compgen complete continue declare dirs disown echo "
    "enable eval exec exit export false fc fg getopts hash help history jobs kill let local logout "
    "mapfile popd printf pushd pwd read readarray readonly return set shift shopt source suspend test "
    "times trap true type typeset ulimit umask unalias unset wait"
)
_BUILTINS = frozenset(_BUILTIN_WORDS.split())
#: Names bash or the jail sets: never placeholders.
_RESERVED_WORDS = (
    "HOME PWD OLDPWD PATH IFS BASH_ENV BASHPID BASH_SOURCE BASH_REMATCH LINENO RANDOM SECONDS PPID UID EUID "
    "HOSTNAME OSTYPE SHELL SHLVL PS4 OPTIND OPTARG"
)
_RESERVED = frozenset(_RESERVED_WORDS.split())


@dataclass
class _State:
    """What the runs so far taught: placeholders (by the line bash first found each unbound), the
    positional parameters, and the paths where the text runs a command by path."""

    gates: dict[str, int] = field(default_factory=dict)
    positional: int = 0
    binds: list[str] = field(default_factory=list)
    #: Directories the text writes a file into (``> logs/server.log``): made in the jail, each a small tmpfs.
    dirs: list[str] = field(default_factory=list)
    #: Names read only through an empty default: placeholders from the text's first command on.
    early: set[str] = field(default_factory=set)
    #: Blanks the text leaves to fill (``MODEL_PATH=""``): placeholders once the text has made them empty.
    blanks: list[str] = field(default_factory=list)

    def gate_list(self) -> list[str]:
        gates = [f"{0 if name in self.early else line}:{name}" for name, line in self.gates.items()]
        return gates + [f"b:{name}" for name in self.blanks]

    def empty_defaults(self, text: str) -> None:
        """``${1:-}`` and ``${MODEL:-}`` (of a name the text never sets, which the jail's run tells): an empty
        default stands where the user fills a value, so it is a placeholder as ``$1`` and ``$MODEL`` are."""
        for m in _EMPTY_DEFAULT_RE.finditer(text):
            name, line = m.group(1), text.count("\n", 0, m.start()) + 1
            if ascii_digits(name):
                self.positional = max(self.positional, int(name))
            elif name not in self.gates and name not in _RESERVED:
                self.gates[name] = line
                self.early.add(name)

    def mounts(self) -> list[str]:
        """bubblewrap's arguments for the directories made and the stubs bound at the text's paths."""
        out: list[str] = []
        for path in sorted(self.dirs, key=lambda p: p.count("/")):  # a directory before those inside it
            out += ["--size", str(1 << 20), "--tmpfs", path]
        for path in self.binds:
            out += ["--ro-bind", str(_FILES / "stub.bash"), path]
        return out

    def learn(self, errors: Sequence[tuple[int, str]], trace: Sequence[tuple[int, str]]) -> bool:
        """Whether ``errors`` teach something that a new run needs (bash stops at an unbound variable; a
        command run by a path the jail does not hold, as bash's trace shows it, gets the stub there; a file
        written into a directory the jail does not hold, a log beside the script, gets the directory)."""
        for line, message in errors:
            if m := _UNBOUND_RE.match(message):
                return self._unknown(m.group(2), line)
            if (m := _REQUIRED_RE.match(message)) and m.group(1) not in _BUILTINS:
                return self._unknown(m.group(1), line)  # ${NAME:?message}: the text requires it
            ran = {cmd.split(" ", 1)[0] for at, cmd in trace if at == line}
            if (m := _MISSING_RE.match(message)) and len(self.binds) + len(self.dirs) < 16:
                path = str(PurePosixPath(CWD, m.group(1)))
                norm = os.path.normpath(path)
                if (
                    norm != path.rstrip("/")
                    or norm.startswith(("/proc", "/dev", "/rs", _BASH))
                    or norm in ("/", CWD)
                ):
                    continue
                if _ran(m.group(1), ran):
                    if norm not in self.binds:
                        self.binds.append(norm)
                        return True
                elif (parent := str(PurePosixPath(norm).parent)) not in (*self.dirs, "/", CWD):
                    self.dirs.append(parent)
                    return True
        return False

    def _unknown(self, name: str, line: int) -> bool:
        if ascii_digits(name):
            if int(name) <= self.positional or int(name) > 99:
                return False
            self.positional = int(name)
            return True
        if name in self.gates:
            return False
        self.gates[name] = line
        return True

    def names(self) -> set[str]:
        return {*self.gates, *self.blanks, *(str(i) for i in range(1, self.positional + 1))}


def _ran(path: str, first_words: set[str]) -> bool:
    """Whether bash's trace shows ``path`` run as a command (not a file a redirection names)."""
    return path in first_words or shlex.quote(path) in first_words


def _local(value: str) -> str:
    """A value with the jail's working directory written as ``.`` (the directory the recipe runs in), and a
    NUL of the text back in place."""
    return re.sub(re.escape(CWD) + r"(?=/|:|$)", ".", value).replace(_NUL, "\0")


def _exe(path: str) -> str:
    return PurePosixPath(path).name if path.startswith("/rs/bin/") else _local(path)


def _limits_hit(got: _Run) -> list[str]:
    """Refusals for a run that did not end by itself, or that bash stopped with an error."""
    out = []
    if got.status is None and not got.overflow:  # an overflow ends the run early
        out.append(
            f"bash did not finish the text within {RUN_SECONDS:g} seconds (a loop that never ends, a command "
            "waited on forever, or a fork bomb); rigsmith imports what a script launches, not what it does "
            "at length — keep the launch command"
        )
    if got.overflow:
        out.append(f"the text made bash write over {MAX_OUTPUT >> 20} MiB of trace; not a recipe")
    for line, message in got.errors[:8]:
        where = f"line {line}: " if line else ""
        if "fork: " in message:
            message = f"{message} (the jail allows 32 processes at once)"
        elif "xmalloc" in message or "cannot allocate" in message:
            message = f"{message} (the jail allows 128 MiB of memory a process)"
        out.append(f"{where}bash stops with {shown(message)}")
    return out


_VENV = (("bin", "activate"), ("etc", "profile.d", "conda.sh"))
#: A shell's own startup files (``source ~/.bashrc`` before ``conda activate``): the host's interactive setup.
_STARTUP = frozenset(
    {".bashrc", ".bash_profile", ".profile", ".zshrc", ".zprofile", ".zshenv", "bash.bashrc"}
)


def _sourced(line: int, rest: Sequence[str], out: Answer) -> None:
    """``source FILE`` of a file the text does not hold: a venv's activation or a shell's startup file is a
    note, else refused."""
    said = shown(" ".join(rest[:2]))
    path = rest[1] if len(rest) > 1 else ""
    parts = PurePosixPath(path).parts
    if any(parts[-len(v) :] == v for v in _VENV):
        out.notes.append(
            f"line {line}: '{said}' activates a Python environment on the host; in a container the image's "
            "environment runs vLLM (for an LXC venv, set engine.venv)"
        )
    elif PurePosixPath(path).name in _STARTUP or path == "/etc/profile":
        out.notes.append(
            f"line {line}: '{said}' reads the shell's own startup file on the host (its PATH, conda's "
            "setup); rigsmith's targets start vLLM without it — a variable vLLM needs from it goes into env"
        )
    else:
        out.problems.append(
            f"line {line}: '{said}' reads a file the text does not contain; rigsmith cannot see what it "
            "sets — paste what it sets into the text, or remove the line"
        )


_LAUNCHER_RE = re.compile(r"(vllm|docker|podman|ray|python([23](\.[0-9].*)?)?|run_cluster\.sh)")
#: A word the stub records as exported: a name bash can export, not one of those the stub leaves out.
_ENV_RE = re.compile(r"(?!(?:PATH|PWD|OLDPWD|SHLVL|_|BASH_ENV|__RS_\w*)=)[A-Za-z_][A-Za-z0-9_]*=.*", re.S)


def _launched(rest: Sequence[str]) -> bool:
    """Whether a launch record has the shape the stub writes (the text can write to the record descriptor
    too, it is in its own shell): the argv's length, a launcher's name (or ``bash run_cluster.sh``) and
    NAME=value words that bash could export."""
    if not rest or not ascii_digits(rest[0]) or not 1 <= int(rest[0]) < len(rest):
        return False
    n = int(rest[0])
    argv, env = rest[1 : 1 + n], rest[1 + n :]
    name = PurePosixPath(argv[0]).name
    cluster = name in ("bash", "sh", "dash", "zsh") and len(argv) > 1 and argv[1].endswith("run_cluster.sh")
    return (cluster or _LAUNCHER_RE.fullmatch(name) is not None) and all(_ENV_RE.fullmatch(e) for e in env)


def _read_records(got: _Run, out: Answer) -> list[tuple[str, int, list[str]]]:
    """Calls, notes and problems from the stubs' records; the outside commands (token, line, argv) and the
    values a ``case`` decided on are returned/recorded for the checks that follow."""
    outside: list[tuple[str, int, list[str]]] = []
    processes = 0
    for kind, line_text, *rest in got.records:
        line = int(line_text) if ascii_digits(line_text) else 0
        if kind == "L" and not _launched(rest):
            out.problems.append(
                f"line {line}: rigsmith's record of a launch holds what no launcher records (the text writes "
                "to the jail's record descriptor itself); not a recipe"
            )
        elif kind == "L":
            n = int(rest[0])
            argv = [_exe(rest[1]), *(_local(a) for a in rest[2 : 1 + n])]
            env = tuple((k, _local(v)) for k, _, v in (e.partition("=") for e in rest[1 + n :]))
            out.calls.append(Call(line, tuple(argv), env))
        elif kind == "W" and rest:
            out.notes.append(
                f"line {line}: '{shown(rest[0])}' dropped (it runs the command it wraps; rigsmith's "
                "targets run the engine themselves)"
            )
        elif kind == "C":
            where = shown(rest[1]) if len(rest) > 1 else "~"
            out.notes.append(
                f"line {line}: '{shown(' '.join(rest))}': the recipe runs from {where}; a relative path "
                "in the command is relative to it (rigsmith's targets run the engine in their own directory)"
            )
        elif kind == "S":
            _sourced(line, rest, out)
        elif kind == "O" and len(rest) > 1:
            outside.append((rest[0], line, [_exe(rest[1]), *(_local(a) for a in rest[2:])]))
        elif kind == "D" and len(rest) > 1:
            out.decided.append((line, rest[1], rest[0]))
        elif kind == "P":
            processes += 1
    if processes > MAX_PROCESSES:
        out.problems.append(
            f"the text starts {processes} processes (a fork bomb?); a recipe starts a few — rigsmith imports "
            "what a script launches, so keep the launch command"
        )
    return outside


def _answer(got: _Run, state: _State) -> Answer:
    out = Answer(problems=_limits_hit(got))
    outside = _read_records(got, out)
    marks = [placeholder(n) for n in state.names()]
    said = {token: f"the output of {named(argv)} (line {line})" for token, line, argv in outside}
    short = {token: f"<output of {shown(PurePosixPath(argv[0]).name)}>" for token, _, argv in outside}
    traced = _trace(got.trace)
    made = _outputs_named(out, outside, traced)

    def untoken(text: str) -> str:
        return _TOKEN_RE.sub(lambda m: short.get(m.group(0), "<output>"), text)

    def unknown_in(value: str) -> list[str]:
        return [
            *(f"the placeholder {m}" for m in marks if m in value),
            *(said.get(t, t) for t in _TOKEN_RE.findall(value)),
        ]

    launched = "\0".join("\0".join([*c.argv, *(v for _, v in c.env)]) for c in out.calls)
    _outside(out, outside, made, launched)
    out.notes += [
        f"line {line}: 'exec' dropped (the script replaces itself with the command; rigsmith's targets run "
        "the engine themselves)"
        for line, cmd in traced
        if cmd.startswith("exec ") and any(c.line == line for c in out.calls)
    ]
    decided = [(line, cmd, _but_emptiness(cmd, marks)) for line, cmd in traced if cmd.startswith(_DECIDING)]
    for line, cmd, value in decided:
        if value != cmd and not unknown_in(value):
            out.notes.append(
                f"line {line}: {shown(cmd[:200])} tests whether a placeholder is empty; filled, it is not, "
                "and the text goes on as imported"
            )
    for line, cmd, value in [*out.decided, *decided]:
        if found := unknown_in(value):
            out.problems.append(
                f"line {line}: bash decides on {', '.join(dict.fromkeys(found))} "
                f"({shown(untoken(cmd)[:200])}), a value the text does not give; write the value out (or "
                "remove the test)"
            )
    hidden = _secret_values(traced)
    out.problems = [hidden(untoken(p)) for p in dict.fromkeys(out.problems)]
    out.notes = [hidden(untoken(n)) for n in out.notes]
    # what is handed on holds no token of rigsmith's own: a refusal that quotes the command says
    # '<output of awk>'
    out.calls = [
        Call(c.line, tuple(untoken(a) for a in c.argv), tuple((k, untoken(v)) for k, v in c.env))
        for c in out.calls
    ]
    marks += [placeholder(name) for name in made.values()]
    out.placeholders = [m for m in sorted(set(marks)) if m in launched]
    out.unknown = {name: line for name, line in state.gates.items() if placeholder(name) in launched}
    if state.positional == 1:
        out.notes.append(
            f"the text uses its argument $1, which nobody passes here; it is the placeholder "
            f"{placeholder('1')}, which you fill in before deploy"
        )
    elif state.positional:
        out.notes.append(
            f"the text uses its arguments $1..${state.positional}, which nobody passes here; they are "
            f"the placeholders {placeholder('1')}..{placeholder(str(state.positional))}, which you fill in "
            "before deploy"
        )
    return out


def _outside(
    out: Answer, outside: Sequence[tuple[str, int, list[str]]], made: dict[str, str], launched: str
) -> None:
    """The commands outside the launchers on ``out``: an option alone on its line (a lost ``\\``) and a
    command whose output reaches the launch are refused, an output a variable holds whole is its
    placeholder, anything else is a note."""
    starts_option = [(line, argv[0]) for _, line, argv in outside if argv[0].startswith("-")]
    if starts_option:
        (line, opt), *more = starts_option
        also = "; so do " + ", ".join(f"line {n} ({shown(o)})" for n, o in more) if more else ""
        out.problems.append(
            f"line {line} starts with the option {shown(opt)!r}, but the line before it does not continue "
            f"with '\\', so a shell runs it as a separate command{also}; add the missing '\\' line "
            "continuations"
        )
    for token, line, argv in outside:
        if argv[0].startswith("-"):
            continue
        out.outside.append((line, argv))
        if token in made:
            out.notes.append(
                f"line {line}: {made[token]} is the output of {named(argv)}, which runs on the machine and "
                f"rigsmith does not run; it is the placeholder {placeholder(made[token])}, which you fill in "
                "before deploy"
            )
        elif token in launched:
            out.problems.append(
                f"line {line}: {named(argv)} runs on the machine, and rigsmith does not run it; its output "
                "reaches the launch command — write the value out"
            )
        else:
            out.notes.append(
                f"line {line}: {named(argv)} is not a launch command; rigsmith does not run it (its output "
                "does not reach the launch command)"
            )


def _secret_values(traced: Sequence[tuple[int, str]]) -> Callable[[str], str]:
    """What writes a message without the values the text gives its secrets (``export HF_TOKEN=hf_…``, as
    bash's trace shows each assignment): each is written ``$NAME`` (a command outside the launchers, a
    ``python -c`` login, may be quoted with it)."""
    values: dict[str, str] = {}
    for _, cmd in traced:
        for word in trace_words(cmd):
            name, eq, value = word.partition("=")
            if (
                eq
                and len(value) >= 4
                and re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", name)
                and is_secret_name(name)
            ):
                values.setdefault(value, name)

    def hide(text: str) -> str:
        for value in sorted(values, key=len, reverse=True):
            text = text.replace(value, f"${values[value]}")
        return text

    return hide


_CALL_RE = re.compile(r"[A-Za-z_][A-Za-z0-9_.]*(?=\()")


def named(argv: Sequence[str]) -> str:
    """A command outside the launchers as a note quotes it: ``'awk -F, {print NF}'``; a Python program given
    with ``-c`` by the functions it calls (its code can hold a token: it is never quoted)."""
    name = PurePosixPath(argv[0]).name
    if name.startswith("python") and "-c" in argv[1:]:
        at = argv.index("-c")
        calls = list(dict.fromkeys(_CALL_RE.findall(argv[at + 1]) if at + 1 < len(argv) else []))
        called = f" (a Python program calling {', '.join(calls[:4])})" if calls else " (a Python program)"
        return f"'{shown(' '.join([name, *argv[1:at], '-c', '…']))}'{called}"
    return f"'{shown(' '.join(argv))}'"


def _outputs_named(
    out: Answer, outside: Sequence[tuple[str, int, list[str]]], traced: Sequence[tuple[int, str]]
) -> dict[str, str]:
    """The outputs of commands rigsmith does not run that a variable holds whole (``GPU_COUNT=$(… | awk
    …)``, as bash's trace shows the assignment) and that reach a launcher: each is the placeholder
    ``<NAME>`` there, for the user to fill, as a variable the text never sets is. Returns token → name."""
    tokens = {token for token, _, _ in outside}
    named_as: dict[str, str] = {}
    for _, cmd in traced:
        if (m := _OUTPUT_SET_RE.match(cmd)) and m.group(2) in tokens and m.group(1) not in _RESERVED:
            named_as.setdefault(m.group(2), m.group(1))

    def fill(word: str) -> str:
        return _TOKEN_RE.sub(
            lambda m: placeholder(named_as[m.group(0)]) if m.group(0) in named_as else m.group(0), word
        )

    launched = "\0".join("\0".join([*c.argv, *(v for _, v in c.env)]) for c in out.calls)
    named_as = {token: name for token, name in named_as.items() if token in launched}
    out.calls = [
        Call(c.line, tuple(fill(a) for a in c.argv), tuple((k, fill(v)) for k, v in c.env)) for c in out.calls
    ]
    return named_as


def _but_emptiness(cmd: str, marks: Sequence[str]) -> str:
    """A traced test without its tests of whether a word holding a placeholder is empty (``[ -z "$1" ]``,
    ``[[ -n $M ]]``, ``[ "$1" ]``, a script's usage guard): a filled placeholder is never empty, so they are
    decided the same for every value the user fills in, unlike a test of what the value is."""
    for mark in marks:
        word = rf"(?:'[^']*{re.escape(mark)}[^']*'|[^\s']*{re.escape(mark)}[^\s']*)"
        cmd = re.sub(rf"-[zn] {word}(?=\s|$)", "", cmd)
        cmd = re.sub(rf"^(?:'\[' |\[\[? |test )(?:'?!'? )?{word}(?: '?\]\]?'?)?$", "", cmd)
    return cmd


def _trace(trace: str) -> list[tuple[int, str]]:
    """bash's trace: (line, command as bash expanded it), the jail's own commands left out."""
    entries = []
    for m in re.finditer(r"\x1d+(\d+)\x1f([^\x1d]*)", trace):
        cmd = m.group(2).rstrip("\n")
        if not cmd.startswith(("__rs", "__RS_", "set -ux", "set +ux", "local -")):
            entries.append((int(m.group(1)), cmd))
    return entries
