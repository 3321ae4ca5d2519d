"""Every command the CLI can print works (issue 27): the `invoke …` commands in rigsmith's and the tasks' own
strings are collected from the source (not written down here), and each is parsed by invoke's own parser
against the real task collection — an unknown task or flag is invoke's "No idea what" — with its example
values checked by the converter the task applies, and a literal --deployment resolved in the seed project.

Placeholders in f-strings become what they stand for: ``{d}`` / ``{c.d}`` the whole ``--deployment NAME``,
any other ``{…}`` after --deployment the fixture's deployment, after --target a target, else a word.
"""

from __future__ import annotations

import ast
import re
import shlex
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from invoke.exceptions import Exit, ParseError
from invoke.parser import Parser

from rigsmith.cli import ns
from rigsmith.cli.deploy import _vmid
from rigsmith.cli.flags import MEMLOCK, TARGET, whole
from rigsmith.errors import RigsmithError
from rigsmith.project import Project
from tests.support.common import REPO

FIXTURE = "flash-next-merlin-4x3090"
#: Where a command starts inside a string: its beginning, after a backtick, after "then " or "; ".
_START = re.compile(r"(?:^|`|\bthen |; |: )invoke ([a-z][a-z-]*)([^`;,()\n]*)")


def _render(node: ast.expr) -> str | None:
    """A string literal as text, an f-string with each ``{expr}`` written as ``{expr}``."""
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return node.value
    if isinstance(node, ast.JoinedStr):
        out = []
        for v in node.values:
            if isinstance(v, ast.Constant):
                out.append(str(v.value))
            elif isinstance(v, ast.FormattedValue):
                out.append("{" + ast.unparse(v.value) + "}")
        return "".join(out)
    return None


def _skipped(tree: ast.Module) -> set[int]:
    """ids of nodes that are not printed strings: docstrings (they describe, they are not shown as a
    command to run) and the literal parts inside an f-string (the f-string is taken whole)."""
    out: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.JoinedStr):
            out.update(id(v) for v in node.values)
        body = getattr(node, "body", None)
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef)) and body:
            first = body[0]
            if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant):
                out.add(id(first.value))
    return out


def _strings() -> Iterator[tuple[str, str]]:
    for root in (REPO / "src" / "rigsmith",):
        for path in sorted(root.rglob("*.py")):
            tree = ast.parse(path.read_text(encoding="utf-8"))
            skip = _skipped(tree)
            for node in ast.walk(tree):
                if id(node) in skip or not isinstance(node, ast.expr):
                    continue
                if (text := _render(node)) is not None:
                    yield f"{path.relative_to(REPO)}:{node.lineno}", text


def _fill(words: list[str]) -> list[str]:
    out: list[str] = []
    for w in words:
        if w in ("{d}", "{c.d}"):
            out += ["--deployment", FIXTURE]
        elif w.startswith("{"):
            prev = out[-1] if out else ""
            out.append(FIXTURE if prev == "--deployment" else "podman" if prev == "--target" else "X")
        else:
            out.append(w)
    return out


def commands() -> list[tuple[str, list[str]]]:
    """(where, argv after `invoke`) for every command the source can print. A command's words are its
    flags with their values (the task's own flags say which take one) and upper-case positionals (SOURCE,
    OUT); the first other word is prose and ends it."""
    found: dict[tuple[str, ...], str] = {}
    for where, text in _strings():
        for argv in commands_in(text):
            found.setdefault(tuple(argv), where)
    return sorted((where, list(argv)) for argv, where in found.items())


