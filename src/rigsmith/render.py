"""The one Jinja environment and the quoting filters. Templates hold layout; decisions live in Python."""

from __future__ import annotations

import json
import shlex
from functools import cache
from pathlib import Path
from typing import Any

import jinja2

from rigsmith.writer import BANNER_MARK

TEMPLATES = Path(__file__).resolve().parents[2] / "templates"


def shquote(value: object) -> str:
    """POSIX-shell quote one word; safe for any bytes the recipe holds."""
    return shlex.quote(str(value))


def shpath(path: str) -> str:
    """Quote a host path, letting a leading ``~/`` expand to $HOME (and nothing else expand)."""
    if path == "~":
        return '"${HOME}"'
    if path.startswith("~/"):
        return '"${HOME}"/' + shlex.quote(path[2:])
    return shlex.quote(path)


def banner(command: str, spec_path: str, comment: str = "#") -> str:
    """The first lines of every generated file: who made it, from what, do not edit."""
    return f"{comment} {BANNER_MARK} — do not edit; edit {spec_path} and re-run:\n{comment}   {command}\n"


@cache
def environment() -> jinja2.Environment:
    """StrictUndefined, no autoescape, trailing newline kept; quoting filters registered."""
    env = jinja2.Environment(
        loader=jinja2.FileSystemLoader(str(TEMPLATES)),
        undefined=jinja2.StrictUndefined,
        keep_trailing_newline=True,
        autoescape=False,
        trim_blocks=True,
        lstrip_blocks=True,
    )
    env.filters["shquote"] = shquote
    env.filters["shpath"] = shpath
    env.filters["tojson_compact"] = lambda v: json.dumps(v, separators=(",", ":"))
    return env


def render(template: str, /, **context: Any) -> str:
    """Render ``templates/<template>`` with the context."""
    return environment().get_template(template).render(**context)
