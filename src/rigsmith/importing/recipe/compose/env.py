"""Compose interpolation as the compose spec says it: ``${VAR}``, ``$VAR``, ``${VAR:-d}``, ``${VAR-d}``,
``${VAR:?err}``, ``${VAR?err}``, ``${VAR:+x}``, ``${VAR+x}`` (defaults nest), ``$$`` for a literal ``$``.

Values come from the process environment over the env file (``.env`` beside the compose file, or
``--env-file FILE``), which is compose's precedence (https://docs.docker.com/compose/how-tos/environment-
variables/envvars-precedence/). The env file is read with python-dotenv, the parser podman-compose uses, so
both read the same values; its own ``${…}`` are not expanded here (``interpolate=False``).

Where compose would substitute an empty string for a variable nobody sets, rigsmith writes the placeholder
``<VAR>`` that the user fills (an empty model path or port is never what the author meant); a required
value (``:?``/``?``) that nobody sets is an error naming it.

A secret's value never enters the spec (:mod:`rigsmith.secretenv`: by its name, or by its value — a
variable whose value holds the value of a secret-named one, from the environment or the env file). An
``environment`` entry that is one expression yielding a secret's whole value (``MY_VAR: ${HF_TOKEN}``,
``- X=${HF_TOKEN:-x}``) becomes the reference ``${HF_TOKEN}`` that every target passes from the host at
run time; a secret anywhere else (the command, part of a value) is refused naming the place.

The result keeps every literal ``$`` escaped as ``$$``, so the compose form's reader (which unescapes
``$$``) sees exactly compose's value.

Pure: the caller reads the files and the environment and hands their text and values in.
"""

from __future__ import annotations

import io
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from dotenv import dotenv_values

from rigsmith import secretenv
from rigsmith.importing.unknown import placeholder

_NAME_RE = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_OPS = (":-", ":?", ":+", "-", "?", "+")


@dataclass(frozen=True)
class ComposeEnv:
    """The variables a compose file is interpolated with, and where each came from."""

    process: Mapping[str, str] = field(default_factory=dict)
    #: The env file's text and its name for messages (``.env beside the file`` / ``--env-file X``).
    file_text: str | None = None
    file_name: str | None = None

    def lookup(self) -> tuple[dict[str, str], dict[str, str]]:
        """(name → value, name → where it came from), the process environment winning."""
        values: dict[str, str] = {}
        origin: dict[str, str] = {}
        if self.file_text is not None:
            parsed = dotenv_values(stream=io.StringIO(self.file_text), interpolate=False)
            for k, v in parsed.items():
                values[k] = v if v is not None else ""
                origin[k] = self.file_name or "the env file"
        for k, v in self.process.items():
            values[k] = v
            origin[k] = "the process environment"
        return values, origin