def commands_in(text: str) -> list[list[str]]:
    """The argv after `invoke` of every command ``text`` names (a source string, or what a command
    printed: the journeys run the hints they are shown), in order."""
    contexts = {c.name: c for c in ns.to_contexts()}
    out: list[list[str]] = []
    for m in _START.finditer(text):
        if text[max(0, m.start() - 3) : m.start() + 1] in MENTIONS:
            continue
        try:
            words = _fill(shlex.split(m.group(2).replace("…", "")))
        except ValueError:
            words = _fill(m.group(2).split())
        argv, ctx = [m.group(1)], contexts.get(m.group(1))
        i = 0
        while i < len(words):
            w = words[i]
            arg = ctx.flags.get(w) if ctx is not None and w.startswith("--") else None
            if w.startswith("--"):
                argv.append(w)
                if arg is not None and arg.takes_value and i + 1 < len(words):
                    argv.append(words[i + 1])
                    i += 1
            elif w.isupper() and w.isalpha():
                argv.append(w)
            else:
                break
            i += 1
        out.append(argv)
    return out


#: What comes right before "`invoke" that make it a mention of a task, not a command to run ("Proposed by
#: `invoke import-recipe` from the notes of …" in a proposed image.yaml's header).
MENTIONS = ("by `",)


#: Flags whose value the task converts: the converter it applies (a rejected example raises).
CONVERTERS: dict[str, Callable[[str], object]] = {
    "--memlock": MEMLOCK.of,
    "--vmid": lambda v: _vmid(v, None),
    "--target": TARGET.of,
    "--tail": lambda v: whole("--tail", v),
    "--max-tokens": lambda v: whole("--max-tokens", v),
    "--prompt-words": lambda v: whole("--prompt-words", v),
    "--timeout": float,
}


def test_the_source_prints_commands_and_the_collector_finds_them() -> None:
    found = {" ".join(argv) for _w, argv in commands()}
    assert f"doctor --deployment {FIXTURE} --target podman" in found
    assert f"next --deployment {FIXTURE}" in found
    assert len(found) > 40, sorted(found)


def problem(argv: list[str], root: Path = REPO) -> str | None:
    """Why ``invoke ARGV`` would not work (invoke's own parse error, a rejected example value, a
    deployment the checkout at ``root`` does not have), or None."""
    try:
        parsed = Parser(contexts=ns.to_contexts()).parse_argv(argv)
    except ParseError as err:
        return str(err)
    flags = parsed[0].flags
    for i, w in enumerate(argv[1:-1], 1):
        value = argv[i + 1]
        arg = flags.get(w) if w.startswith("--") else None
        if arg is None or not arg.takes_value or value.isupper() or value in ("X", FIXTURE):
            continue
        try:
            if w in CONVERTERS:
                CONVERTERS[w](value)
            if w == "--deployment":
                Project(root).resolve_name(value)
        except (RigsmithError, Exit, ValueError) as err:
            return f"{w} {value} is rejected: {err}"
    return None


@pytest.mark.parametrize(
    ("where", "argv"), commands(), ids=lambda x: " ".join(x) if isinstance(x, list) else x
)
def test_every_printed_command_parses_and_its_examples_are_accepted(where: str, argv: list[str]) -> None:
    why = problem(argv)
    assert why is None, f"{where}: `invoke {' '.join(argv)}`: {why}"


def test_the_check_fails_the_hints_issue_27_found(monkeypatch: pytest.MonkeyPatch) -> None:
    printed = [
        "or pass `invoke doctor --image REF`",  # doctor has no --image
        "e.g. `invoke deploy --target lxc --memlock foo`",  # an example the flag rejects
        "`invoke check-container --deployment mn-box-a`",  # a deployment that does not exist
        "then `invoke imports`",  # no such task
    ]
    monkeypatch.setattr(sys.modules[__name__], "_strings", lambda: iter(("x.py:1", t) for t in printed))
    found = {" ".join(argv): problem(argv) for _w, argv in commands()}
    assert found.keys() == {
        "doctor --image REF", "deploy --target lxc --memlock foo", "check-container --deployment mn-box-a",
        "imports",
    }  # fmt: skip
    assert "No idea what '--image' is!" in str(found["doctor --image REF"])
    assert "--memlock foo is rejected" in str(found["deploy --target lxc --memlock foo"])
    assert "no deployment 'mn-box-a'" in str(found["check-container --deployment mn-box-a"])
    assert "No idea what 'imports' is!" in str(found["imports"])
