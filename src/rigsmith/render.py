"""The one Jinja environment and the quoting filters. Templates hold layout; decisions live in Python."""

from __future__ import annotations

import json
import shlex
from collections.abc import Mapping
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
def environment(root: Path = TEMPLATES, overlay: Path | None = None) -> jinja2.Environment:
    """StrictUndefined, no autoescape, trailing newline kept; quoting filters registered.

    ``overlay`` is a second search directory after ``root`` (e.g. images/<name>/), for templates that
    ``{% extends %}`` a shipped one and override its blocks.
    """
    search = [str(root)] + ([str(overlay)] if overlay else [])
    env = jinja2.Environment(
        loader=jinja2.FileSystemLoader(search),
        undefined=jinja2.StrictUndefined,
        keep_trailing_newline=True,
        autoescape=False,
        trim_blocks=True,
        lstrip_blocks=True,
    )
    env.filters["shquote"] = shquote
    env.filters["shpath"] = shpath
    env.filters["dockerquote"] = dockerquote
    env.filters["tojson_compact"] = lambda v: json.dumps(v, separators=(",", ":"))
    return env


def dockerquote(value: object) -> str:
    """A Dockerfile double-quoted word: no ``$`` expansion; backslash and quote escaped."""
    text = str(value)
    return '"' + text.replace("\\", "\\\\").replace('"', '\\"').replace("$", "\\$") + '"'


def render(template: str, /, **context: Any) -> str:
    """Render ``templates/<template>`` with the context."""
    return environment().get_template(template).render(**context)


def render_in(template: str, overlay: Path | None, context: Mapping[str, Any]) -> str:
    """Render ``template`` found in templates/ or else in ``overlay`` (a per-image override that
    ``{% extends %}`` a shipped template)."""
    return environment(TEMPLATES, overlay).get_template(template).render(**context)
