"""Recipe form (b) as pasted: a script run by bash in the jail (:mod:`rigsmith.importing.bashjail`) to the
command it launches, which the shell form then reads (a record with no command at all is
:mod:`..record.spec`'s).
"""

from __future__ import annotations

import re
import shlex
from collections.abc import Sequence
from pathlib import PurePosixPath

from rigsmith.errors import RecipeError
from rigsmith.importing import bashjail, multinode, shellwords
from rigsmith.importing.prompts import join_blank_continuations, quote_placeholders, strip_prompts
from rigsmith.importing.recipe.command.text import _from_shell
from rigsmith.importing.recipe.envvars import env_var, merge_env
from rigsmith.importing.recipe.launch import Launch
from rigsmith.importing.recipe.tables import _ASSIGN_RE, _PYTHON_RE
from rigsmith.importing.unknown import placeholder
from rigsmith.secretenv import is_secret_name

#: What makes a text more than one plain command: expansions, operators, redirections, grouping, quotes
#: that bash reads differently from shlex (``$'…'``), more than one line.
_SHELL_SYNTAX_RE = re.compile(r"[$`;&|<>(){}*?\\[\]!~#]|\n(?!$)")


def plain_command(text: str) -> bool:
    """Whether ``text`` is one plain command (words and quotes, nothing bash would expand or decide), which
    imports the same with or without bash: ``shlex.split`` gives bash's argv for it."""
    joined = re.sub(r"\\\r?\n", " ", text).strip()
    if not joined or _SHELL_SYNTAX_RE.search(joined):
        return False
    try:
        shlex.split(joined)
    except ValueError:
        return False
    return True


def _no_jail(text: str, source: str, why: str) -> RecipeError:
    return RecipeError(
        f"{source}: this text is a script (variables, several lines or shell syntax), and rigsmith runs a "
        f"script with bash inside the bubblewrap sandbox to learn the command it launches; {why}. "
        "Without it only a text that is one plain command imports",
        hint="install bubblewrap (apt-get install bubblewrap; user namespaces must be allowed), or paste "
        "the launch command alone",
    )


def from_script(text: str, source: str, accept: bool) -> Launch:
    """Shell text: run by bash in the jail to the command it launches, then read as that command."""
    stripped, prompt_notes = strip_prompts(text)
    why = bashjail.unavailable()
    if why is not None:
        if not plain_command(stripped):
            raise _no_jail(text, source, why)
        launch = _from_shell(stripped)
        launch.notes = [
            *prompt_notes,
            f"bash was not run ({why}); the text is one plain command",
            *launch.notes,
        ]
        return launch
    ready, quoted = quote_placeholders(stripped)
    ready, blanks = join_blank_continuations(ready)
    answer = bashjail.run(ready)
    # Where bash ends a command its author continued (a comment or a space after the '\\', a '\\' glued to
    # the next line's word): refused, with the scanner's account of why
    script = shellwords.scan(stripped)  # the text's own lines: comments, assignment order, continuations
    answer.problems[:0] = [p for p in script.problems if "'\\'" in p]
    return handed_on(answer, [*prompt_notes, *quoted, *blanks, *_comments(script)], script)


def _comments(script: shellwords.Script) -> list[str]:
    """The text's comments, as notes (they often say what a flag is for, or what to change)."""
    found = [*script.comments, *((c.line, c.comment) for c in script.commands if c.comment)]
    return [
        f"comment (line {line}): {comment}"
        for line, comment in sorted(found)
        if comment and not (line == 1 and comment.startswith("!"))  # the #! line names the interpreter
    ]


def _is_server(argv: Sequence[str]) -> bool:
    name = PurePosixPath(argv[0]).name
    return name == "vllm" or bool(_PYTHON_RE.match(name))


def _assignments(script: shellwords.Script) -> dict[str, str | None]:
    """Each name the text assigns (``export NAME=…``, ``NAME=… cmd``), in the order it first does, with the
    comment on that line: the order and notes of the env bash hands the launcher (values are bash's)."""
    out: dict[str, str | None] = {}
    for cmd in script.commands:
        words = cmd.argv[1:] if cmd.argv[0] == "export" else cmd.argv
        names = [m.group(1) for w in words if (m := _ASSIGN_RE.match(w))]
        alone = len(names) == len(words)  # the line only sets variables: its comment is theirs
        for name in names:
            out.setdefault(name, cmd.comment if alone else None)
    return out


def handed_on(answer: bashjail.Answer, notes: list[str], script: shellwords.Script) -> Launch:
    """The launch bash's answer describes: its launch commands (each on its own line, as the shell form
    reads them), the environment the first one was given, and what bash did on the way as notes."""
    lines: list[str] = []
    for call in answer.calls:
        while len(lines) < call.line - 1:
            lines.append("")
        lines.append(shlex.join(call.argv))
    launch = _from_shell("\n".join(lines) + "\n", answer.placeholders)
    launch.image_expands = launch.image in answer.placeholders
    launch.problems[:0] = answer.problems
    if not answer.calls:
        launch.problems += [
            f"line {line}: {argv[0]!r} is not a vLLM launch command (vllm serve, python -m "
            "vllm.entrypoints.openai.api_server, docker run or podman run); remove it"
            for line, argv in answer.outside
        ]
    launch.notes = [*notes, *answer.notes, *launch.notes]
    port = multinode.port_token(launch.node_args) if launch.node_args else None
    launch.notes += [
        f"line {line}: ${name}: {name} has no value (the text uses it but never sets it); "
        + (
            f"it stands as --data-parallel-rpc-port, which every node is given from cluster.dp_rpc_port "
            f"(written as {multinode.rpc_port(launch.node_args)})"
            if placeholder(name) == port
            else f"it is the placeholder {placeholder(name)}, which you fill in before deploy"
        )
        for name, line in answer.unknown.items()
        if not is_secret_name(name)  # a secret's placeholder is dropped: read from the host at run time
    ]
    if answer.calls:
        # the env of the command that serves (in a Ray block, not the nodes' containers)
        first = next((c for c in answer.calls if _is_server(c.argv)), answer.calls[0])
        written = _assignments(script)
        order = {name: i for i, name in enumerate(written)}
        given = sorted(first.env, key=lambda kv: order.get(kv[0], len(order)))
        env = [env_var(k, v, written.get(k), launch, f"line {first.line}") for k, v in given]
        launch.env = merge_env([*env, *launch.env], launch)
    return launch