@dataclass
class Interpolation:
    """What interpolating a service took: problems, notes and the placeholders it made."""

    values: dict[str, str]
    origin: dict[str, str]
    problems: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    used: dict[str, str] = field(default_factory=dict)
    #: Variables an ``environment`` entry now references (``${NAME}``) because they hold a secret.
    references: set[str] = field(default_factory=set)

    def __post_init__(self) -> None:
        # Every long value is searched for, paths too: this module looks at no file system.
        self._secrets = secretenv.values(self.values, exists=lambda _path: False)

    def secret(self, name: str, value: str) -> bool:
        """Whether ``name`` holds a secret: by its name, or its value holds a secret's value."""
        return secretenv.is_secret_name(name) or bool(secretenv.carried(value, self._secrets))

    def reference(self, value: str) -> str | None:
        """``${NAME}`` when ``value`` is one expression that yields the whole value of NAME, a secret that
        is set (``${NAME}``, ``$NAME``, ``${NAME:-d}``, ``${NAME?e}``…); else None."""
        if value.startswith("${"):
            if _closing(value, 2) != len(value) - 1:
                return None
            inner = value[2:-1]
        elif value.startswith("$"):
            inner = value[1:]
        else:
            return None
        m = _NAME_RE.match(inner)
        rest = inner[m.end() :] if m else None
        if m is None or (
            rest and (not value.startswith("${") or not rest.startswith((":-", "-", ":?", "?")))
        ):
            return None
        name = m.group(0)
        got = self.values.get(name)
        if not got or not self.secret(name, got):
            return None
        self.references.add(name)
        return f"${{{name}}}"

    def text(self, value: str, where: str) -> str:
        """``value`` interpolated, literal ``$`` kept as ``$$``."""
        out: list[str] = []
        i, n = 0, len(value)
        while i < n:
            c = value[i]
            if c != "$" or i + 1 >= n:
                out.append(_esc(c))
                i += 1
                continue
            nxt = value[i + 1]
            if nxt == "$":
                out.append("$$")
                i += 2
            elif nxt == "{":
                end = _closing(value, i + 2)
                if end < 0:
                    self.problems.append(f"{where}: {value[i:]!r} opens '${{' and never closes it")
                    return "".join(out)
                out.append(self._braced(value[i + 2 : end], value[i : end + 1], where))
                i = end + 1
            elif m := _NAME_RE.match(value, i + 1):
                out.append(self._var(m.group(0), "", "", value[i : m.end()], where))
                i = m.end()
            else:
                out.append("$$")
                i += 1
        return "".join(out)

    def _braced(self, inner: str, src: str, where: str) -> str:
        m = _NAME_RE.match(inner)
        if not m:
            self.problems.append(f"{where}: {src} is not a valid interpolation (compose: ${{NAME}})")
            return ""
        rest = inner[m.end() :]
        op = next((o for o in _OPS if rest.startswith(o)), "")
        if rest and not op:
            self.problems.append(f"{where}: {src}: compose has no {rest!r} operator")
            return ""
        return self._var(m.group(0), op, rest[len(op) :], src, where)

    def _var(self, name: str, op: str, operand: str, src: str, where: str) -> str:
        value = self.values.get(name)
        missing = value is None or (op.startswith(":") and value == "")
        if op in (":-", "-") and missing:
            return self.text(operand, where)
        if op in (":+", "+"):
            return "" if missing else self.text(operand, where)
        if op in (":?", "?") and missing:
            self.problems.append(
                f"{where}: {src}: {name} is required ({operand or 'no message'}) and is not set; set it in "
                "the environment, the .env beside the file or --env-file FILE"
            )
            return ""
        if value is None:
            token = placeholder(name)  # one rule with a script's unset $NAME (rigsmith.importing.unknown)
            self.notes.append(
                f"{where}: {src}: {name} is not set anywhere (environment, env file), so compose would use "
                f"an empty string; it is the placeholder {token}, which you fill in before deploy"
            )
            return token
        if value and self.secret(name, value):
            holds = "" if secretenv.is_secret_name(name) else f" ({name} holds the value of a secret)"
            self.problems.append(
                f"{where}: {src} would write the secret {name}{holds} into the spec; pass it only as a "
                f"whole environment: value, NAME: ${{{name}}}, which every target reads from the host at "
                "run time"
            )
            return ""
        self.used[name] = "(secret)" if secretenv.is_secret_name(name) else value
        return _esc(value)


def _esc(text: str) -> str:
    return text.replace("$", "$$")


def _closing(value: str, i: int) -> int:
    """Index of the ``}`` closing a ``${`` whose content starts at ``i`` (nested ``${…}`` counted)."""
    depth = 1
    while i < len(value):
        if value.startswith("${", i):
            depth += 1
            i += 2
            continue
        if value[i] == "}":
            depth -= 1
            if depth == 0:
                return i
        i += 1
    return -1


def interpolate(tree: Any, interp: Interpolation, where: str) -> Any:
    """``tree`` (a service) with every string value interpolated; ``NAME: ${NAME}`` under ``environment``
    (a pass-through from the host at run time) is kept as written."""
    if isinstance(tree, str):
        return interp.text(tree, where)
    if isinstance(tree, list):
        return [interpolate(v, interp, f"{where}[{i}]") for i, v in enumerate(tree)]
    if isinstance(tree, dict):
        out = {}
        for k, v in tree.items():
            if k == "environment" and where.count(".") == 1:
                out[k] = _environment(v, interp, f"{where}.{k}")
            else:
                out[k] = interpolate(v, interp, f"{where}.{k}")
        return out
    return tree


def _environment(env: Any, interp: Interpolation, where: str) -> Any:
    """An ``environment`` mapping or list: ``NAME: ${NAME}`` kept, a whole secret made a reference
    (:meth:`Interpolation.reference`), everything else interpolated."""

    def passthrough(name: str, value: object) -> bool:
        return isinstance(value, str) and value in (f"${name}", f"${{{name}}}")

    def reference(value: object) -> str | None:
        return interp.reference(value) if isinstance(value, str) else None

    if isinstance(env, dict):
        return {
            k: v if passthrough(str(k), v) else reference(v) or interpolate(v, interp, f"{where}.{k}")
            for k, v in env.items()
        }
    if isinstance(env, list):
        out = []
        for i, item in enumerate(env):
            name, eq, value = str(item).partition("=")
            if eq and passthrough(name, value):
                out.append(item)
            elif eq and (ref := reference(value)) is not None:
                out.append(f"{name}={ref}")
            else:
                out.append(interpolate(item, interp, f"{where}[{i}]"))
        return out
    return env


def notes_for(interp: Interpolation) -> list[str]:
    """One note naming each value taken from outside the file, and where it came from."""
    if not interp.used:
        return list(interp.notes)
    shown = ", ".join(f"{k}={v!r} (from {interp.origin.get(k, '?')})" for k, v in sorted(interp.used.items()))
    return [*interp.notes, f"compose interpolation: {shown}"]
